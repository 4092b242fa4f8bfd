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

// Vocabulary-parallel parts: logits hold columns [col_begin, col_begin + Vp) of V.
__global__ void cross_entropy_part_fwd_kernel(float* stats, const float* logits,
                                              const int32_t* targets, int Vp, int col_begin, int V,
                                              KernelFault* fault) {
  __shared__ double shared[32];
  const int n = blockIdx.x;
  const int32_t t = targets[n];
  if (t < 0 || t >= V) {
    if (threadIdx.x == 0) {
      if (t >= V) report_fault(fault, kFaultCrossEntropyFwd, n, t, V);
      stats[2 * size_t(n)] = 0.0f;
      stats[2 * size_t(n) + 1] = 0.0f;
    }
    return;
  }
  const float* row = logits + size_t(n) * Vp;
  const double l = row_logsumexp(row, Vp, shared);
  if (threadIdx.x == 0) {
    const int64_t j = int64_t(t) - col_begin;
    stats[2 * size_t(n)] = float(l);
    stats[2 * size_t(n) + 1] = (j >= 0 && j < Vp) ? row[j] : 0.0f;
  }
}

__global__ void cross_entropy_combine_kernel(float* losses, float* lse, const float* stats_all,
                                             const int32_t* targets, int N, int P) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    if (targets[n] < 0) {
      losses[n] = lse[n] = 0.0f;
      continue;
    }
    double m = -INFINITY, z = 0.0, target = 0.0;
    for (int p = 0; p < P; ++p) m = fmax(m, double(stats_all[(size_t(p) * N + n) * 2]));
    for (int p = 0; p < P; ++p) {
      z = __dadd_rn(z, exp(__dsub_rn(double(stats_all[(size_t(p) * N + n) * 2]), m)));
      target = __dadd_rn(target, double(stats_all[(size_t(p) * N + n) * 2 + 1]));
    }
    const double l = __dadd_rn(m, log(z));
    lse[n] = float(l);
    losses[n] = float(__dsub_rn(l, target));
  }
}

__global__ void cross_entropy_part_bwd_kernel(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, double dloss, int Vp,
                                              int col_begin, int V, KernelFault* fault) {
  const int n = blockIdx.x;
  const int32_t t = targets[n];
  float* drow = dlogits + size_t(n) * Vp;
  if (t < 0 || t >= V) {
    if (t >= V && threadIdx.x == 0) report_fault(fault, kFaultCrossEntropyBwd, n, t, V);
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) drow[j] = 0.0f;
    return;
  }
  const float* row = logits + size_t(n) * Vp;
  const double l = double(lse[n]);
  const int64_t jt = int64_t(t) - col_begin;
  for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
    const double p = exp(__dsub_rn(double(row[j]), l));
    drow[j] = float(__dmul_rn(__dsub_rn(p, j == jt ? 1.0 : 0.0), dloss));
  }
}

}  // namespace

void launch_cross_entropy_part_fwd(CudaStream& s, float* stats, const float* logits,
                                   const int32_t* targets, int N, int Vp, int col_begin, int V) {
  if (N == 0) return;
  cross_entropy_part_fwd_kernel<<<N, kThreads, 0, native(s)>>>(stats, logits, targets, Vp, col_begin,
                                                               V, s.fault());
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_cross_entropy_combine(CudaStream& s, float* losses, float* lse, const float* stats_all,
                                  const int32_t* targets, int N, int P) {
  if (N == 0) return;
  cross_entropy_combine_kernel<<<grid_for(size_t(N)), kThreads, 0, native(s)>>>(losses, lse, stats_all,
                                                                               targets, N, P);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_cross_entropy_part_bwd(CudaStream& s, float* dlogits, const float* logits,
                                   const float* lse, const int32_t* targets, float dloss, int N,
                                   int Vp, int col_begin, int V) {
  if (N == 0) return;
  cross_entropy_part_bwd_kernel<<<N, kThreads, 0, native(s)>>>(dlogits, logits, lse, targets,
                                                               double(dloss), Vp, col_begin, V,
                                                               s.fault());
  STRATA_CUDA_LAUNCH_CHECK();
}

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
