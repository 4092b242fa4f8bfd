# Third-party dependencies, all from Debian packages (scripts/install-deps.sh names them).
# Required: oneTBB, OpenBLAS (CBLAS), toml++, nlohmann-json, CLI11, xxHash, GoogleTest (tests).
# Optional, with a stub when absent: liburing (io_uring backend), MPI (multi-process ranks;
# STRATA_MPI=OFF builds the stub even where MPI is installed: scripts/gpu-bundle.sh does, so its
# bundle carries no Open MPI and its plugins).
find_package(Threads REQUIRED)
find_package(TBB REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(PkgConfig REQUIRED)

# OpenBLAS: prefer its CMake config (Debian ships one per threading flavour).
find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND)
  add_library(strata_blas INTERFACE)
  target_include_directories(strata_blas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(strata_blas INTERFACE ${OpenBLAS_LIBRARIES})
else()
  pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
  add_library(strata_blas INTERFACE)
  target_link_libraries(strata_blas INTERFACE PkgConfig::OPENBLAS)
endif()

pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

pkg_check_modules(URING IMPORTED_TARGET liburing)
if(URING_FOUND)
  set(STRATA_HAVE_URING ON)
else()
  set(STRATA_HAVE_URING OFF)
endif()

set(STRATA_HAVE_MPI OFF)
if(NOT STRATA_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(STRATA_HAVE_MPI ON)
  elseif(STRATA_MPI STREQUAL "ON")
    message(FATAL_ERROR "STRATA_MPI=ON but no MPI was found.\n"
                        "hint: apt-get install libopenmpi-dev openmpi-bin, or configure with -DSTRATA_MPI=AUTO")
  endif()
endif()
