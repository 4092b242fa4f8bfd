// kernels/cuda/attention.cu — causal grouped-query attention in f32, tiled in shared memory.
//
// Every kernel gives each row (a query, or a key in dK/dV) kLanes = 4 adjacent threads; lane l
// holds dims l, l+4, l+8, … of the row in registers, and a dot product is 4 partial sums
// combined by two xor-shuffles (the same bits in all 4 lanes). A block holds kRows = 64 rows
// (256 threads) and streams tiles of kTile keys (or queries) through shared memory.
//   forward   block (query block, head, batch): scores of a key tile, masked (j ≤ t); online
//             softmax (running max m, sum l, accumulator rescaled once per tile);
//             out = acc / l, lse = m + log l.
//   backward  delta_t = Σ_d dout·out per (b, h, t) first; then
//             dQ   block (query block, head, batch): p = exp(s − lse), dp = dout·v_j,
//                  ds = p·(dp − delta); dq = scale·Σ_j ds·k_j;
//             dK,dV block (key block, kv head, batch) loops over the group's query heads and
//                  the queries t ≥ its first key: dv_j = Σ p·dout_t; dk_j = scale·Σ ds·q_t.
// No atomics and no data-dependent order: deterministic. Masked and out-of-range entries are
// zeroed, never read as garbage. Costs ~2 FMA per shared-memory read (CUDA cores, no tensor
// cores): correct and simple first, a few × below a tensor-core flash-attention kernel.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

namespace strata::cuda {
namespace {

constexpr int kLanes = 4;
constexpr int kRows = 64;
constexpr int kBlockThreads = kRows * kLanes;

struct AttnShape {
  int T, H, KVH, D, ldq, ldkv;
  float scale;
};

__device__ __forceinline__ float lanes_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// Loads rows [r0, r0 + kTile) of a (rows ld apart, D wide) matrix into tile (kTile, D); rows at
// or past `rows` are zero.
template <int kTile>
__device__ void load_tile(float* tile, const float* src, size_t ld, int r0, int rows, int D) {
  for (int idx = threadIdx.x; idx < kTile * D; idx += kBlockThreads) {
    const int rr = idx / D, d = idx % D, r = r0 + rr;
    tile[idx] = r < rows ? src[size_t(r) * ld + d] : 0.0f;
  }
}

template <int kPer, int kTile>
__global__ void __launch_bounds__(kBlockThreads)
    attention_fwd_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                         AttnShape a) {
  extern __shared__ float smem[];
  float* Ks = smem;             // (kTile, D)
  float* Vs = smem + kTile * a.D;  // (kTile, D)
  const int b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KVH);
  const int lane = threadIdx.x % kLanes;
  const int t = blockIdx.x * kRows + threadIdx.x / kLanes;
  const bool active = t < a.T;
  const int tq = active ? t : a.T - 1;  // inactive rows compute on a real row, store nothing

  const float* qrow = q + (size_t(b) * a.T + tq) * a.ldq + size_t(h) * a.D;
  float qr[kPer], acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + kLanes * i;
    qr[i] = d < a.D ? qrow[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const float* kb = k + size_t(b) * a.T * a.ldkv + size_t(g) * a.D;
  const float* vb = v + size_t(b) * a.T * a.ldkv + size_t(g) * a.D;
  const int key_end = min(a.T, int(blockIdx.x + 1) * kRows);
  for (int j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_tile<kTile>(Ks, kb, a.ldkv, j0, a.T, a.D);
    load_tile<kTile>(Vs, vb, a.ldkv, j0, a.T, a.D);
    __syncthreads();
    float s[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + kLanes * i;
        if (d < a.D) part = fmaf(qr[i], Ks[jj * a.D + d], part);
      }
      part = lanes_sum(part);
      s[jj] = j0 + jj <= tq ? part * a.scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[jj]);
    }
    // The first tile holds key 0 ≤ t, so m is finite from then on and corr = e^(m − m_new).
    const float m_new = fmaxf(m, tile_max);
    const float corr = expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= corr;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      const float p = expf(s[jj] - m_new);  // masked: e^−∞ = 0
      l += p;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + kLanes * i;
        if (d < a.D) acc[i] = fmaf(p, Vs[jj * a.D + d], acc[i]);
      }
    }
    m = m_new;
  }
  if (!active) return;
  float* orow = out + (size_t(b) * a.T + t) * size_t(a.H) * a.D + size_t(h) * a.D;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + kLanes * i;
    if (d < a.D) orow[d] = acc[i] / l;
  }
  if (lane == 0) lse[(size_t(b) * a.H + h) * a.T + t] = m + logf(l);
}

// delta[b, h, t] = Σ_d dout·out, one warp per (b, t, h) row of the contiguous (B, T, H, D).
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* out, int T,
                                       int H, int D, size_t rows) {
  const int lane = threadIdx.x % 32;
  const size_t warps = size_t(gridDim.x) * (blockDim.x / 32);
  for (size_t r = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) / 32; r < rows; r += warps) {
    const float* o = out + r * D;
    const float* d = dout + r * D;
    float acc = 0.0f;
    for (int c = lane; c < D; c += 32) acc = fmaf(d[c], o[c], acc);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
      const size_t bt = r / H;
      const int h = int(r % H);
      const size_t b = bt / T, t = bt % T;
      delta[(b * H + h) * T + t] = acc;
    }
  }
}

template <int kPer, int kTile>
__global__ void __launch_bounds__(kBlockThreads)
    attention_bwd_dq_kernel(float* dq, const float* dout, const float* lse, const float* delta,
                            const float* q, const float* k, const float* v, AttnShape a) {
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = smem + kTile * a.D;
  const int b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KVH);
  const int lane = threadIdx.x % kLanes;
  const int t = blockIdx.x * kRows + threadIdx.x / kLanes;
  const bool active = t < a.T;
  const int tq = active ? t : a.T - 1;

  const float* qrow = q + (size_t(b) * a.T + tq) * a.ldq + size_t(h) * a.D;
  const float* drow = dout + (size_t(b) * a.T + tq) * size_t(a.H) * a.D + size_t(h) * a.D;
  float qr[kPer], dr[kPer], dqa[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + kLanes * i;
    qr[i] = d < a.D ? qrow[d] : 0.0f;
    dr[i] = d < a.D ? drow[d] : 0.0f;
    dqa[i] = 0.0f;
  }
  const size_t bht = (size_t(b) * a.H + h) * a.T + tq;
  const float lrow = lse[bht], di = delta[bht];
  const float* kb = k + size_t(b) * a.T * a.ldkv + size_t(g) * a.D;
  const float* vb = v + size_t(b) * a.T * a.ldkv + size_t(g) * a.D;
  const int key_end = min(a.T, int(blockIdx.x + 1) * kRows);
  for (int j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();
    load_tile<kTile>(Ks, kb, a.ldkv, j0, a.T, a.D);
    load_tile<kTile>(Vs, vb, a.ldkv, j0, a.T, a.D);
    __syncthreads();
#pragma unroll 2
    for (int jj = 0; jj < kTile; ++jj) {
      float sdot = 0.0f, dp = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + kLanes * i;
        if (d < a.D) {
          sdot = fmaf(qr[i], Ks[jj * a.D + d], sdot);
          dp = fmaf(dr[i], Vs[jj * a.D + d], dp);
        }
      }
      sdot = lanes_sum(sdot);
      dp = lanes_sum(dp);
      const float p = j0 + jj <= tq ? expf(sdot * a.scale - lrow) : 0.0f;
      const float ds = p * (dp - di);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = lane + kLanes * i;
        if (d < a.D) dqa[i] = fmaf(ds, Ks[jj * a.D + d], dqa[i]);
      }
    }
  }
  if (!active) return;
  float* out = dq + (size_t(b) * a.T + t) * a.ldq + size_t(h) * a.D;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + kLanes * i;
    if (d < a.D) out[d] = dqa[i] * a.scale;
  }
}

template <int kPer, int kTile>
__global__ void __launch_bounds__(kBlockThreads)
    attention_bwd_dkdv_kernel(float* dk, float* dv, const float* dout, const float* lse,
                              const float* delta, const float* q, const float* k, const float* v,
                              AttnShape a) {
  extern __shared__ float smem[];
  float* Qs = smem;                   // (kTile, D) queries
  float* Os = smem + kTile * a.D;     // (kTile, D) dout
  float* Ls = Os + kTile * a.D;       // (kTile) lse
  float* Ds = Ls + kTile;             // (kTile) delta
  const int b = blockIdx.z, g = blockIdx.y, group = a.H / a.KVH;
  const int lane = threadIdx.x % kLanes;
  const int j = blockIdx.x * kRows + threadIdx.x / kLanes;
  const bool active = j < a.T;
  const int jk = active ? j : a.T - 1;

  const size_t kv_off = (size_t(b) * a.T + jk) * a.ldkv + size_t(g) * a.D;
  float kr[kPer], vr[kPer], dka[kPer], dva[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + kLanes * i;
    kr[i] = d < a.D ? k[kv_off + d] : 0.0f;
    vr[i] = d < a.D ? v[kv_off + d] : 0.0f;
    dka[i] = 0.0f;
    dva[i] = 0.0f;
  }
  const int t_begin = blockIdx.x * kRows;  // earlier queries see none of this block's keys
  const size_t ldo = size_t(a.H) * a.D;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* qh = q + size_t(b) * a.T * a.ldq + size_t(h) * a.D;
    const float* oh = dout + size_t(b) * a.T * ldo + size_t(h) * a.D;
    const float* lh = lse + (size_t(b) * a.H + h) * a.T;
    const float* dh = delta + (size_t(b) * a.H + h) * a.T;
    for (int t0 = t_begin; t0 < a.T; t0 += kTile) {
      __syncthreads();
      load_tile<kTile>(Qs, qh, a.ldq, t0, a.T, a.D);
      load_tile<kTile>(Os, oh, ldo, t0, a.T, a.D);
      for (int tt = threadIdx.x; tt < kTile; tt += kBlockThreads) {
        const bool in = t0 + tt < a.T;
        Ls[tt] = in ? lh[t0 + tt] : 0.0f;
        Ds[tt] = in ? dh[t0 + tt] : 0.0f;
      }
      __syncthreads();
#pragma unroll 2
      for (int tt = 0; tt < kTile; ++tt) {
        float sdot = 0.0f, dp = 0.0f;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int d = lane + kLanes * i;
          if (d < a.D) {
            sdot = fmaf(Qs[tt * a.D + d], kr[i], sdot);
            dp = fmaf(Os[tt * a.D + d], vr[i], dp);
          }
        }
        sdot = lanes_sum(sdot);
        dp = lanes_sum(dp);
        const int t = t0 + tt;
        const float p = (t < a.T && jk <= t) ? expf(sdot * a.scale - Ls[tt]) : 0.0f;
        const float ds = p * (dp - Ds[tt]);
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int d = lane + kLanes * i;
          if (d < a.D) {
            dva[i] = fmaf(p, Os[tt * a.D + d], dva[i]);
            dka[i] = fmaf(ds, Qs[tt * a.D + d], dka[i]);
          }
        }
      }
    }
  }
  if (!active) return;
  const size_t off = (size_t(b) * a.T + j) * a.ldkv + size_t(g) * a.D;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + kLanes * i;
    if (d < a.D) {
      dk[off + d] = dka[i] * a.scale;
      dv[off + d] = dva[i];
    }
  }
}

template <int kPer>
constexpr int bwd_tile() {
  return kPer >= 64 ? 16 : 32;
}
constexpr int kFwdTile = 16;

template <int kPer>
void fwd(CudaStream& s, float* out, float* lse, const float* q, const float* k, const float* v,
         int B, const AttnShape& a) {
  const dim3 grid(unsigned((a.T + kRows - 1) / kRows), unsigned(a.H), unsigned(B));
  const size_t smem = size_t(2) * kFwdTile * a.D * sizeof(float);
  attention_fwd_kernel<kPer, kFwdTile><<<grid, kBlockThreads, smem, native(s)>>>(out, lse, q, k, v, a);
  STRATA_CUDA_LAUNCH_CHECK();
}

template <int kPer>
void bwd(CudaStream& s, float* dq, float* dk, float* dv, const float* dout, const float* lse,
         const float* delta, const float* q, const float* k, const float* v, int B,
         const AttnShape& a) {
  constexpr int kTile = bwd_tile<kPer>();
  const unsigned blocks = unsigned((a.T + kRows - 1) / kRows);
  const size_t smem_dq = size_t(2) * kTile * a.D * sizeof(float);
  attention_bwd_dq_kernel<kPer, kTile><<<dim3(blocks, unsigned(a.H), unsigned(B)), kBlockThreads,
                                         smem_dq, native(s)>>>(dq, dout, lse, delta, q, k, v, a);
  STRATA_CUDA_LAUNCH_CHECK();
  const size_t smem_kv = (size_t(2) * kTile * a.D + 2 * kTile) * sizeof(float);
  attention_bwd_dkdv_kernel<kPer, kTile><<<dim3(blocks, unsigned(a.KVH), unsigned(B)), kBlockThreads,
                                           smem_kv, native(s)>>>(dk, dv, dout, lse, delta, q, k, v, a);
  STRATA_CUDA_LAUNCH_CHECK();
}

AttnShape shape_of(int T, int H, int KVH, int D, int ldq, int ldkv) {
  // The reference's 1/sqrt(D) in double, rounded once.
  return AttnShape{T, H, KVH, D, ldq, ldkv, float(1.0 / std::sqrt(double(D)))};
}

void check_head_dim(int D) {
  if (D > kMaxAttentionHeadDim)
    fail("cuda::attention", str("head dim D=", D, " is larger than the CUDA kernels support (",
                                kMaxAttentionHeadDim, ")"),
         "use a model with dim / n_heads <= 256, or train.device = cpu");
}

}  // namespace

void launch_attention_fwd(CudaStream& s, float* out, float* lse, const float* q, const float* k,
                          const float* v, int B, int T, int H, int KVH, int D, int ldq, int ldkv) {
  if (B == 0 || T == 0) return;
  check_head_dim(D);
  const AttnShape a = shape_of(T, H, KVH, D, ldq, ldkv);
  if (D <= 32) fwd<8>(s, out, lse, q, k, v, B, a);
  else if (D <= 64) fwd<16>(s, out, lse, q, k, v, B, a);
  else if (D <= 128) fwd<32>(s, out, lse, q, k, v, B, a);
  else fwd<64>(s, out, lse, q, k, v, B, a);
}

void launch_attention_bwd(CudaStream& s, float* dq, float* dk, float* dv, const float* dout,
                          const float* out, const float* lse, const float* q, const float* k,
                          const float* v, int B, int T, int H, int KVH, int D, int ldq, int ldkv) {
  if (B == 0 || T == 0) return;
  check_head_dim(D);
  const AttnShape a = shape_of(T, H, KVH, D, ldq, ldkv);
  const size_t rows = size_t(B) * T * H;
  float* delta = static_cast<float*>(s.scratch(rows * sizeof(float)));
  attention_delta_kernel<<<grid_for(rows * 32), kThreads, 0, native(s)>>>(delta, dout, out, T, H, D, rows);
  STRATA_CUDA_LAUNCH_CHECK();
  if (D <= 32) bwd<8>(s, dq, dk, dv, dout, lse, delta, q, k, v, B, a);
  else if (D <= 64) bwd<16>(s, dq, dk, dv, dout, lse, delta, q, k, v, B, a);
  else if (D <= 128) bwd<32>(s, dq, dk, dv, dout, lse, delta, q, k, v, B, a);
  else bwd<64>(s, dq, dk, dv, dout, lse, delta, q, k, v, B, a);
}

}  // namespace strata::cuda
