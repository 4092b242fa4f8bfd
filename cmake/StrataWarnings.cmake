# Warnings for strata's own targets (not for third-party code).
add_library(strata_warnings INTERFACE)
target_compile_options(strata_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wnon-virtual-dtor>)

# strata_fast_cpu(target): compile a target's sources for the build machine's CPU (the fast
# CPU kernels). The reference kernels and everything numerical that must be exact do not use it.
# A sanitized build keeps its -O1 (cmake/StrataSanitize.cmake) instead of -O3.
function(strata_fast_cpu target)
  if(STRATA_CPU_ARCH)
    target_compile_options(${target} PRIVATE -march=${STRATA_CPU_ARCH})
  endif()
  if(NOT STRATA_SANITIZE)
    target_compile_options(${target} PRIVATE -O3)
  endif()
  target_compile_options(${target} PRIVATE -fopenmp-simd)
endfunction()
