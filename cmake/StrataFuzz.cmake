# STRATA_FUZZ=ON: libFuzzer builds (scripts/fuzz.sh). Needs clang; every strata target is then
# compiled with coverage instrumentation for libFuzzer and checked by AddressSanitizer (and its
# leak checker) and UndefinedBehaviorSanitizer, which abort on the first report. Only the
# fuzz_<name> executables of tests/fuzz link the libFuzzer driver itself.
option(STRATA_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only; see scripts/fuzz.sh)" OFF)
if(STRATA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "STRATA_FUZZ=ON needs clang for libFuzzer, not ${CMAKE_CXX_COMPILER_ID}: "
                        "configure with -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=all;-fno-omit-frame-pointer;-g>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=address,undefined>")
endif()
