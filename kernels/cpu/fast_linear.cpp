// kernels/cpu/fast_linear.cpp — linear forward and backward as GEMMs (blas.h), parallel over
// blocks of each output.
#include "kernels/cpu/blas.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::fast {

// out (N, OC) = in (N, IC) · w^T, w (OC, IC).
void linear_fwd(float* out, const float* in, const float* w, int N, int IC, int OC) {
  check_dims("linear_fwd", N, IC);
  check_dims("linear_fwd", N, OC);
  blas::gemm(false, true, N, OC, IC, 1.0f, in, IC, w, IC, 0.0f, out, OC);
}

// din (N, IC) = dout (N, OC) · w (OC, IC);  dw (OC, IC) += dout^T · in (N, IC).
void linear_bwd(float* din, float* dw, const float* dout, const float* in, const float* w, int N,
                int IC, int OC) {
  check_dims("linear_bwd", N, IC);
  check_dims("linear_bwd", N, OC);
  if (din) blas::gemm(false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, din, IC);
  blas::gemm(true, false, OC, IC, N, 1.0f, dout, OC, in, IC, 1.0f, dw, IC);
}

}  // namespace strata::cpu::fast
