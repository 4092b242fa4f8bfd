// kernels/cuda/rope.cu — rotary embedding (Hugging Face rotate_half), in place.
//
// Reads the caller's cos/sin tables (T, D/2) (kernels/rope_tables.h: transformers' angles,
// computed once on the host) and rotates each pair in double with explicit round-to-nearest
// intrinsics (x[i] = a c − b s; x[i + D/2] = b c + a s; one rounding to float at the end), the
// exact operation sequence of the scalar reference, so results are bit-identical to it. One
// thread per (row, i) loads c and s once and rotates that pair in every head of the row.
// It computes no angles (no pow, sin or cos on the device).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace strata::cuda {
namespace {

__global__ void rope_kernel(float* x, const float* __restrict__ cos, const float* __restrict__ sin,
                            int T, int n_heads, int D, int ld, double sign, size_t pairs) {
  const int half = D / 2;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < pairs;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t row = idx / half;
    const int i = int(idx % half);
    const size_t t = row % size_t(T);
    const double cs = cos[t * half + i];
    const double sn = __dmul_rn(sign, double(sin[t * half + i]));
    for (int h = 0; h < n_heads; ++h) {
      float* xh = x + row * size_t(ld) + size_t(h) * D;
      const double a = xh[i], b = xh[i + half];
      xh[i] = __double2float_rn(__dsub_rn(__dmul_rn(a, cs), __dmul_rn(b, sn)));
      xh[i + half] = __double2float_rn(__dadd_rn(__dmul_rn(b, cs), __dmul_rn(a, sn)));
    }
  }
}

}  // namespace

void launch_rope(CudaStream& s, float* x, const float* cos, const float* sin, int B, int T,
                 int n_heads, int D, int ld, bool inverse) {
  const size_t pairs = size_t(B) * T * (D / 2);
  if (pairs == 0 || n_heads == 0) return;
  rope_kernel<<<grid_for(pairs), kThreads, 0, native(s)>>>(x, cos, sin, T, n_heads, D, ld,
                                                           inverse ? -1.0 : 1.0, pairs);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
