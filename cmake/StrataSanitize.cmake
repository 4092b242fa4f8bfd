# Sanitized builds: STRATA_SANITIZE=address,undefined or thread (empty: off) compiles and links
# every target of the project — libraries, the CLI, tests, benchmarks — with those sanitizers, at
# -O1 -g -fno-omit-frame-pointer, UBSan without recovery (a report fails the test). It sets
# STRATA_SANITIZER_ENV: the ASAN/UBSAN/LSAN/TSAN_OPTIONS every CTest entry runs with (suppressions
# in tests/sanitizers/). It does not instrument third-party libraries (oneTBB, Open MPI, OpenBLAS
# are the system's builds), and it refuses the CUDA backend: nvcc and the sanitizer runtimes are
# not combined here, so a sanitized build is a CPU build (STRATA_CUDA=AUTO turns off with a note).
set(STRATA_SANITIZE "" CACHE STRING
    "Sanitizers for every target: address,undefined or thread (empty: none)")
set_property(CACHE STRATA_SANITIZE PROPERTY STRINGS
             "" "address,undefined" "address" "undefined" "thread")

set(STRATA_SANITIZER_ENV "")
if(STRATA_SANITIZE)
  string(REPLACE "," ";" strata_sanitizers "${STRATA_SANITIZE}")
  foreach(s ${strata_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "STRATA_SANITIZE=${STRATA_SANITIZE}: unknown sanitizer '${s}'\n"
                          "hint: use address,undefined or thread (or leave it empty)")
    endif()
  endforeach()
  if("thread" IN_LIST strata_sanitizers AND "address" IN_LIST strata_sanitizers)
    message(FATAL_ERROR "STRATA_SANITIZE=${STRATA_SANITIZE}: ThreadSanitizer cannot be combined "
                        "with AddressSanitizer\nhint: configure two build directories, one with "
                        "address,undefined and one with thread")
  endif()
  if(STRATA_FUZZ)
    message(FATAL_ERROR "STRATA_SANITIZE and STRATA_FUZZ: a fuzz build brings its own sanitizers "
                        "(address,undefined)\nhint: use a separate build directory for each")
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "STRATA_SANITIZE needs GCC or Clang "
                        "(the compiler is ${CMAKE_CXX_COMPILER_ID})")
  endif()
  if(STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_SANITIZE=${STRATA_SANITIZE} with STRATA_CUDA=ON: a sanitized "
                        "build is a CPU build (nvcc's host compilation and the sanitizer runtimes "
                        "are not combined)\nhint: configure the sanitized build with "
                        "-DSTRATA_CUDA=OFF")
  elseif(NOT STRATA_CUDA STREQUAL "OFF")
    message(STATUS "strata: STRATA_SANITIZE=${STRATA_SANITIZE} builds without the CUDA backend "
                   "(STRATA_CUDA=${STRATA_CUDA} is taken as OFF)")
  endif()
  set(STRATA_CUDA OFF)  # shadows the cache entry for this configure only

  # After the build type's flags on the command line, so -O1 wins over Release's -O3.
  set(strata_san_flags -fsanitize=${STRATA_SANITIZE} -O1 -g -fno-omit-frame-pointer)
  if("undefined" IN_LIST strata_sanitizers)
    list(APPEND strata_san_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${strata_san_flags}>")
  add_link_options(-fsanitize=${STRATA_SANITIZE})

  # The options every test runs with (strata_test_setup in tests/CMakeLists.txt attaches them;
  # under mpirun they are exported to every rank with -x). halt_on_error: the first report ends
  # the process with a non-zero status, so the test fails.
  set(strata_supp ${PROJECT_SOURCE_DIR}/tests/sanitizers)
  if("address" IN_LIST strata_sanitizers)
    list(APPEND STRATA_SANITIZER_ENV
         "ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:fast_unwind_on_malloc=0:halt_on_error=1"
         "LSAN_OPTIONS=suppressions=${strata_supp}/lsan.supp:print_suppressions=0")
  endif()
  if("undefined" IN_LIST strata_sanitizers)
    list(APPEND STRATA_SANITIZER_ENV "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
  endif()
  if("thread" IN_LIST strata_sanitizers)
    list(APPEND STRATA_SANITIZER_ENV
         # history_size=7 (the most): a write by Open MPI's progress thread into another
         # thread's receive buffer (tsan.supp) must keep its stack, or its suppression cannot
         # match it ("failed to restore the stack" was reported as a race in strata's cast).
         "TSAN_OPTIONS=suppressions=${strata_supp}/tsan.supp:halt_on_error=1:second_deadlock_stack=1:print_suppressions=0:history_size=7")
  endif()
endif()
