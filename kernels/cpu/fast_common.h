// kernels/cpu/fast_common.h — helpers private to the fast CPU ops (fast_*.cpp): an exp that
// auto-vectorizes, per-thread scratch, and a fixed-partition parallel loop.
//
// Not a public header: only fast_*.cpp include it (they are built with -march=native -O3
// -fopenmp-simd). Nothing here allocates device memory.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/cache_aligned_allocator.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::cpu::fast {

// e^x, vectorizable (no libm call): n = round(x·log2 e), r = x − n·ln2 (ln2 split in two so
// that n·ln2_hi is exact), e^x = 2^n · P(r) with P the degree-7 Taylor polynomial of e^r. For
// |r| ≤ ln2/2 the truncation error is r^8/8! < 6e-9 relative, under 0.1 ulp of f32; with the
// roundings the result is within 0.92 ulp of e^x (measured on a dense sweep; tests allow 2).
// The input is clamped to [-87.3, 88.3]: below, the result is 0 (e^x < 2^-126 there; flushing
// subnormals loses at most 1.2e-38 absolutely); above, it saturates at e^88.3 ≈ 2.2e38 instead
// of overflowing (harmless where it is used: softmax takes x ≤ 0, SiLU divides by 1 + e^-g).
// NaN propagates.
inline float exp_fast(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 16 significant bits
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  constexpr float kLow = -87.3f, kHigh = 88.3f;
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding and subtracting rounds to integer
  // Plain selects (not std::min/max, which return references) so that GCC if-converts them
  // into vector blends in every loop this is inlined into.
  float xc = x < kLow ? kLow : x;
  xc = xc > kHigh ? kHigh : xc;
  const float n = (xc * kLog2e + kRound) - kRound;
  float r = std::fma(-n, kLn2Hi, xc);
  r = std::fma(-n, kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  const float y = p * two_n;
  return x < kLow ? 0.0f : y;
}

// Per-thread scratch memory, cache-line aligned, grown on demand and reused across calls.
using FloatVec = std::vector<float, tbb::cache_aligned_allocator<float>>;
using ThreadScratch = tbb::enumerable_thread_specific<FloatVec>;

inline float* scratch(ThreadScratch& s, size_t n) {
  FloatVec& v = s.local();
  if (v.size() < n) v.resize(n);
  return v.data();
}

// fn(begin, end) over [0, n) in chunks of at least `grain` items, in parallel. Which items share
// a chunk may vary between runs, so fn must compute each item independently of the others.
template <class Fn>
void parallel_rows(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  if (n <= grain) {
    fn(int64_t(0), n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
}

// fn(chunk, begin, end) for the fixed chunks [c·size, min(n, (c+1)·size)), in parallel. The
// chunk boundaries depend only on n and size, so per-chunk partial results combined in chunk
// order are deterministic.
template <class Fn>
void parallel_chunks(int64_t n, int64_t size, const Fn& fn) {
  if (n <= 0) return;
  const int64_t chunks = (n + size - 1) / size;
  auto body = [&](int64_t c) { fn(c, c * size, std::min(n, (c + 1) * size)); };
  if (chunks == 1) {
    body(0);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, chunks, 1),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t c = r.begin(); c < r.end(); ++c) body(c);
                    });
}

}  // namespace strata::cpu::fast
