// kernels/cuda/embedding.cu — embedding forward (a row gather) and backward (a scatter-add).
//
// The backward is deterministic without float atomics: the row indices 0..N−1 are sorted by
// token with CUB's radix sort, which is stable, so each token's rows come out in increasing row
// order. One block per sorted position that starts a run of equal tokens (and per 256 columns)
// then walks the run: acc = dwte[v, c]; acc += dout[n, c] for each row n of the run, in order;
// dwte[v, c] = acc — the same f32 additions in the same order as the reference's loop.
// Both take a vocabulary part (rows [row_begin, row_begin + rows) of the table, tensor
// parallelism); the whole table is the part (0, V).
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"

namespace strata::cuda {
namespace {

// wte holds rows [row_begin, row_begin + rows) of the (V, C) table; a token another part holds
// gives a zero row.
__global__ void embedding_fwd_kernel(float* out, const int32_t* tokens, const float* wte, int C,
                                     int V, int row_begin, int rows, KernelFault* fault) {
  const int n = blockIdx.x;
  const int32_t t = tokens[n];
  float* dst = out + size_t(n) * C;
  if (t < 0 || t >= V) {
    if (threadIdx.x == 0) report_fault(fault, kFaultEmbeddingFwd, n, t, V);
    return;
  }
  const int64_t r = int64_t(t) - row_begin;
  if (r < 0 || r >= rows) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = 0.0f;
    return;
  }
  const float* src = wte + size_t(r) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

// keys[n] = the token's row in this part (`rows` for a token another part holds, or one outside
// [0, V), which is reported), rows_of[n] = n.
__global__ void embedding_keys_kernel(int32_t* keys, int32_t* rows_of, const int32_t* tokens, int N,
                                      int V, int row_begin, int rows, KernelFault* fault) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    const int32_t t = tokens[n];
    const bool ok = t >= 0 && t < V;
    if (!ok) report_fault(fault, kFaultEmbeddingBwd, n, t, V);
    const int64_t r = int64_t(t) - row_begin;
    keys[n] = (ok && r >= 0 && r < rows) ? int32_t(r) : rows;
    rows_of[n] = n;
  }
}

// grid (N, ceil(C / blockDim)): block (i, cb) handles columns cb·blockDim … of the run of equal
// keys that starts at sorted position i (other positions exit at once).
__global__ void embedding_accumulate_kernel(float* dwte, const float* dout, const int32_t* keys,
                                            const int32_t* rows, int N, int C, int V) {
  const int i = blockIdx.x;
  const int32_t v = keys[i];
  if (v >= V || (i > 0 && keys[i - 1] == v)) return;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* w = dwte + size_t(v) * C + c;
  float acc = *w;
  for (int j = i; j < N && keys[j] == v; ++j) acc = __fadd_rn(acc, dout[size_t(rows[j]) * C + c]);
  *w = acc;
}

int bit_width(int v) {
  int bits = 0;
  while (v > 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

}  // namespace

void launch_embedding_fwd(CudaStream& s, float* out, const int32_t* tokens, const float* wte, int N,
                          int C, int V, int row_begin, int rows) {
  if (N == 0 || C == 0) return;
  embedding_fwd_kernel<<<N, kThreads, 0, native(s)>>>(out, tokens, wte, C, V, row_begin, rows,
                                                      s.fault());
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_embedding_bwd(CudaStream& s, float* dwte, const float* dout, const int32_t* tokens,
                          int N, int C, int V, int row_begin, int rows) {
  if (N == 0) return;
  // Keys lie in [0, rows] (rows marks tokens skipped): the sort needs bit_width(rows) bits.
  const int end_bit = std::max(1, bit_width(rows));
  size_t temp_bytes = 0;
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                    static_cast<int32_t*>(nullptr),
                                                    static_cast<const int32_t*>(nullptr),
                                                    static_cast<int32_t*>(nullptr), N, 0, end_bit,
                                                    native(s)));
  const size_t ints = size_t(N);
  ScratchCarver carve(s.scratch(4 * ScratchCarver::piece_bytes(ints * 4) + ScratchCarver::piece_bytes(temp_bytes)));
  int32_t* keys = carve.take<int32_t>(ints);
  int32_t* rows_of = carve.take<int32_t>(ints);
  int32_t* keys_sorted = carve.take<int32_t>(ints);
  int32_t* rows_sorted = carve.take<int32_t>(ints);
  void* temp = carve.take<char>(temp_bytes);
  embedding_keys_kernel<<<grid_for(ints), kThreads, 0, native(s)>>>(keys, rows_of, tokens, N, V,
                                                                    row_begin, rows, s.fault());
  STRATA_CUDA_LAUNCH_CHECK();
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, static_cast<const int32_t*>(keys),
                                                    keys_sorted, static_cast<const int32_t*>(rows_of),
                                                    rows_sorted, N, 0, end_bit, native(s)));
  if (C == 0) return;
  const dim3 grid(unsigned(N), unsigned((C + kThreads - 1) / kThreads));
  embedding_accumulate_kernel<<<grid, kThreads, 0, native(s)>>>(dwte, dout, keys_sorted, rows_sorted, N, C,
                                                                rows);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
