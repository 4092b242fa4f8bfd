// kernels/cpu/fast_attention.cpp — fast causal grouped-query attention on BLAS.
//
// Forward: one task per (batch, head, block of kAttnRowBlock query rows). A block of rows
// [i0, i1) sees keys [0, i1): S = Q·K^T·scale (sgemm), causal mask and softmax row by row (max
// subtracted; lse = max + log Σ exp saved), out = P·V (sgemm). Only the diagonal block computes
// scores that the mask then discards, so the work is about half of the full square.
// Backward: one task per (batch, kv head), which owns that head's dK and dV, so the grouped
// query heads that accumulate into them never race. P is recomputed from lse, and per block
//   dV += P^T·dO,  dP = dO·V^T,  dS = P∘(dP − rowsum(dO∘O))·scale,  dQ = dS·K,  dK += dS^T·Q.
// Scratch is per thread and reused; no GEMM here spawns threads (blas::gemm_serial).
#include <cmath>
#include <cstring>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/fast_common.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::fast {
namespace {

// Query rows per block: fills the BLAS micro-kernels and keeps P (64 × T floats) in L2 for T
// up to a few thousand. (32 and 128 measured the same within noise at T = 256, D = 64.)
constexpr int kAttnRowBlock = 64;

ThreadScratch g_fwd_scratch;
ThreadScratch g_bwd_scratch;

// Where one (batch, query head) or (batch, kv head) slice starts; all row strides as in ops.h.
struct AttnShape {
  int B, T, H, KVH, D, ldq, ldkv;
  int64_t ldo() const { return int64_t(H) * D; }  // out, dout: contiguous (B, T, H, D)
  int group() const { return H / KVH; }
};

// Rows [i0, i0 + rows) of one (batch b, head h): S = Q·K^T·scale over keys [0, i0 + rows),
// masked softmax in place (S becomes P) with lse saved, then O = P·V.
void forward_block(const AttnShape& a, float* out, float* lse, const float* q, const float* k,
                   const float* v, int b, int h, int i0, float scale) {
  const int g = h / a.group();
  const int rows = std::min(a.T, i0 + kAttnRowBlock) - i0, cols = i0 + rows;
  const float* Q = q + (int64_t(b) * a.T + i0) * a.ldq + int64_t(h) * a.D;  // (rows, D)
  const float* K = k + int64_t(b) * a.T * a.ldkv + int64_t(g) * a.D;        // (cols, D)
  const float* V = v + int64_t(b) * a.T * a.ldkv + int64_t(g) * a.D;        // (cols, D)
  float* O = out + (int64_t(b) * a.T + i0) * a.ldo() + int64_t(h) * a.D;    // (rows, D)
  float* L = lse + (int64_t(b) * a.H + h) * a.T + i0;                       // (rows)
  float* S = scratch(g_fwd_scratch, size_t(rows) * cols);                   // (rows, cols)
  blas::gemm_serial(false, true, rows, cols, a.D, scale, Q, a.ldq, K, a.ldkv, 0.0f, S, cols);
  for (int r = 0; r < rows; ++r) {
    float* __restrict s = S + int64_t(r) * cols;
    const int valid = i0 + r + 1;  // query i0 + r sees keys 0 .. i0 + r
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < valid; ++j) m = std::max(m, s[j]);
    float z = 0.0f;
#pragma omp simd reduction(+ : z)
    for (int j = 0; j < valid; ++j) {
      const float e = exp_fast(s[j] - m);
      s[j] = e;
      z += e;
    }
    const float inv = 1.0f / z;
#pragma omp simd
    for (int j = 0; j < valid; ++j) s[j] *= inv;
    for (int j = valid; j < cols; ++j) s[j] = 0.0f;
    L[r] = m + std::log(z);
  }
  blas::gemm_serial(false, false, rows, a.D, cols, 1.0f, S, cols, V, a.ldkv, 0.0f, O, int(a.ldo()));
}

// Everything of one (batch b, kv head g): zero its dK, dV, then for each query head of the
// group and each block of query rows accumulate dK, dV and write dQ.
void backward_kv_head(const AttnShape& a, float* dq, float* dk, float* dv, const float* dout,
                      const float* out, const float* lse, const float* q, const float* k,
                      const float* v, int b, int g, float scale) {
  const int64_t ldo = a.ldo();
  const float* K = k + int64_t(b) * a.T * a.ldkv + int64_t(g) * a.D;  // (T, D)
  const float* V = v + int64_t(b) * a.T * a.ldkv + int64_t(g) * a.D;  // (T, D)
  float* dK = dk + int64_t(b) * a.T * a.ldkv + int64_t(g) * a.D;      // (T, D), owned here
  float* dV = dv + int64_t(b) * a.T * a.ldkv + int64_t(g) * a.D;      // (T, D), owned here
  for (int t = 0; t < a.T; ++t) {
    std::memset(dK + int64_t(t) * a.ldkv, 0, sizeof(float) * size_t(a.D));
    std::memset(dV + int64_t(t) * a.ldkv, 0, sizeof(float) * size_t(a.D));
  }
  const size_t block_floats = size_t(kAttnRowBlock) * a.T;
  float* P = scratch(g_bwd_scratch, 2 * block_floats);  // (rows, cols) probabilities
  float* dS = P + block_floats;                         // (rows, cols) dP, then dS
  for (int h = g * a.group(); h < (g + 1) * a.group(); ++h) {
    for (int i0 = 0; i0 < a.T; i0 += kAttnRowBlock) {
      const int rows = std::min(a.T, i0 + kAttnRowBlock) - i0, cols = i0 + rows;
      const int64_t row0 = int64_t(b) * a.T + i0;
      const float* Q = q + row0 * a.ldq + int64_t(h) * a.D;    // (rows, D)
      const float* dO = dout + row0 * ldo + int64_t(h) * a.D;  // (rows, D)
      const float* O = out + row0 * ldo + int64_t(h) * a.D;    // (rows, D)
      float* dQ = dq + row0 * a.ldq + int64_t(h) * a.D;        // (rows, D)
      const float* L = lse + (int64_t(b) * a.H + h) * a.T + i0;
      // P = exp(Q·K^T·scale − lse), masked.
      blas::gemm_serial(false, true, rows, cols, a.D, scale, Q, a.ldq, K, a.ldkv, 0.0f, P, cols);
      for (int r = 0; r < rows; ++r) {
        float* __restrict p = P + int64_t(r) * cols;
        const int valid = i0 + r + 1;
        const float l = L[r];
#pragma omp simd
        for (int j = 0; j < valid; ++j) p[j] = exp_fast(p[j] - l);
        for (int j = valid; j < cols; ++j) p[j] = 0.0f;
      }
      // dV[0:cols] += P^T·dO;  dP = dO·V^T.
      blas::gemm_serial(true, false, cols, a.D, rows, 1.0f, P, cols, dO, int(ldo), 1.0f, dV,
                        a.ldkv);
      blas::gemm_serial(false, true, rows, cols, a.D, 1.0f, dO, int(ldo), V, a.ldkv, 0.0f, dS,
                        cols);
      // dS = P∘(dP − Σ_d dO∘O)·scale (masked entries stay 0 because P is 0 there).
      for (int r = 0; r < rows; ++r) {
        const float* __restrict o = O + int64_t(r) * ldo;
        const float* __restrict d = dO + int64_t(r) * ldo;
        float di = 0.0f;
#pragma omp simd reduction(+ : di)
        for (int c = 0; c < a.D; ++c) di += d[c] * o[c];
        const float* __restrict p = P + int64_t(r) * cols;
        float* __restrict ds = dS + int64_t(r) * cols;
#pragma omp simd
        for (int j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - di) * scale;
      }
      // dQ = dS·K (written);  dK[0:cols] += dS^T·Q.
      blas::gemm_serial(false, false, rows, a.D, cols, 1.0f, dS, cols, K, a.ldkv, 0.0f, dQ, a.ldq);
      blas::gemm_serial(true, false, cols, a.D, rows, 1.0f, dS, cols, Q, a.ldq, 1.0f, dK, a.ldkv);
    }
  }
}

}  // namespace

void attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int B,
                   int T, int H, int KVH, int D, int ldq, int ldkv) {
  check_attention("attention_fwd", B, T, H, KVH, D, ldq, ldkv);
  if (B == 0 || T == 0) return;
  blas::init_single_threaded();
  const AttnShape a{B, T, H, KVH, D, ldq, ldkv};
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t nblk = (T + kAttnRowBlock - 1) / kAttnRowBlock;
  parallel_chunks(int64_t(B) * H * nblk, 1, [&](int64_t task, int64_t, int64_t) {
    const int blk = int(task % nblk), h = int(task / nblk % H), b = int(task / nblk / H);
    forward_block(a, out, lse, q, k, v, b, h, blk * kAttnRowBlock, scale);
  });
}

void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* out,
                   const float* lse, const float* q, const float* k, const float* v, int B, int T,
                   int H, int KVH, int D, int ldq, int ldkv) {
  check_attention("attention_bwd", B, T, H, KVH, D, ldq, ldkv);
  if (B == 0 || T == 0) return;
  blas::init_single_threaded();
  const AttnShape a{B, T, H, KVH, D, ldq, ldkv};
  const float scale = 1.0f / std::sqrt(float(D));
  parallel_chunks(int64_t(B) * KVH, 1, [&](int64_t task, int64_t, int64_t) {
    backward_kv_head(a, dq, dk, dv, dout, out, lse, q, k, v, int(task / KVH), int(task % KVH),
                     scale);
  });
}

}  // namespace strata::cpu::fast
