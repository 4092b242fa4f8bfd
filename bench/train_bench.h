// bench/train_bench.h — `strata bench train`: training throughput and MFU of a config, with the
// machine's f32 GEMM rate measured in the same run (before and after training, by the same
// code as `strata bench gemm`).
//
// MFU = (training FLOPs per token × tokens/s) / peak, where the FLOPs count 6 × matmul weights
// + 6 × layers × T × dim for causal attention (LlamaModel::train_flops_per_token), tokens/s is
// the median over the timed steps (the first step is warm-up and not timed), and the peak is the
// best f32 GEMM rate seen — strata's own linear path or one multi-threaded cblas_sgemm call,
// whichever is higher, at 2048³ — so MFU is never flattered by a slow baseline.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

struct TrainBenchOptions {
  std::string config_path;            // TOML; empty = built-in defaults
  std::vector<std::string> overrides; // section.key=value
  double gemm_seconds = 1.0;          // per GEMM measurement
};

nlohmann::json run_train_bench(const TrainBenchOptions& options);

// Parallel layouts of the same config on this job's ranks (run under mpirun), one after the
// other: "tp2" (tp 2, dp = world / 2), "dp2" (tp 1), "dp2xtp2". Each reports tokens/s (median
// over the timed steps), step time, communication bytes per step (all, and the tensor-parallel
// part), the device peak, and the share of traced step time (steps 2..4) the compute stream
// spent in tensor-parallel collectives (their spans on the compute track of rank 0's trace:
// transfer and waiting for the other ranks) and waiting for the data-parallel streams. No GEMM
// peak: the ranks share this machine's cores. The JSON is complete on rank 0.
nlohmann::json run_train_layouts_bench(const TrainBenchOptions& options,
                                       const std::vector<std::string>& layouts);

}  // namespace strata
