// optimizer/adamw_no_x86.cpp — the stub built instead of adamw_avx2.cpp and adamw_avx512.cpp on
// targets other than x86-64: their kernel tables exist but say "not built", so the dispatcher
// reports those ISAs unavailable and STRATA_ISA=avx2|avx512 is an error that says why.
#include "optimizer/adamw_isa.h"

namespace strata {

constinit const AdamWKernels kAdamWKernelsAvx2 = {false, nullptr, nullptr, nullptr, nullptr};
constinit const AdamWKernels kAdamWKernelsAvx512 = {false, nullptr, nullptr, nullptr, nullptr};

}  // namespace strata
