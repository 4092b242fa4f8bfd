// kernels/cuda/reduce.cu — Σ x and Σ x² in double in two passes: a fixed grid of blocks, each
// summing a grid-stride slice of x into one partial (block_sum), then one block summing the
// partials in order. x² of a float is exact in double (24-bit mantissas square into 48 bits), so
// the only roundings are the additions, as in the scalar reference (which adds in index order).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.h"

namespace strata::cuda {
namespace {

constexpr int kReduceThreads = 256;
constexpr unsigned kMaxPartials = 1024;

template <bool kSquares>
__global__ void partial_kernel(double* partials, const float* x, size_t n) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double v = x[i];
    acc += kSquares ? v * v : v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void final_kernel(double* out, const double* partials, unsigned count) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

void launch_sum(CudaStream& s, double* out, const float* x, size_t n, bool squares) {
  if (n == 0) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), native(s)));  // +0.0
    return;
  }
  const unsigned blocks = std::min(grid_for(n, kReduceThreads), kMaxPartials);
  double* partials = static_cast<double*>(s.scratch(blocks * sizeof(double)));
  if (squares)
    partial_kernel<true><<<blocks, kReduceThreads, 0, native(s)>>>(partials, x, n);
  else
    partial_kernel<false><<<blocks, kReduceThreads, 0, native(s)>>>(partials, x, n);
  STRATA_CUDA_LAUNCH_CHECK();
  final_kernel<<<1, kReduceThreads, 0, native(s)>>>(out, partials, blocks);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
