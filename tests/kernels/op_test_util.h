// tests/kernels/op_test_util.h — helpers shared by the op tests: seeded random tensors and an
// element-by-element comparison that reports the worst element and fails the test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/rope_tables.h"

namespace strata::test {

// Unit roundoff of f32 (2^-24): the "u" of the tolerance comments.
inline constexpr double kU32 = 1.0 / (1 << 24);

template <class Real = float>
std::vector<Real> random_vec(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<Real> v(n);
  for (auto& x : v) x = Real(dist(rng));
  return v;
}

// The rope variants the op tests run: plain at two bases, linear, and llama3 with a short
// original context so that positions past it, and all three frequency bands, occur at small T.
inline std::vector<std::pair<std::string, RopeParams>> rope_variants() {
  RopeParams plain, long_base, linear, llama3;
  long_base.theta = 500000.0f;
  linear.type = RopeType::linear;
  linear.factor = 4.0;
  llama3.type = RopeType::llama3;
  llama3.theta = 500000.0f;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_position = 32;
  return {{"default theta 1e4", plain}, {"default theta 5e5", long_base},
          {"linear factor 4", linear}, {"llama3", llama3}};
}

// cos and sin tables (T, D/2) of a rope variant, in the element type of the op under test.
template <class Real = float>
struct RopeTablesAs {
  std::vector<Real> cos, sin;
  RopeTablesAs(const RopeParams& p, int T, int D) {
    RopeTables t = rope_tables(rope_inv_freq(p, D), T);
    cos.assign(t.cos.begin(), t.cos.end());
    sin.assign(t.sin.begin(), t.sin.end());
  }
};

inline std::vector<int32_t> random_tokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = dist(rng);
  return v;
}

template <class Real>
std::vector<double> to_double(const std::vector<Real>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

// Expects |got[i] − want[i]| ≤ tol(i) for every i; on failure reports how many elements failed
// and the worst one (index, values, tolerance). NaN anywhere in got or want fails.
inline void expect_close_fn(const std::string& what, const float* got, const float* want, size_t n,
                            const std::function<double(size_t)>& tol) {
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i], t = tol(i);
    const double err = std::fabs(g - w);
    const bool ok = !std::isnan(g) && !std::isnan(w) && err <= t;
    if (!ok) ++bad;
    const double ratio = std::isnan(err) ? INFINITY : err / std::max(t, 1e-300);
    if (ratio > worst_ratio || (!ok && bad == 1)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements out of tolerance; worst ["
                     << worst << "] got " << got[worst] << " want " << want[worst] << " tol "
                     << tol(worst);
}

// |got − want| ≤ atol + rtol·|want|.
inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_close_fn(what, got.data(), want.data(), got.size(),
                  [&](size_t i) { return atol + rtol * std::fabs(double(want[i])); });
}

inline void expect_equal(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want) {
  expect_close(what, got, want, 0.0, 0.0);
}

// An attention test's shape: batch, sequence, query heads, kv heads, head dim.
struct AttnShape {
  int B, T, H, KVH, D;
};

// Where q, k and v (and dq, dk, dv) lie in one buffer: packed rows of (H + 2·KVH)·D floats, q then
// k then v (the fused QKV projection's output), or three buffers with padded rows (ldq = H·D + 3,
// ldkv = KVH·D + 5).
struct AttnLayout {
  int ldq, ldkv;
  size_t q_off, k_off, v_off, size;
  AttnLayout(const AttnShape& s, bool packed) {
    const size_t rows = size_t(s.B) * s.T;
    if (packed) {
      ldq = ldkv = (s.H + 2 * s.KVH) * s.D;
      q_off = 0;
      k_off = size_t(s.H) * s.D;
      v_off = k_off + size_t(s.KVH) * s.D;
      size = rows * ldq;
    } else {
      ldq = s.H * s.D + 3;
      ldkv = s.KVH * s.D + 5;
      q_off = 0;
      k_off = rows * ldq;
      v_off = k_off + rows * ldkv;
      size = v_off + rows * ldkv;
    }
  }
};

}  // namespace strata::test
