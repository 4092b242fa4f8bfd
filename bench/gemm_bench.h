// bench/gemm_bench.h — `strata bench gemm`: the machine's f32 GEMM rate through strata's CPU
// linear path and through one plain multi-threaded OpenBLAS call, validated first.
//
// Validates before it times: strata's linear path (cpu::fast::linear_fwd, the oneTBB-blocked
// single-threaded sgemm calls of kernels/cpu/blas.h) against the scalar reference in double on a
// small odd-sized problem, then sampled elements of the timed product. Then it times
// out (m, n) = a (m, k) · b^T (n, k) both ways: strata's path first, then the baseline (not
// interleaved: OpenBLAS's workers spin for a while after each of its calls and would slow the
// next strata call), each for at least min_seconds and at least 3 calls. The reported rate is
// the best call; the median is reported beside it.
#pragma once

#include <nlohmann/json.hpp>

namespace strata {

struct GemmBenchOptions {
  int m = 2048, n = 2048, k = 2048;  // out (m, n) = a (m, k) · b^T (n, k)
  int threads = 0;                   // 0 = all (the process's oneTBB limit)
  double min_seconds = 1.0;          // time at least this long per measurement
};

// The JSON object `strata bench gemm --json` prints:
//   m, n, k, threads, isa (CPU features), blas (OpenBLAS build and core),
//   gflops (strata path, best call), gflops_median,
//   gflops_cblas_single_call (one cblas_sgemm with OpenBLAS threads = threads, then restored
//   to 1), gflops_cblas_single_call_median, ratio_to_cblas (gflops / gflops_cblas_single_call),
//   seconds (wall time spent timing), calls (timed calls of each path), validated (true),
//   max_error_ratio (largest |error| / bound seen in validation; ≤ 1).
// Throws Error on bad options or when validation fails.
nlohmann::json run_gemm_bench(const GemmBenchOptions& options);

// Which call's time a GEMM rate is taken from: the best (a peak, MFU's denominator), or the
// median (the step model's, nearer what a step's many calls sustain: on a 2-core VM the median
// call ran 5-8 % below the best, and a training step's linear layers 6-11 % below the median).
enum class GemmRate { best_call, median_call };

// The f32 GEMM FLOP/s of this machine as strata's training step sees it: strata's linear path
// on out (2048, 1536) = a (2048, 512) · b^T — the shape of a dim-512 model's MLP up-projection
// over 2048 tokens (8 × 256), the most common GEMM shape of the reference training run — from
// the best or the median call. Validates the path first; uses all threads.
double measure_gemm_flops(double min_seconds = 0.5, GemmRate rate = GemmRate::best_call);

}  // namespace strata
