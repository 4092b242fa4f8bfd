// bench/adam_bench.h — `strata bench adam`: the CPU AdamW step against the machine's streaming
// bound, the fused bf16-step against the same work done as separate passes, and the step with
// bf16 m and v (train.optimizer_state_dtype = "bf16").
//
// Validates first (the chosen ISA against the scalar reference, bit for bit, for the plain step,
// the fused step, the unfused sequence and the bf16-state step), then times on arrays far larger
// than the caches, after a parallel first touch and one untimed call of each kernel. Each kernel is timed
// `repeats` times, interleaved with the others so that a slow moment of a shared machine hits
// all of them; the reported rate is the best repetition (minimum time), the median is reported
// beside it, and the ratios are also given as medians of side-by-side samples.
// Does not compare with other libraries (bench/peers/torch_adamw.py does).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace strata {

struct AdamBenchOptions {
  size_t numel = size_t{64} << 20;  // parameters; 64M = 1.75 GiB moved per f32 step
  std::string isa = "auto";         // auto | scalar | avx2 | avx512
  int threads = 0;                  // 0: the process's oneTBB limit (all the CPUs it may use)
  int repeats = 20;                 // timed repetitions of each kernel
  size_t validate_numel = (size_t{1} << 20) + 3;  // elements checked against the reference
  bool bf16_states = false;  // measure_adam_gbps: the step with bf16 m and v (20 bytes a parameter)
};

// The JSON object `strata bench adam --json` prints (fields documented in docs/optimizer.md):
// params_per_s, params_per_s_fused, params_per_s_unfused, bound_params_per_s, gbps, isa,
// threads, the ratios, and the settings it ran with. Throws Error when validation fails.
nlohmann::json run_adam_bench(const AdamBenchOptions& options);

// The plain step only (what the planner's rate probe needs, bench/rate_probe.h): validated as
// above, one untimed step, then the best of `repeats` steps, in decimal GB/s of 28 bytes per
// parameter — `gbps` of run_adam_bench without the other kernels' passes; with bf16_states, the
// step with bf16 m and v at 20 bytes per parameter (`gbps_bf16_states`).
double measure_adam_gbps(const AdamBenchOptions& options);

}  // namespace strata
