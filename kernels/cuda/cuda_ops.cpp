// kernels/cuda/cuda_ops.cpp — the CUDA device's Ops: each launcher checks its arguments as the
// CPU ops do, then enqueues the op's kernels (or cuBLASLt GEMMs) on the stream.
//
// As on the CPU device, an argument error does not throw from the call: it poisons the stream
// and the next synchronize() rethrows it (and later work on the poisoned stream is skipped).
// Bad token and target values are found by the kernels and reported the same way (KernelFault).
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/mlp.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/rope.h"

namespace strata::cuda {
namespace {

constexpr int kMaxGridYZ = 65535;  // CUDA's limit on gridDim.y and gridDim.z

void check_dims(const char* op, int N, int C) {
  if (N < 0 || C < 0) fail(str("cuda::", op), str("negative shape: N=", N, " C=", C));
}

void check_strided(const char* op, int N, int F, int ld) {
  check_dims(op, N, F);
  if (ld < F) fail(str("cuda::", op), str("row stride ld=", ld, " is smaller than the row width ", F));
}

void check_rope(const char* op, const void* cos, const void* sin, int B, int T, int n_heads, int D,
                int ld) {
  if (B < 0 || T < 0 || n_heads < 0 || D < 0)
    fail(str("cuda::", op), str("negative shape: B=", B, " T=", T, " heads=", n_heads, " D=", D));
  if (D % 2 != 0) fail(str("cuda::", op), str("head dim D=", D, " must be even for rotate_half"));
  if (ld < n_heads * D) fail(str("cuda::", op), str("row stride ld=", ld, " < heads*D=", n_heads * D));
  if ((!cos || !sin) && B > 0 && T > 0 && n_heads > 0 && D > 0)
    fail(str("cuda::", op), "the cos/sin tables are null", "build them with rope_tables()");
}

void check_attention(const char* op, int B, int T, int H, int KVH, int D, int ldq, int ldkv) {
  if (B < 0 || T < 0 || H <= 0 || KVH <= 0 || D <= 0)
    fail(str("cuda::", op), str("bad shape: B=", B, " T=", T, " H=", H, " KVH=", KVH, " D=", D));
  if (H % KVH != 0)
    fail(str("cuda::", op), str("query heads H=", H, " not a multiple of kv heads KVH=", KVH));
  if (ldq < H * D) fail(str("cuda::", op), str("ldq=", ldq, " < H*D=", H * D));
  if (ldkv < KVH * D) fail(str("cuda::", op), str("ldkv=", ldkv, " < KVH*D=", KVH * D));
  if (B > kMaxGridYZ || H > kMaxGridYZ)
    fail(str("cuda::", op), str("B=", B, " or H=", H, " exceeds the CUDA grid limit ", kMaxGridYZ));
}

void check_part(const char* op, int V, int begin, int rows) {
  if (V < 0 || begin < 0 || rows < 0 || int64_t(begin) + rows > V)
    fail(str("cuda::", op), str("vocabulary part [", begin, ", ", int64_t(begin) + rows,
                                ") is not inside [0, V=", V, ")"));
}

class CudaOps final : public Ops {
 public:
  explicit CudaOps(bool bf16_matmuls)
      : linear_(bf16_matmuls ? GemmType::f32_bf16 : GemmType::f32) {}

  void embedding_fwd(Stream& s, float* out, const int32_t* tokens, const float* wte, int N, int C,
                     int V) override {
    run(s, "embedding_fwd", [&](CudaStream& cs) {
      check_dims("embedding_fwd", N, C);
      launch_embedding_fwd(cs, out, tokens, wte, N, C, V, 0, V);
    });
  }
  void embedding_bwd(Stream& s, float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                     int V) override {
    run(s, "embedding_bwd", [&](CudaStream& cs) {
      check_dims("embedding_bwd", N, C);
      if (V < 0) fail("cuda::embedding_bwd", str("negative vocabulary V=", V));
      if (C > kMaxGridYZ * 256) fail("cuda::embedding_bwd", str("C=", C, " is too wide"));
      launch_embedding_bwd(cs, dwte, dout, tokens, N, C, V, 0, V);
    });
  }
  void rmsnorm_fwd(Stream& s, float* out, float* rstd, const float* x, const float* w, int N, int C,
                   float eps) override {
    run(s, "rmsnorm_fwd", [&](CudaStream& cs) {
      check_dims("rmsnorm_fwd", N, C);
      launch_rmsnorm_fwd(cs, out, rstd, x, w, N, C, eps);
    });
  }
  void rmsnorm_bwd(Stream& s, float* dx, float* dw, const float* dout, const float* x,
                   const float* w, const float* rstd, int N, int C) override {
    run(s, "rmsnorm_bwd", [&](CudaStream& cs) {
      check_dims("rmsnorm_bwd", N, C);
      if (N > int64_t(kMaxGridYZ) * 256) fail("cuda::rmsnorm_bwd", str("N=", N, " rows is too many"));
      launch_rmsnorm_bwd(cs, dx, dw, dout, x, w, rstd, N, C);
    });
  }
  // out (N, OC) = in (N, IC) · w^T: row-major GEMM m=N, n=OC, k=IC with w transposed.
  void linear_fwd(Stream& s, float* out, const float* in, const float* w, int N, int IC,
                  int OC) override {
    run(s, "linear_fwd", [&](CudaStream& cs) {
      check_dims("linear_fwd", N, IC);
      check_dims("linear_fwd", N, OC);
      gemm(cs, linear_, false, true, N, OC, IC, in, IC, w, IC, 0.0f, out, OC);
    });
  }
  // din (N, IC) = dout (N, OC) · w (OC, IC); dw (OC, IC) += dout^T · in (N, IC).
  void linear_bwd(Stream& s, float* din, float* dw, const float* dout, const float* in,
                  const float* w, int N, int IC, int OC) override {
    run(s, "linear_bwd", [&](CudaStream& cs) {
      check_dims("linear_bwd", N, IC);
      check_dims("linear_bwd", N, OC);
      if (din) gemm(cs, linear_, false, false, N, IC, OC, dout, OC, w, IC, 0.0f, din, IC);
      gemm(cs, linear_, true, false, OC, IC, N, dout, OC, in, IC, 1.0f, dw, IC);
    });
  }
  void rope_fwd(Stream& s, float* x, const float* cos, const float* sin, int B, int T,
                int n_heads, int D, int ld) override {
    run(s, "rope_fwd", [&](CudaStream& cs) {
      check_rope("rope_fwd", cos, sin, B, T, n_heads, D, ld);
      launch_rope(cs, x, cos, sin, B, T, n_heads, D, ld, false);
    });
  }
  void rope_bwd(Stream& s, float* dx, const float* cos, const float* sin, int B, int T,
                int n_heads, int D, int ld) override {
    run(s, "rope_bwd", [&](CudaStream& cs) {
      check_rope("rope_bwd", cos, sin, B, T, n_heads, D, ld);
      launch_rope(cs, dx, cos, sin, B, T, n_heads, D, ld, true);
    });
  }
  void attention_fwd(Stream& s, float* out, float* lse, const float* q, const float* k,
                     const float* v, int B, int T, int H, int KVH, int D, int ldq,
                     int ldkv) override {
    run(s, "attention_fwd", [&](CudaStream& cs) {
      check_attention("attention_fwd", B, T, H, KVH, D, ldq, ldkv);
      launch_attention_fwd(cs, out, lse, q, k, v, B, T, H, KVH, D, ldq, ldkv);
    });
  }
  void attention_bwd(Stream& s, float* dq, float* dk, float* dv, const float* dout,
                     const float* out, const float* lse, const float* q, const float* k,
                     const float* v, int B, int T, int H, int KVH, int D, int ldq,
                     int ldkv) override {
    run(s, "attention_bwd", [&](CudaStream& cs) {
      check_attention("attention_bwd", B, T, H, KVH, D, ldq, ldkv);
      launch_attention_bwd(cs, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH, D, ldq, ldkv);
    });
  }
  void swiglu_fwd(Stream& s, float* out, const float* gate, const float* up, int N, int F,
                  int ld) override {
    run(s, "swiglu_fwd", [&](CudaStream& cs) {
      check_strided("swiglu_fwd", N, F, ld);
      launch_swiglu_fwd(cs, out, gate, up, N, F, ld);
    });
  }
  void swiglu_bwd(Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                  const float* up, int N, int F, int ld) override {
    run(s, "swiglu_bwd", [&](CudaStream& cs) {
      check_strided("swiglu_bwd", N, F, ld);
      launch_swiglu_bwd(cs, dgate, dup, dout, gate, up, N, F, ld);
    });
  }
  void cross_entropy_fwd(Stream& s, float* losses, const float* logits, const int32_t* targets,
                         int N, int V) override {
    run(s, "cross_entropy_fwd", [&](CudaStream& cs) {
      check_dims("cross_entropy_fwd", N, V);
      launch_cross_entropy_fwd(cs, losses, logits, targets, N, V);
    });
  }
  void cross_entropy_bwd(Stream& s, float* dlogits, const float* logits, const int32_t* targets,
                         float dloss, int N, int V) override {
    run(s, "cross_entropy_bwd", [&](CudaStream& cs) {
      check_dims("cross_entropy_bwd", N, V);
      launch_cross_entropy_bwd(cs, dlogits, logits, targets, dloss, N, V);
    });
  }
  void embedding_part_fwd(Stream& s, float* out, const int32_t* tokens, const float* wte_part,
                          int N, int C, int V, int row_begin, int rows) override {
    run(s, "embedding_part_fwd", [&](CudaStream& cs) {
      check_dims("embedding_part_fwd", N, C);
      check_part("embedding_part_fwd", V, row_begin, rows);
      launch_embedding_fwd(cs, out, tokens, wte_part, N, C, V, row_begin, rows);
    });
  }
  void embedding_part_bwd(Stream& s, float* dwte_part, const float* dout, const int32_t* tokens,
                          int N, int C, int V, int row_begin, int rows) override {
    run(s, "embedding_part_bwd", [&](CudaStream& cs) {
      check_dims("embedding_part_bwd", N, C);
      check_part("embedding_part_bwd", V, row_begin, rows);
      if (C > kMaxGridYZ * 256) fail("cuda::embedding_part_bwd", str("C=", C, " is too wide"));
      launch_embedding_bwd(cs, dwte_part, dout, tokens, N, C, V, row_begin, rows);
    });
  }
  void cross_entropy_part_fwd(Stream& s, float* stats, const float* logits,
                              const int32_t* targets, int N, int Vp, int col_begin,
                              int V) override {
    run(s, "cross_entropy_part_fwd", [&](CudaStream& cs) {
      check_dims("cross_entropy_part_fwd", N, Vp);
      check_part("cross_entropy_part_fwd", V, col_begin, Vp);
      launch_cross_entropy_part_fwd(cs, stats, logits, targets, N, Vp, col_begin, V);
    });
  }
  void cross_entropy_combine(Stream& s, float* losses, float* lse, const float* stats_all,
                             const int32_t* targets, int N, int P) override {
    run(s, "cross_entropy_combine", [&](CudaStream& cs) {
      check_dims("cross_entropy_combine", N, P);
      if (P < 1) fail("cuda::cross_entropy_combine", str("P=", P, " parts; at least one is needed"));
      launch_cross_entropy_combine(cs, losses, lse, stats_all, targets, N, P);
    });
  }
  void cross_entropy_part_bwd(Stream& s, float* dlogits, const float* logits, const float* lse,
                              const int32_t* targets, float dloss, int N, int Vp, int col_begin,
                              int V) override {
    run(s, "cross_entropy_part_bwd", [&](CudaStream& cs) {
      check_dims("cross_entropy_part_bwd", N, Vp);
      check_part("cross_entropy_part_bwd", V, col_begin, Vp);
      launch_cross_entropy_part_bwd(cs, dlogits, logits, lse, targets, dloss, N, Vp, col_begin, V);
    });
  }
  void add(Stream& s, float* out, const float* a, const float* b, size_t n) override {
    run(s, "add", [&](CudaStream& cs) { launch_add(cs, out, a, b, n); });
  }
  void scale(Stream& s, float* x, float alpha, size_t n) override {
    run(s, "scale", [&](CudaStream& cs) { launch_scale(cs, x, alpha, n); });
  }
  void cast_f32_to_bf16(Stream& s, uint16_t* out, const float* in, size_t n) override {
    run(s, "cast_f32_to_bf16", [&](CudaStream& cs) { launch_cast_f32_to_bf16(cs, out, in, n); });
  }
  void cast_bf16_to_f32(Stream& s, float* out, const uint16_t* in, size_t n) override {
    run(s, "cast_bf16_to_f32", [&](CudaStream& cs) { launch_cast_bf16_to_f32(cs, out, in, n); });
  }
  void round_to_bf16(Stream& s, float* out, const float* in, size_t n) override {
    run(s, "round_to_bf16", [&](CudaStream& cs) { launch_round_to_bf16(cs, out, in, n); });
  }
  void sum(Stream& s, double* out, const float* x, size_t n) override {
    run(s, "sum", [&](CudaStream& cs) { launch_sum(cs, out, x, n, false); });
  }
  void sum_squares(Stream& s, double* out, const float* x, size_t n) override {
    run(s, "sum_squares", [&](CudaStream& cs) { launch_sum(cs, out, x, n, true); });
  }

 private:
  // Resolves the CUDA stream (a stream of another device is a programming error: it throws at
  // once), skips the op on a poisoned stream, and turns any error of the launch into poison.
  template <class F>
  static void run(Stream& s, const char* op, F&& launch) {
    CudaStream& cs = cuda_stream(s, str("cuda::", op));
    if (cs.poisoned()) return;
    try {
      cs.make_current();
      launch(cs);
    } catch (...) {
      cs.poison(std::current_exception(), str("op ", op));
    }
  }

  const GemmType linear_;  // f32, or f32_bf16 under DeviceOptions::bf16_matmuls
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(bool bf16_matmuls) {
  return std::make_unique<CudaOps>(bf16_matmuls);
}

}  // namespace strata::cuda
