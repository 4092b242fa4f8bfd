// kernels/cuda/rope.cu — rotary embedding (Hugging Face rotate_half), in place.
//
// The angle and the rotation are computed in double exactly as the scalar reference writes them
// (f = t · θ^(−2i/D); x[i] = a cos f − b sin f; x[i + D/2] = b cos f + a sin f; one rounding to
// float at the end), with explicit round-to-nearest intrinsics so the compiler fuses nothing the
// reference does not: results differ from the reference only through the last-ulp differences
// of CUDA's and glibc's double pow/sin/cos, far below f32 resolution. One thread per (row, i)
// computes the angle once and rotates that pair in every head of the row.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace strata::cuda {
namespace {

__global__ void rope_kernel(float* x, int T, int n_heads, int D, int ld, double theta, double sign,
                            size_t pairs) {
  const int half = D / 2;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < pairs;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t row = idx / half;
    const int i = int(idx % half);
    const int t = int(row % T);
    const double f = __dmul_rn(double(t), pow(theta, __ddiv_rn(-2.0 * i, double(D))));
    double sn, cs;
    sincos(f, &sn, &cs);
    sn = __dmul_rn(sign, sn);
    for (int h = 0; h < n_heads; ++h) {
      float* xh = x + row * size_t(ld) + size_t(h) * D;
      const double a = xh[i], b = xh[i + half];
      xh[i] = float(__dsub_rn(__dmul_rn(a, cs), __dmul_rn(b, sn)));
      xh[i + half] = float(__dadd_rn(__dmul_rn(b, cs), __dmul_rn(a, sn)));
    }
  }
}

}  // namespace

void launch_rope(CudaStream& s, float* x, int B, int T, int n_heads, int D, int ld, float theta,
                 bool inverse) {
  const size_t pairs = size_t(B) * T * (D / 2);
  if (pairs == 0 || n_heads == 0) return;
  rope_kernel<<<grid_for(pairs), kThreads, 0, native(s)>>>(x, T, n_heads, D, ld, double(theta),
                                                           inverse ? -1.0 : 1.0, pairs);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
