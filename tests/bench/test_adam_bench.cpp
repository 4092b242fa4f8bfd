// tests/bench/test_adam_bench.cpp — `strata bench adam` (bench/adam_bench.h) on a small array:
// every kernel, the step with bf16 m and v among them, validated against the scalar reference
// and timed, with the bytes per parameter its rate counts; and the rate probe's measurement of
// each state dtype.
#include <gtest/gtest.h>

#include "bench/adam_bench.h"

namespace strata {
namespace {

AdamBenchOptions small() {
  AdamBenchOptions o;
  o.numel = (size_t{1} << 20) + 5;  // not a whole number of vectors or grains
  o.repeats = 2;
  o.validate_numel = (size_t{1} << 16) + 3;
  return o;
}

TEST(AdamBench, TimesEveryKernelWithTheBf16StateStepAmongThem) {
  for (const char* isa : {"scalar", "auto"}) {
    AdamBenchOptions o = small();
    o.isa = isa;
    const nlohmann::json j = run_adam_bench(o);
    EXPECT_EQ(j["wrong"], 0) << isa;
    EXPECT_EQ(j["bytes_per_param"]["bf16_states"], 20.0);
    const double pps = j["params_per_s_bf16_states"].get<double>();
    EXPECT_GT(pps, 0) << isa;
    EXPECT_DOUBLE_EQ(j["gbps_bf16_states"].get<double>(), pps * 20 / 1e9);
    EXPECT_DOUBLE_EQ(j["seconds"]["bf16_states"].get<double>(), double(o.numel) / pps);
    EXPECT_GT(j["median"]["params_per_s_bf16_states"].get<double>(), 0);
  }
}

TEST(AdamBench, TheProbeMeasuresEachStateDtype) {
  AdamBenchOptions o = small();
  EXPECT_GT(measure_adam_gbps(o), 0);
  o.bf16_states = true;
  EXPECT_GT(measure_adam_gbps(o), 0);
}

}  // namespace
}  // namespace strata
