// bench/gemm_bench.cpp — `strata bench gemm`: validate strata's linear path, then time it next to
// one multi-threaded OpenBLAS call (see gemm_bench.h).
#include "bench/gemm_bench.h"

#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "bench/stats.h"
#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/ref_ops.h"

namespace strata {
namespace {

constexpr int kMinCalls = 3;           // timed calls of each path, at least
constexpr int kValidateSamples = 256;  // elements of the timed product checked in double
constexpr double kU32 = 1.0 / (1 << 24);

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Error bound of an f32 dot product of length k in any summation order: (k + 2)·u·Σ|a b|.
double dot_bound(const float* a, const float* b, int k) {
  double s = 0;
  for (int i = 0; i < k; ++i) s += std::fabs(double(a[i]) * b[i]);
  return (k + 2) * kU32 * s;
}

// Largest |error| / bound of fast::linear_fwd against ref::linear_fwd<double> on a small
// problem whose sizes hit the block and micro-kernel tails.
double validate_small() {
  const int m = 131, n = 67, k = 45;
  auto a = random_floats(size_t(m) * k, 11), b = random_floats(size_t(n) * k, 12);
  std::vector<float> out(size_t(m) * n);
  cpu::fast::linear_fwd(out.data(), a.data(), b.data(), m, k, n);
  std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()), want(out.size());
  cpu::ref::linear_fwd<double>(want.data(), ad.data(), bd.data(), m, k, n);
  double worst = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const double err = std::fabs(out[size_t(i) * n + j] - want[size_t(i) * n + j]);
      const double bound = dot_bound(&a[size_t(i) * k], &b[size_t(j) * k], k) + 1e-30;
      worst = std::max(worst, err / bound);
    }
  return worst;
}

// Largest |error| / bound over sampled elements of out = a·b^T.
double validate_sampled(const std::vector<float>& out, const std::vector<float>& a,
                        const std::vector<float>& b, int m, int n, int k) {
  std::mt19937 rng(13);
  double worst = 0;
  for (int s = 0; s < kValidateSamples; ++s) {
    const int i = int(rng() % unsigned(m)), j = int(rng() % unsigned(n));
    const float* ar = &a[size_t(i) * k];
    const float* br = &b[size_t(j) * k];
    double want = 0;
    for (int x = 0; x < k; ++x) want += double(ar[x]) * br[x];
    const double err = std::fabs(out[size_t(i) * n + j] - want);
    worst = std::max(worst, err / (dot_bound(ar, br, k) + 1e-30));
  }
  return worst;
}

void require_valid(double ratio, const char* what) {
  if (!(ratio <= 1.0))
    fail("bench::gemm", str("validation failed: ", what, " is off by ", ratio,
                            "x its f32 error bound; the timings would be meaningless"));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Times fn() call by call until at least kMinCalls calls and min_seconds in total.
template <class Fn>
std::vector<double> time_calls(double min_seconds, const Fn& fn) {
  std::vector<double> s;
  double total = 0;
  while (s.size() < size_t(kMinCalls) || total < min_seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    s.push_back(seconds_since(t0));
    total += s.back();
  }
  return s;
}

}  // namespace

nlohmann::json run_gemm_bench(const GemmBenchOptions& o) {
  if (o.m <= 0 || o.n <= 0 || o.k <= 0)
    fail("bench::gemm", str("sizes must be positive: m=", o.m, " n=", o.n, " k=", o.k));
  if (o.threads < 0) fail("bench::gemm", str("--threads must be ≥ 0, got ", o.threads));
  if (!(o.min_seconds > 0)) fail("bench::gemm", str("--seconds must be > 0, got ", o.min_seconds));
  const double bytes = 4.0 * (double(o.m) * o.k + double(o.n) * o.k + double(o.m) * o.n);
  if (bytes > 0.5 * double(available_memory_bytes()))
    fail("bench::gemm",
         str("m·k + n·k + m·n floats need ", bytes / 1e9, " GB, more than half of ",
             "the available memory"),
         "choose smaller --m/--n/--k");
  const int threads = o.threads > 0 ? o.threads : tbb::this_task_arena::max_concurrency();
  tbb::task_arena arena(threads);

  nlohmann::json j;
  arena.execute([&] {
    const double small = validate_small();
    require_valid(small, "linear_fwd (131×67×45) against the double reference");
    auto a = random_floats(size_t(o.m) * o.k, 1), b = random_floats(size_t(o.n) * o.k, 2);
    std::vector<float> out(size_t(o.m) * o.n), out_blas(out.size());

    // Untimed first calls (page faults, OpenBLAS buffers, thread start-up), then validation.
    cpu::fast::linear_fwd(out.data(), a.data(), b.data(), o.m, o.k, o.n);
    const double sampled = validate_sampled(out, a, b, o.m, o.n, o.k);
    require_valid(sampled, "the timed product (sampled elements)");

    const double flops = 2.0 * o.m * o.n * o.k;
    const auto start = std::chrono::steady_clock::now();
    // strata's path first, with OpenBLAS at one thread (as in training).
    std::vector<double> strata_s = time_calls(o.min_seconds, [&] {
      cpu::fast::linear_fwd(out.data(), a.data(), b.data(), o.m, o.k, o.n);
    });
    // Then the baseline: one call with OpenBLAS's own threads. Not interleaved call by call:
    // OpenBLAS's idle workers spin for a while after each call and would slow the next
    // strata call.
    std::vector<double> blas_s;
    cpu::blas::set_blas_threads(threads);
    try {
      auto call = [&] {
        cpu::blas::gemm_blas_threaded(false, true, o.m, o.n, o.k, 1.0f, a.data(), o.k, b.data(),
                                      o.k, 0.0f, out_blas.data(), o.n);
      };
      call();  // untimed: starts OpenBLAS's threads
      blas_s = time_calls(o.min_seconds, call);
    } catch (...) {
      cpu::blas::set_blas_threads(1);
      throw;
    }
    cpu::blas::set_blas_threads(1);
    const double elapsed = seconds_since(start);
    require_valid(validate_sampled(out_blas, a, b, o.m, o.n, o.k), "the OpenBLAS baseline");

    const double best = flops / *std::min_element(strata_s.begin(), strata_s.end()) / 1e9;
    const double best_blas = flops / *std::min_element(blas_s.begin(), blas_s.end()) / 1e9;
    j = {{"m", o.m},
         {"n", o.n},
         {"k", o.k},
         {"threads", threads},
         {"isa", cpu_features().describe()},
         {"blas", cpu::blas::describe()},
         {"gflops", best},
         {"gflops_median", flops / median(strata_s) / 1e9},
         {"gflops_cblas_single_call", best_blas},
         {"gflops_cblas_single_call_median", flops / median(blas_s) / 1e9},
         {"ratio_to_cblas", best / best_blas},
         {"seconds", elapsed},
         {"calls", strata_s.size()},
         {"validated", true},
         {"max_error_ratio", std::max(small, sampled)}};
  });
  return j;
}

double measure_gemm_flops(double min_seconds, GemmRate rate) {
  const int m = 2048, n = 1536, k = 512;
  require_valid(validate_small(), "linear_fwd (131×67×45) against the double reference");
  auto a = random_floats(size_t(m) * k, 1), b = random_floats(size_t(n) * k, 2);
  std::vector<float> out(size_t(m) * n);
  cpu::fast::linear_fwd(out.data(), a.data(), b.data(), m, k, n);  // untimed first call
  require_valid(validate_sampled(out, a, b, m, n, k), "the timed product (sampled elements)");
  const auto s = time_calls(
      min_seconds, [&] { cpu::fast::linear_fwd(out.data(), a.data(), b.data(), m, k, n); });
  const double seconds =
      rate == GemmRate::best_call ? *std::min_element(s.begin(), s.end()) : median(s);
  return 2.0 * m * n * k / seconds;
}

}  // namespace strata
