// kernels/cuda/mlp.cu — SwiGLU: out = silu(gate) · up, silu(g) = g / (1 + e^−g), and its
// gradient with s = sigmoid(g): dgate = dout·up·s·(1 + g(1 − s)), dup = dout·g·s.
//
// Each element is computed in double with the reference's operations in the reference's order
// (explicit round-to-nearest intrinsics: nothing fused that the reference does not fuse) and
// rounded once to float, so results match the reference up to CUDA's exp differing from glibc's
// in the last double ulp. Double arithmetic costs little on GPUs with full-rate FP64 (A100,
// H100, H200) and this op is memory-bound there. The gradient may be written over gate/up (each
// element is read before the same thread writes it), so nothing is __restrict__.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mlp.h"

namespace strata::cuda {
namespace {

__global__ void swiglu_fwd_kernel(float* out, const float* gate, const float* up, int F, int ld,
                                  size_t total) {
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F;
    const double g = gate[n * ld + f], u = up[n * ld + f];
    out[idx] = float(__dmul_rn(__ddiv_rn(g, __dadd_rn(1.0, exp(-g))), u));
  }
}

__global__ void swiglu_bwd_kernel(float* dgate, float* dup, const float* dout, const float* gate,
                                  const float* up, int F, int ld, size_t total) {
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F, i = n * ld + f;
    const double g = gate[i], u = up[i], d = dout[idx];
    const double s = __ddiv_rn(1.0, __dadd_rn(1.0, exp(-g)));
    const double du = __dmul_rn(__dmul_rn(d, u), s);
    dgate[i] = float(__dmul_rn(du, __dadd_rn(1.0, __dmul_rn(g, __dsub_rn(1.0, s)))));
    dup[i] = float(__dmul_rn(__dmul_rn(d, g), s));
  }
}

}  // namespace

void launch_swiglu_fwd(CudaStream& s, float* out, const float* gate, const float* up, int N, int F,
                       int ld) {
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  swiglu_fwd_kernel<<<grid_for(total), kThreads, 0, native(s)>>>(out, gate, up, F, ld, total);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_swiglu_bwd(CudaStream& s, float* dgate, float* dup, const float* dout,
                       const float* gate, const float* up, int N, int F, int ld) {
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  swiglu_bwd_kernel<<<grid_for(total), kThreads, 0, native(s)>>>(dgate, dup, dout, gate, up, F, ld,
                                                                 total);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
