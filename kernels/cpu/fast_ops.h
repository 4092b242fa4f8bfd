// kernels/cpu/fast_ops.h — the fast f32 CPU ops: oneTBB across rows / heads / blocks, loops that
// auto-vectorize (built with -march=native -O3 -fopenmp-simd), GEMMs through blas.h.
//
// Same arguments and semantics as kernels/ops.h (minus the Stream) and the reference in
// ref_ops.h, which they are tested against. Deterministic: every result depends only on the
// inputs and shapes, never on the thread count or on scheduling (reductions use partitions fixed
// by the shape and are combined in a fixed order), so two runs give identical bits.
// They allocate no device memory; scratch is per-thread host memory that grows and is reused.
// Files: fast_ops.cpp (embedding, elementwise, casts, sums), fast_norm.cpp (RMSNorm),
// fast_linear.cpp, fast_rope.cpp, fast_attention.cpp, fast_mlp.cpp (SwiGLU),
// fast_loss.cpp (cross-entropy).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::cpu::fast {

void embedding_fwd(float* out, const int32_t* tokens, const float* wte, int N, int C, int V);
void embedding_bwd(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int V);

void embedding_part_fwd(float* out, const int32_t* tokens, const float* wte_part, int N, int C,
                        int V, int row_begin, int rows);
void embedding_part_bwd(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                        int V, int row_begin, int rows);

void rmsnorm_fwd(float* out, float* rstd, const float* x, const float* w, int N, int C, float eps);
void rmsnorm_bwd(float* dx, float* dw, const float* dout, const float* x, const float* w,
                 const float* rstd, int N, int C);

void linear_fwd(float* out, const float* in, const float* w, int N, int IC, int OC);
void linear_bwd(float* din, float* dw, const float* dout, const float* in, const float* w, int N,
                int IC, int OC);

void rope_fwd(float* x, const float* cos, const float* sin, int B, int T, int n_heads, int D,
              int ld);
void rope_bwd(float* dx, const float* cos, const float* sin, int B, int T, int n_heads, int D,
              int ld);

void attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, int B,
                   int T, int H, int KVH, int D, int ldq, int ldkv);
void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* out,
                   const float* lse, const float* q, const float* k, const float* v, int B, int T,
                   int H, int KVH, int D, int ldq, int ldkv);

void swiglu_fwd(float* out, const float* gate, const float* up, int N, int F, int ld);
void swiglu_bwd(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                int N, int F, int ld);

void cross_entropy_fwd(float* losses, const float* logits, const int32_t* targets, int N, int V);
void cross_entropy_bwd(float* dlogits, const float* logits, const int32_t* targets, float dloss,
                       int N, int V);

void cross_entropy_part_fwd(float* stats, const float* logits, const int32_t* targets, int N,
                            int Vp, int col_begin, int V);
void cross_entropy_combine(float* losses, float* lse, const float* stats_all,
                           const int32_t* targets, int N, int P);
void cross_entropy_part_bwd(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int Vp, int col_begin,
                            int V);

void add(float* out, const float* a, const float* b, size_t n);
// bytes of zeros at dst, written by oneTBB's threads in 1 MiB pieces (a gradient shard of a
// billion-parameter model is 4 GB: one thread's memset took ~0.5 s of every step).
void fill_zero(void* dst, size_t bytes);
void scale(float* x, float alpha, size_t n);
void cast_f32_to_bf16(uint16_t* out, const float* in, size_t n);
void cast_bf16_to_f32(float* out, const uint16_t* in, size_t n);
void round_to_bf16(float* out, const float* in, size_t n);
void sum(double* out, const float* x, size_t n);
void sum_squares(double* out, const float* x, size_t n);

}  // namespace strata::cpu::fast
