// tests/fuzz/fuzz_main.cpp — the libFuzzer entry point; each fuzz_<name> executable compiles it
// with STRATA_FUZZ_DRIVER=<name>, one of the drivers of fuzz_targets.h.
#include "tests/fuzz/fuzz_targets.h"

#ifndef STRATA_FUZZ_DRIVER
#error "compile with -DSTRATA_FUZZ_DRIVER=<driver name>"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return strata::fuzz::run_one(&strata::fuzz::STRATA_FUZZ_DRIVER, data, size);
}
