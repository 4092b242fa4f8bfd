# tests/support/mpi_missing.cmake — the command of every mpi test entry when strata was built
# without MPI (none found, or STRATA_MPI=OFF): it fails, naming the test and how to get MPI, so a
# machine without MPI shows the tests it could not run as failures instead of silently running
# fewer tests.
# Usage: cmake -DTEST=name -DRANKS=n [-DSTRATA_MPI=OFF|ON|AUTO] -P mpi_missing.cmake
if(STRATA_MPI STREQUAL "OFF")
  message(FATAL_ERROR
    "${TEST}: this test runs ${RANKS} ranks under mpirun, but this build directory was configured "
    "with STRATA_MPI=OFF, so it cannot run.\n"
    "hint: run cmake -DSTRATA_MPI=AUTO on this build directory and rebuild")
endif()
message(FATAL_ERROR
  "${TEST}: this test runs ${RANKS} ranks under mpirun, but CMake found no MPI when strata was "
  "configured, so it cannot run.\n"
  "hint: install Open MPI (apt-get install libopenmpi-dev openmpi-bin, or run "
  "scripts/install-deps.sh as root), then run cmake again on this build directory and rebuild")
