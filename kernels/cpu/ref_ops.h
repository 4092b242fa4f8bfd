// kernels/cpu/ref_ops.h — the scalar reference of every op in kernels/ops.h: the oracle of all
// tests, kept forever.
//
// Same arguments in the same order as the Ops methods, minus the Stream, templated on the real
// type (instantiated for float and double: double serves the finite-difference checks). Token and
// target arrays stay int32_t; the bf16 casts are not templated. Plain loops, the most obvious
// correct code; every sum is accumulated in double so that ref<float> is itself accurate. It is
// deliberately slow (single-threaded, no SIMD, no BLAS) and not compiled with -march=native.
// Bad shapes and out-of-range tokens throw strata::Error.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::cpu::ref {

// out (N, C) = wte[tokens[n]]; wte (V, C).
template <class Real>
void embedding_fwd(Real* out, const int32_t* tokens, const Real* wte, int N, int C, int V);
// dwte (V, C) += scatter of dout (N, C) by tokens.
template <class Real>
void embedding_bwd(Real* dwte, const Real* dout, const int32_t* tokens, int N, int C, int V);

// Vocabulary-parallel parts: wte_part holds rows [row_begin, row_begin + rows) of (V, C).
template <class Real>
void embedding_part_fwd(Real* out, const int32_t* tokens, const Real* wte_part, int N, int C, int V,
                        int row_begin, int rows);
template <class Real>
void embedding_part_bwd(Real* dwte_part, const Real* dout, const int32_t* tokens, int N, int C,
                        int V, int row_begin, int rows);

// rstd[n] = 1 / sqrt(mean_c x[n,c]^2 + eps); out[n,c] = (x[n,c] * rstd[n]) * w[c].
template <class Real>
void rmsnorm_fwd(Real* out, Real* rstd, const Real* x, const Real* w, int N, int C, Real eps);
// With y = x·r, out = y·w:  dw[c] += Σ_n dout·y;
// dx[n,c] += r·(w[c]·dout[n,c] − y[n,c]·mean_c'(w[c']·dout[n,c']·y[n,c'])).
template <class Real>
void rmsnorm_bwd(Real* dx, Real* dw, const Real* dout, const Real* x, const Real* w,
                 const Real* rstd, int N, int C);

// out (N, OC) = in (N, IC) · w^T; w (OC, IC).
template <class Real>
void linear_fwd(Real* out, const Real* in, const Real* w, int N, int IC, int OC);
// din (N, IC) = dout · w (skipped when din is null); dw (OC, IC) += dout^T · in.
template <class Real>
void linear_bwd(Real* din, Real* dw, const Real* dout, const Real* in, const Real* w, int N, int IC,
                int OC);

// rotate_half rotary embedding in place, t = row % T, with c = cos[t, i], s = sin[t, i] from
// the (T, D/2) tables of rope_tables(): x[i] = a c − b s, x[i + D/2] = b c + a s (a = x[i],
// b = x[i + D/2]); backward rotates by −s. In double, one rounding.
template <class Real>
void rope_fwd(Real* x, const Real* cos, const Real* sin, int B, int T, int n_heads, int D, int ld);
template <class Real>
void rope_bwd(Real* dx, const Real* cos, const Real* sin, int B, int T, int n_heads, int D, int ld);

// Causal grouped-query attention; see kernels/ops.h for the layouts.
//   s_j = (q_t · k_j) / sqrt(D) for j ≤ t;  lse_t = log Σ_j exp(s_j);  p_j = exp(s_j − lse_t);
//   out_t = Σ_j p_j v_j.
template <class Real>
void attention_fwd(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, int B, int T,
                   int H, int KVH, int D, int ldq, int ldkv);
//   dv_j += p_j dout_t;  dp_j = dout_t · v_j;  ds_j = p_j (dp_j − Σ_j' p_j' dp_j');
//   dq_t = Σ_j ds_j k_j / sqrt(D);  dk_j += ds_j q_t / sqrt(D).
template <class Real>
void attention_bwd(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* out, const Real* lse,
                   const Real* q, const Real* k, const Real* v, int B, int T, int H, int KVH, int D,
                   int ldq, int ldkv);

// out = silu(gate) · up, silu(g) = g / (1 + exp(-g)).
template <class Real>
void swiglu_fwd(Real* out, const Real* gate, const Real* up, int N, int F, int ld);
// With s = sigmoid(g): dgate = dout · up · s · (1 + g (1 − s)); dup = dout · g · s.
template <class Real>
void swiglu_bwd(Real* dgate, Real* dup, const Real* dout, const Real* gate, const Real* up, int N,
                int F, int ld);

// losses[n] = logsumexp(logits[n]) − logits[n, target[n]]; negative target: 0.
template <class Real>
void cross_entropy_fwd(Real* losses, const Real* logits, const int32_t* targets, int N, int V);
// dlogits = (softmax(logits) − onehot(target)) · dloss; negative target: zero row; in place ok.
template <class Real>
void cross_entropy_bwd(Real* dlogits, const Real* logits, const int32_t* targets, Real dloss, int N,
                       int V);

// Vocabulary-parallel cross-entropy (kernels/ops.h states the three steps).
template <class Real>
void cross_entropy_part_fwd(Real* stats, const Real* logits, const int32_t* targets, int N, int Vp,
                            int col_begin, int V);
template <class Real>
void cross_entropy_combine(Real* losses, Real* lse, const Real* stats_all, const int32_t* targets,
                           int N, int P);
template <class Real>
void cross_entropy_part_bwd(Real* dlogits, const Real* logits, const Real* lse,
                            const int32_t* targets, Real dloss, int N, int Vp, int col_begin, int V);

template <class Real>
void add(Real* out, const Real* a, const Real* b, size_t n);
template <class Real>
void scale(Real* x, Real alpha, size_t n);
template <class Real>
void sum(double* out, const Real* x, size_t n);
template <class Real>
void sum_squares(double* out, const Real* x, size_t n);

void cast_f32_to_bf16(uint16_t* out, const float* in, size_t n);
void cast_bf16_to_f32(float* out, const uint16_t* in, size_t n);
void round_to_bf16(float* out, const float* in, size_t n);

}  // namespace strata::cpu::ref
