// kernels/ops.h — the op launchers of a device: every forward and backward op of the Llama
// decoder, plus the few elementwise helpers the engine needs.
//
// Each call enqueues one op on `stream` and returns at once; pointers are memory the device
// addresses (device memory, or host memory on the CPU device). Activations and gradients are
// f32; tensors are row-major with their shapes in the comments: N = B·T rows (tokens),
// C = model dim, H / KVH = query / key-value heads, D = head dim, F = ffn dim, V = vocab.
// Conventions for backward ops: parameter gradients (dw) ACCUMULATE (+=); activation gradients
// are WRITTEN (=) unless the comment says they accumulate. Nothing here allocates device
// memory visible to the caller; ops that need scratch keep their own.
// The math of each op is defined by its scalar reference in kernels/cpu/ref_ops.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

class Stream;

class Ops {
 public:
  virtual ~Ops() = default;

  // out (N, C) = wte[tokens[n]]; tokens (N) int32 in [0, V) (a token outside is an Error);
  // wte (V, C).
  virtual void embedding_fwd(Stream& s, float* out, const int32_t* tokens, const float* wte,
                             int N, int C, int V) = 0;
  // dwte (V, C) += scatter of dout (N, C) by tokens.
  virtual void embedding_bwd(Stream& s, float* dwte, const float* dout, const int32_t* tokens,
                             int N, int C, int V) = 0;

  // Vocabulary-parallel embedding (tensor parallelism splits wte by rows): wte_part (rows, C)
  // holds rows [row_begin, row_begin + rows) of the (V, C) table. out (N, C) = the token's row
  // when this part holds it, else 0 (the tp ranks' outputs sum to the full lookup); tokens in
  // [0, V) (a token outside is an Error).
  virtual void embedding_part_fwd(Stream& s, float* out, const int32_t* tokens,
                                  const float* wte_part, int N, int C, int V, int row_begin,
                                  int rows) = 0;
  // dwte_part (rows, C) += dout (N, C) rows whose token this part holds.
  virtual void embedding_part_bwd(Stream& s, float* dwte_part, const float* dout,
                                  const int32_t* tokens, int N, int C, int V, int row_begin,
                                  int rows) = 0;

  // RMSNorm (Hugging Face LlamaRMSNorm): rstd[n] = 1 / sqrt(mean_c(x[n,c]^2) + eps),
  // out[n,c] = (x[n,c] * rstd[n]) * w[c]. x, out (N, C); w (C); rstd (N) saved for backward.
  virtual void rmsnorm_fwd(Stream& s, float* out, float* rstd, const float* x, const float* w,
                           int N, int C, float eps) = 0;
  // dx (N, C) ACCUMULATES (the input also feeds the residual); dw (C) accumulates.
  virtual void rmsnorm_bwd(Stream& s, float* dx, float* dw, const float* dout, const float* x,
                           const float* w, const float* rstd, int N, int C) = 0;

  // out (N, OC) = in (N, IC) · w^T; w (OC, IC) as Hugging Face stores nn.Linear weights.
  virtual void linear_fwd(Stream& s, float* out, const float* in, const float* w, int N, int IC,
                          int OC) = 0;
  // din (N, IC) = dout · w (written; skipped when din is null); dw (OC, IC) += dout^T · in.
  virtual void linear_bwd(Stream& s, float* din, float* dw, const float* dout, const float* in,
                          const float* w, int N, int IC, int OC) = 0;

  // Rotary embedding in Hugging Face's rotate_half convention, in place, position t = row % T:
  // for i < D/2, with a = x[i], b = x[i + D/2], c = cos[t, i], s = sin[t, i]:
  //   x[i] = a c - b s,  x[i + D/2] = b c + a s   (computed in double, rounded once).
  // x holds B·T rows of n_heads heads of D values; consecutive rows are `ld` floats apart.
  // cos, sin (T, D/2) in memory the device addresses: the tables of rope_tables()
  // (kernels/rope_tables.h), which carry the frequencies of every rope type (default, linear,
  // llama3) exactly as transformers computes them.
  virtual void rope_fwd(Stream& s, float* x, const float* cos, const float* sin, int B, int T,
                        int n_heads, int D, int ld) = 0;
  // The transpose (inverse) rotation (s -> -s), applied in place to the gradient.
  virtual void rope_bwd(Stream& s, float* dx, const float* cos, const float* sin, int B, int T,
                        int n_heads, int D, int ld) = 0;

  // Causal scaled-dot-product attention with grouped-query heads (query head h reads kv head
  // h / (H / KVH)), scale 1/sqrt(D). q (B, T, H, D) rows `ldq` apart; k, v (B, T, KVH, D) rows
  // `ldkv` apart; out (B, T, H, D) contiguous; lse (B, H, T) the log-sum-exp of each score row,
  // saved for backward (which recomputes the probabilities from it).
  virtual void attention_fwd(Stream& s, float* out, float* lse, const float* q, const float* k,
                             const float* v, int B, int T, int H, int KVH, int D, int ldq,
                             int ldkv) = 0;
  // dq (rows ldq apart), dk, dv (rows ldkv apart) are written.
  virtual void attention_bwd(Stream& s, float* dq, float* dk, float* dv, const float* dout,
                             const float* out, const float* lse, const float* q, const float* k,
                             const float* v, int B, int T, int H, int KVH, int D, int ldq,
                             int ldkv) = 0;

  // SwiGLU: out (N, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)); gate and up rows are
  // `ld` floats apart (they may be the two halves of one (N, 2F) buffer).
  virtual void swiglu_fwd(Stream& s, float* out, const float* gate, const float* up, int N, int F,
                          int ld) = 0;
  // dgate, dup written with the same row stride `ld`.
  virtual void swiglu_bwd(Stream& s, float* dgate, float* dup, const float* dout,
                          const float* gate, const float* up, int N, int F, int ld) = 0;

  // losses (N) = logsumexp(logits[n]) - logits[n, target[n]]; logits (N, V); a negative target
  // is ignored (loss 0).
  virtual void cross_entropy_fwd(Stream& s, float* losses, const float* logits,
                                 const int32_t* targets, int N, int V) = 0;
  // dlogits (N, V) = (softmax(logits) - onehot(target)) * dloss; rows with a negative target
  // get zero. dlogits may be the same memory as logits (in place).
  virtual void cross_entropy_bwd(Stream& s, float* dlogits, const float* logits,
                                 const int32_t* targets, float dloss, int N, int V) = 0;

  // Vocabulary-parallel cross-entropy (Megatron's layout: no rank holds a full logits row).
  // logits (N, Vp) are columns [col_begin, col_begin + Vp) of the full (N, V) logits.
  // 1. stats (N, 2) = { logsumexp over this part's row, the target's logit when this part
  //    holds its column else 0 }; targets < V (negative: ignored, stats {0, 0}).
  virtual void cross_entropy_part_fwd(Stream& s, float* stats, const float* logits,
                                      const int32_t* targets, int N, int Vp, int col_begin,
                                      int V) = 0;
  // 2. stats_all (P, N, 2): every part's stats in part order (an all-gather of step 1).
  //    lse (N) = log Σ_p exp(stats_all[p, n, 0]) (computed in double from the largest);
  //    losses (N) = lse − Σ_p stats_all[p, n, 1]; negative target: loss 0, lse 0.
  virtual void cross_entropy_combine(Stream& s, float* losses, float* lse,
                                     const float* stats_all, const int32_t* targets, int N,
                                     int P) = 0;
  // 3. dlogits (N, Vp) = (exp(logits − lse) − onehot(target)) · dloss over this part's
  //    columns; negative target: zero row; in place allowed.
  virtual void cross_entropy_part_bwd(Stream& s, float* dlogits, const float* logits,
                                      const float* lse, const int32_t* targets, float dloss,
                                      int N, int Vp, int col_begin, int V) = 0;

  // out (n) = a + b; out may alias a or b.
  virtual void add(Stream& s, float* out, const float* a, const float* b, size_t n) = 0;
  // x (n) *= alpha.
  virtual void scale(Stream& s, float* x, float alpha, size_t n) = 0;
  // Round to nearest even / widen.
  virtual void cast_f32_to_bf16(Stream& s, uint16_t* out, const float* in, size_t n) = 0;
  virtual void cast_bf16_to_f32(Stream& s, float* out, const uint16_t* in, size_t n) = 0;
  // out (n) = in rounded to bf16 (nearest even) and widened back: the two casts in one pass, no
  // bf16 buffer between. out may alias in.
  virtual void round_to_bf16(Stream& s, float* out, const float* in, size_t n) = 0;
  // *out (one double in device memory) = sum of x (n), accumulated in double.
  virtual void sum(Stream& s, double* out, const float* x, size_t n) = 0;
  // *out (one double in device memory) = sum of x^2 (n), accumulated in double.
  virtual void sum_squares(Stream& s, double* out, const float* x, size_t n) = 0;
};

}  // namespace strata
