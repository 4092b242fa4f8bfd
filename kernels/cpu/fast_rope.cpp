// kernels/cpu/fast_rope.cpp — fast rotary embedding (Hugging Face rotate_half), in place.
// cos/sin of every (position, frequency) come from a small cache of tables computed in double
// exactly as the reference computes its angles; applying them is a vectorized pass over rows.
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cpu/fast_common.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::fast {
namespace {

constexpr int64_t kRopeRowsPerTask = 32;  // rows (tokens) per task
constexpr size_t kRopeCacheEntries = 8;   // distinct (T, D, theta) kept

struct RopeTable {
  int T = 0, D = 0;
  float theta = 0;
  std::vector<float> cos, sin;  // (T, D/2)
};

std::shared_ptr<const RopeTable> rope_table(int T, int D, float theta) {
  static std::mutex mutex;
  static std::vector<std::shared_ptr<const RopeTable>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& t : cache)
    if (t->T == T && t->D == D && t->theta == theta) return t;
  auto table = std::make_shared<RopeTable>();
  table->T = T;
  table->D = D;
  table->theta = theta;
  const int half = D / 2;
  table->cos.resize(size_t(T) * half);
  table->sin.resize(size_t(T) * half);
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(double(theta), -2.0 * i / D);  // theta^(-2i/D)
    for (int t = 0; t < T; ++t) {
      const double f = t * inv_freq;
      table->cos[size_t(t) * half + i] = float(std::cos(f));
      table->sin[size_t(t) * half + i] = float(std::sin(f));
    }
  }
  if (cache.size() >= kRopeCacheEntries) cache.erase(cache.begin());
  cache.push_back(table);
  return table;
}

// kInverse = false: (a, b) → (a cos − b sin, b cos + a sin); true: the transpose rotation.
template <bool kInverse>
void rope_apply(const char* op, float* x, int B, int T, int n_heads, int D, int ld, float theta) {
  check_rope(op, B, T, n_heads, D, ld);
  if (B == 0 || T == 0 || n_heads == 0 || D == 0) return;
  const auto table = rope_table(T, D, theta);
  const int half = D / 2;
  parallel_rows(int64_t(B) * T, kRopeRowsPerTask, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t t = row % T;
      const float* __restrict cs = table->cos.data() + t * half;
      const float* __restrict sn = table->sin.data() + t * half;
      for (int h = 0; h < n_heads; ++h) {
        float* __restrict lo = x + row * ld + int64_t(h) * D;
        float* __restrict hi = lo + half;
#pragma omp simd
        for (int i = 0; i < half; ++i) {
          const float a = lo[i], b = hi[i];
          const float s = kInverse ? -sn[i] : sn[i];
          lo[i] = a * cs[i] - b * s;
          hi[i] = b * cs[i] + a * s;
        }
      }
    }
  });
}

}  // namespace

void rope_fwd(float* x, int B, int T, int n_heads, int D, int ld, float theta) {
  rope_apply<false>("rope_fwd", x, B, T, n_heads, D, ld, theta);
}

void rope_bwd(float* dx, int B, int T, int n_heads, int D, int ld, float theta) {
  rope_apply<true>("rope_bwd", dx, B, T, n_heads, D, ld, theta);
}

}  // namespace strata::cpu::fast
