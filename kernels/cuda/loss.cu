// kernels/cuda/loss.cu — softmax cross-entropy, one block per row.
//
// lse = m + log Σ_j exp(x_j − m), m = max_j x_j, summed in double (block_sum, fixed order);
// loss = float(lse − x_t); dlogits_j = float((exp(x_j − lse) − [j = t]) · dloss) — the scalar
// reference's formulas in double, rounded once. In place is safe: every read of the row (the max
// and sum passes) finishes at a block barrier before the first write, and the last pass reads
// each element before the same thread overwrites it.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loss.h"

namespace strata::cuda {
namespace {

__device__ double row_logsumexp(const float* row, int V, double* shared) {
  double m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmax(m, double(row[j]));
  m = block_max(m, shared);
  double z = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) z += exp(__dsub_rn(double(row[j]), m));
  z = block_sum(z, shared);
  return __dadd_rn(m, log(z));
}

__global__ void cross_entropy_fwd_kernel(float* losses, const float* logits, const int32_t* targets,
                                         int V, KernelFault* fault) {
  __shared__ double shared[32];
  const int n = blockIdx.x;
  const int32_t t = targets[n];
  if (t < 0 || t >= V) {  // uniform across the block: every thread returns
    if (threadIdx.x == 0) {
      if (t >= V) report_fault(fault, kFaultCrossEntropyFwd, n, t, V);
      losses[n] = 0.0f;
    }
    return;
  }
  const float* row = logits + size_t(n) * V;
  const double l = row_logsumexp(row, V, shared);
  if (threadIdx.x == 0) losses[n] = float(__dsub_rn(l, double(row[t])));
}

__global__ void cross_entropy_bwd_kernel(float* dlogits, const float* logits, const int32_t* targets,
                                         double dloss, int V, KernelFault* fault) {
  __shared__ double shared[32];
  const int n = blockIdx.x;
  const int32_t t = targets[n];
  float* drow = dlogits + size_t(n) * V;
  if (t < 0 || t >= V) {
    if (t >= V && threadIdx.x == 0) report_fault(fault, kFaultCrossEntropyBwd, n, t, V);
    for (int j = threadIdx.x; j < V; j += blockDim.x) drow[j] = 0.0f;
    return;
  }
  const float* row = logits + size_t(n) * V;
  const double l = row_logsumexp(row, V, shared);
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const double p = exp(__dsub_rn(double(row[j]), l));
    drow[j] = float(__dmul_rn(__dsub_rn(p, j == t ? 1.0 : 0.0), dloss));
  }
}

}  // namespace

void launch_cross_entropy_fwd(CudaStream& s, float* losses, const float* logits,
                              const int32_t* targets, int N, int V) {
  if (N == 0) return;
  cross_entropy_fwd_kernel<<<N, kThreads, 0, native(s)>>>(losses, logits, targets, V, s.fault());
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_cross_entropy_bwd(CudaStream& s, float* dlogits, const float* logits,
                              const int32_t* targets, float dloss, int N, int V) {
  if (N == 0) return;
  cross_entropy_bwd_kernel<<<N, kThreads, 0, native(s)>>>(dlogits, logits, targets, double(dloss), V,
                                                          s.fault());
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
