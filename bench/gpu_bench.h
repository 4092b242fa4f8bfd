// bench/gpu_bench.h — `strata bench gpu`: the CUDA backend on the GPU present, every result
// validated before it is timed, one JSON object out.
//
// Sections (each is {"ran": false, "reason": ...} when it cannot run, so one missing piece never
// hides the others):
//   gemm_bf16  per shape: strata's bf16 path (cuBLASLt's first heuristic choice, what strata
//              runs) next to cuBLAS's best — the fastest of cuBLASLt's heuristic candidates for
//              the same shape, each validated and timed — in TFLOP/s;
//   gemm_f32   per shape: strata's f32 linear (cuBLASLt, FMA algorithms, no TF32) in TFLOP/s;
//              the best is the MFU denominator of the f32 training runs;
//   gemm_f32_bf16_operands  the same linear with its operands rounded to bf16 on the tensor
//              cores (train.matmul_precision = bf16), validated against a bound widened by that
//              rounding;
//   adamw      the device AdamW in params/s and GB/s next to a device-to-device copy measured in
//              the same run (28 bytes per parameter for an f32 step, 30 with the bf16 copy; goal:
//              ≥ 0.8 of the copy), validated bit for bit against the CPU scalar path over
//              adam_steps steps first;
//   pinned     pinned host ⇄ device copy GB/s;
//   train      tokens/s and MFU of training runs: all on the device (repeated with f32 GEMMs
//              when it multiplies with bf16 operands, device_f32_matmuls), then offloaded (params,
//              grads and optimizer to host, or offload_overrides) under a device limit that
//              forces it (and to NVMe with nvme_path).
// Timing: host wall clock around stream synchronizes, calls batched so a batch takes ≥ 2 ms; the
// best batch is reported with the median beside it.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

struct GpuBenchOptions {
  int device = 0;
  std::vector<std::array<int, 3>> gemm_shapes;      // bf16 (m, n, k); empty: kDefaultGemmShapes
  std::vector<std::array<int, 3>> gemm_f32_shapes;  // f32 (m, n, k); empty: 4096³ and 8192³
  size_t adam_numel = size_t{256} << 20;         // parameters of the timed AdamW step
  size_t copy_bytes = size_t{1} << 30;           // device copy and pinned transfers
  int adam_steps = 5;                            // steps of the bit-for-bit AdamW validation
  double min_seconds = 0.25;                     // per timed measurement
  bool train = true;
  std::string train_config;                      // TOML; empty: a ~100M-parameter GPU default
  std::vector<std::string> train_overrides;      // section.key=value, applied after
  int train_steps = 8;                           // the first is warm-up
  // The offloaded run: these overrides on top of the training config (empty: params, grads and
  // optimizer on host), and offload.device_mem_limit = offload_limit_fraction × the bytes of the
  // all-device run's states (compute copy, gradients, master weights, m, v); 0: halfway between
  // the device bytes the offloaded and the all-device runs plan for.
  std::vector<std::string> offload_overrides;
  double offload_limit_fraction = 0;
  std::string nvme_path;                         // directory for the NVMe placement; empty: skip
};

// Throws Error when no CUDA device is usable; otherwise every failure is recorded in its section.
nlohmann::json run_gpu_bench(const GpuBenchOptions& options);

// strata's f32 linear (an m × k input times n × k weights) on CUDA device `device`, its result
// checked: the best rate over calls batched to at least min_seconds, in FLOP/s. bf16_operands:
// with bf16 operands on the tensor cores, as train.matmul_precision = bf16 runs it. Throws Error
// when no CUDA device is usable or the result is wrong.
double gpu_linear_flops(int device, int m, int n, int k, bool bf16_operands, double min_seconds);

}  // namespace strata
