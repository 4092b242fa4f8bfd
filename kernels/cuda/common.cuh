// kernels/cuda/common.cuh — what the CUDA op files share: the stream's native handle, launch
// checks, grid sizes, fault reporting and deterministic block reductions. Included by *.cu only.
//
// Reductions here combine partial values in an order fixed by the block size alone (a shuffle
// tree within each warp, then warp results in warp order), so a kernel launched with the same
// shape gives the same bits on every run.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cuda_stream.h"

namespace strata::cuda {

inline cudaStream_t native(CudaStream& s) { return static_cast<cudaStream_t>(s.native()); }

// Launch-configuration errors are reported right after the launch (they are not sticky).
#define STRATA_CUDA_LAUNCH_CHECK() STRATA_CUDA_CHECK(cudaGetLastError())

inline constexpr int kThreads = 256;  // the default block of the elementwise and row kernels

// Blocks for a grid-stride loop over n items: enough to fill any current GPU several times.
inline unsigned grid_for(size_t n, int threads = kThreads) {
  const size_t blocks = (n + size_t(threads) - 1) / size_t(threads);
  return unsigned(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

// Records the first bad input of the stream (see KernelFault); later faults are dropped.
__device__ inline void report_fault(KernelFault* f, int32_t op, int64_t row, int64_t value,
                                    int64_t limit) {
  if (atomicCAS(&f->code, 0, op) == 0) {
    f->row = row;
    f->value = value;
    f->limit = limit;
  }
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `shared` holds 32 values. Contains __syncthreads: call from all threads.
template <class T>
__device__ T block_sum(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = shared[0];
  for (int w = 1; w < warps; ++w) total += shared[w];
  return total;
}

template <class T>
__device__ T block_max(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T m = shared[0];
  for (int w = 1; w < warps; ++w) m = max(m, shared[w]);
  return m;
}

}  // namespace strata::cuda
