// kernels/cpu/fast_mlp.cpp — fast SwiGLU forward and backward: one vectorized pass over rows,
// with the vectorizable exp of fast_common.h.
#include <algorithm>

#include "kernels/cpu/fast_common.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::fast {
namespace {

constexpr int64_t kSwigluElemsPerTask = 1 << 14;  // ~16K elements per task, whatever F is

int64_t rows_per_task(int F) { return std::max<int64_t>(1, kSwigluElemsPerTask / std::max(1, F)); }

}  // namespace

// out (N, F) = silu(gate) · up, silu(g) = g / (1 + e^-g).
void swiglu_fwd(float* out, const float* gate, const float* up, int N, int F, int ld) {
  check_strided("swiglu_fwd", N, F, ld);
  parallel_rows(N, rows_per_task(F), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* __restrict g = gate + n * ld;
      const float* __restrict u = up + n * ld;
      float* __restrict o = out + n * F;
#pragma omp simd
      for (int f = 0; f < F; ++f) o[f] = g[f] / (1.0f + exp_fast(-g[f])) * u[f];
    }
  });
}

// s = sigmoid(g): dgate = dout·up·s·(1 + g(1 − s)), dup = dout·g·s. Written with stride ld; the
// outputs may overwrite gate/up in place (each element is read before it is written).
void swiglu_bwd(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                int N, int F, int ld) {
  check_strided("swiglu_bwd", N, F, ld);
  parallel_rows(N, rows_per_task(F), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* g = gate + n * ld;
      const float* u = up + n * ld;
      const float* d = dout + n * F;
      float* dg = dgate + n * ld;
      float* du = dup + n * ld;
#pragma omp simd
      for (int f = 0; f < F; ++f) {
        const float gv = g[f], uv = u[f], dv = d[f];
        const float s = 1.0f / (1.0f + exp_fast(-gv));
        dg[f] = dv * uv * s * (1.0f + gv * (1.0f - s));
        du[f] = dv * gv * s;
      }
    }
  });
}

}  // namespace strata::cpu::fast
