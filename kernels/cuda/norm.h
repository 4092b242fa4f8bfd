// kernels/cuda/norm.h — launchers of RMSNorm (norm.cu), forward and backward, as in ops.h.
// Sums are accumulated in double and the per-element formulas are the reference's, so rstd and
// out match ref_ops to the last bit except where the order of the double sum tips a rounding.
#pragma once

namespace strata::cuda {

class CudaStream;

void launch_rmsnorm_fwd(CudaStream& s, float* out, float* rstd, const float* x, const float* w,
                        int N, int C, float eps);
// dx ACCUMULATES; dw accumulates. Uses the stream's scratch (per-chunk partial sums of dw).
void launch_rmsnorm_bwd(CudaStream& s, float* dx, float* dw, const float* dout, const float* x,
                        const float* w, const float* rstd, int N, int C);

}  // namespace strata::cuda
