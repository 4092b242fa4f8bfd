// kernels/cuda/elementwise.cu — add, scale and the casts: grid-stride loops, one element per
// iteration. `out` may alias an input (each element is read before it is written by the same
// thread), so no pointer here is __restrict__.
#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"

namespace strata::cuda {
namespace {

__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = __fadd_rn(a[i], b[i]);
}

__global__ void scale_kernel(float* x, float alpha, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(x[i], alpha);
}

__global__ void to_bf16_kernel(uint16_t* out, const float* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = f32_to_bf16_bits(in[i]);
}

__global__ void from_bf16_kernel(float* out, const uint16_t* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = bf16_bits_to_f32(in[i]);
}

__global__ void round_bf16_kernel(float* out, const float* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = bf16_bits_to_f32(f32_to_bf16_bits(in[i]));
}

}  // namespace

void launch_add(CudaStream& s, float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, native(s)>>>(out, a, b, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_scale(CudaStream& s, float* x, float alpha, size_t n) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, native(s)>>>(x, alpha, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_cast_f32_to_bf16(CudaStream& s, uint16_t* out, const float* in, size_t n) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, native(s)>>>(out, in, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_cast_bf16_to_f32(CudaStream& s, float* out, const uint16_t* in, size_t n) {
  if (n == 0) return;
  from_bf16_kernel<<<grid_for(n), kThreads, 0, native(s)>>>(out, in, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_round_to_bf16(CudaStream& s, float* out, const float* in, size_t n) {
  if (n == 0) return;
  round_bf16_kernel<<<grid_for(n), kThreads, 0, native(s)>>>(out, in, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
