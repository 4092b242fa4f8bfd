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

}  // namespace strata
