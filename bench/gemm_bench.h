// bench/gemm_bench.h — `strata bench gemm`: the machine's f32 GEMM rate through strata's CPU
// linear path and through plain CBLAS, validated against the scalar reference first.
#pragma once

#include <nlohmann/json.hpp>

namespace strata {

struct GemmBenchOptions {
  int m = 2048, n = 2048, k = 2048;  // out (m, n) = a (m, k) · b^T (n, k)
  int threads = 0;                  // 0 = all
  double min_seconds = 1.0;         // time at least this long per measurement
};

nlohmann::json run_gemm_bench(const GemmBenchOptions& options);
// The f32 GEMM FLOP/s of this machine as strata measures it (used as MFU's denominator).
double measure_gemm_flops(double min_seconds = 0.5);

}  // namespace strata
