// kernels/cuda/norm.cu — RMSNorm (Hugging Face LlamaRMSNorm).
//
// Forward, one block per row: ss = Σ x² in double (block_sum), r = float(1 / sqrt(ss / C + eps))
// in double, out = (x · r) · w in float — the reference's operations. Backward: one block per
// row for dx (dot = Σ w·dout·y in double, then dx += float(r·(w·dout − y·dot/C)) per element,
// as the reference), and a two-pass column reduction for dw: per chunk of kRowsPerChunk rows a
// double partial of Σ dout·y per column (scratch), then per column the partials summed in chunk
// order and added once: dw += float(Σ). Deterministic (fixed partition, fixed order); dw is more
// accurate than the reference's f32 running sum, so it matches it to f32 rounding, not bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.h"

namespace strata::cuda {
namespace {

constexpr int kRowsPerChunk = 256;  // dw partials: rows per chunk
constexpr int kColsPerBlock = 32;   // dw partials: block = 32 columns × kRowLanes row lanes
constexpr int kRowLanes = 8;

__global__ void rmsnorm_fwd_kernel(float* out, float* rstd, const float* x, const float* w, int C,
                                   float eps) {
  __shared__ double shared[32];
  const size_t row = blockIdx.x;
  const float* xr = x + row * C;
  double ss = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double v = xr[c];
    ss += v * v;
  }
  ss = block_sum(ss, shared);
  const float r = float(1.0 / sqrt(ss / C + double(eps)));
  if (threadIdx.x == 0) rstd[row] = r;
  float* o = out + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = __fmul_rn(__fmul_rn(xr[c], r), w[c]);
}

__global__ void rmsnorm_bwd_dx_kernel(float* dx, const float* dout, const float* x, const float* w,
                                      const float* rstd, int C) {
  __shared__ double shared[32];
  const size_t row = blockIdx.x;
  const float* xr = x + row * C;
  const float* gr = dout + row * C;
  const double r = rstd[row];
  double dot = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += __dmul_rn(__dmul_rn(double(w[c]), double(gr[c])), __dmul_rn(double(xr[c]), r));
  dot = block_sum(dot, shared);
  const double mean_dot = C > 0 ? dot / C : 0.0;
  float* d = dx + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double y = __dmul_rn(double(xr[c]), r);
    const double term = __dmul_rn(r, __dsub_rn(__dmul_rn(double(w[c]), double(gr[c])), __dmul_rn(y, mean_dot)));
    d[c] = __fadd_rn(d[c], float(term));
  }
}

// grid (ceil(C / 32), chunks), block (32, kRowLanes): partial[chunk, c] = Σ_rows dout·(x·r).
__global__ void rmsnorm_bwd_dw_partial_kernel(double* partial, const float* dout, const float* x,
                                              const float* rstd, int N, int C) {
  __shared__ double lanes[kRowLanes][kColsPerBlock];
  const int c = blockIdx.x * kColsPerBlock + threadIdx.x;
  const int row0 = blockIdx.y * kRowsPerChunk;
  const int row1 = min(N, row0 + kRowsPerChunk);
  double acc = 0.0;
  if (c < C)
    for (int n = row0 + threadIdx.y; n < row1; n += kRowLanes) {
      const size_t i = size_t(n) * C + c;
      acc += __dmul_rn(double(dout[i]), __dmul_rn(double(x[i]), double(rstd[n])));
    }
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double sum = lanes[0][threadIdx.x];
    for (int l = 1; l < kRowLanes; ++l) sum += lanes[l][threadIdx.x];
    partial[size_t(blockIdx.y) * C + c] = sum;
  }
}

__global__ void rmsnorm_bwd_dw_final_kernel(float* dw, const double* partial, int chunks, int C) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    double sum = 0.0;
    for (int ch = 0; ch < chunks; ++ch) sum += partial[size_t(ch) * C + c];
    dw[c] = __fadd_rn(dw[c], float(sum));
  }
}

}  // namespace

void launch_rmsnorm_fwd(CudaStream& s, float* out, float* rstd, const float* x, const float* w,
                        int N, int C, float eps) {
  if (N == 0) return;
  rmsnorm_fwd_kernel<<<N, kThreads, 0, native(s)>>>(out, rstd, x, w, C, eps);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_rmsnorm_bwd(CudaStream& s, float* dx, float* dw, const float* dout, const float* x,
                        const float* w, const float* rstd, int N, int C) {
  if (N == 0 || C == 0) return;
  rmsnorm_bwd_dx_kernel<<<N, kThreads, 0, native(s)>>>(dx, dout, x, w, rstd, C);
  STRATA_CUDA_LAUNCH_CHECK();
  const int chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  double* partial = static_cast<double*>(s.scratch(size_t(chunks) * C * sizeof(double)));
  const dim3 grid(unsigned((C + kColsPerBlock - 1) / kColsPerBlock), unsigned(chunks));
  rmsnorm_bwd_dw_partial_kernel<<<grid, dim3(kColsPerBlock, kRowLanes), 0, native(s)>>>(
      partial, dout, x, rstd, N, C);
  STRATA_CUDA_LAUNCH_CHECK();
  rmsnorm_bwd_dw_final_kernel<<<grid_for(size_t(C)), kThreads, 0, native(s)>>>(dw, partial, chunks, C);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
