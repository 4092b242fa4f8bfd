// kernels/cpu/fast_rope.cpp — fast rotary embedding (Hugging Face rotate_half), in place.
// A vectorized pass over rows that reads the caller's cos/sin tables (rope_tables.h) and rotates
// each pair in double with one rounding, as the reference does: compiled with -ffp-contract=off,
// it is bit-identical to the reference. It computes no angles and keeps no state.
#include "kernels/cpu/fast_common.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::fast {
namespace {

constexpr int64_t kRopeRowsPerTask = 32;  // rows (tokens) per task

// kInverse = false: (a, b) → (a c − b s, b c + a s); true: the transpose rotation (s → −s).
template <bool kInverse>
void rope_apply(const char* op, float* x, const float* cos, const float* sin, int B, int T,
                int n_heads, int D, int ld) {
  check_rope(op, cos, sin, B, T, n_heads, D, ld);
  if (B == 0 || T == 0 || n_heads == 0 || D == 0) return;
  const int half = D / 2;
  parallel_rows(int64_t(B) * T, kRopeRowsPerTask, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t t = row % T;
      const float* __restrict cs = cos + t * half;
      const float* __restrict sn = sin + t * half;
      for (int h = 0; h < n_heads; ++h) {
        float* __restrict lo = x + row * ld + int64_t(h) * D;
        float* __restrict hi = lo + half;
#pragma omp simd
        for (int i = 0; i < half; ++i) {
          const double a = lo[i], b = hi[i], c = cs[i];
          const double s = kInverse ? -double(sn[i]) : double(sn[i]);
          lo[i] = float(a * c - b * s);
          hi[i] = float(b * c + a * s);
        }
      }
    }
  });
}

}  // namespace

void rope_fwd(float* x, const float* cos, const float* sin, int B, int T, int n_heads, int D,
              int ld) {
  rope_apply<false>("rope_fwd", x, cos, sin, B, T, n_heads, D, ld);
}

void rope_bwd(float* dx, const float* cos, const float* sin, int B, int T, int n_heads, int D,
              int ld) {
  rope_apply<true>("rope_bwd", dx, cos, sin, B, T, n_heads, D, ld);
}

}  // namespace strata::cpu::fast
