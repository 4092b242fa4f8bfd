// kernels/cpu/cpu_ops.cpp — the CPU device's Ops: every launcher enqueues one host task on the
// stream that runs the fast path (fast_ops.h) or the scalar reference (ref_ops.h<float>).
//
// A host task runs later, on the stream's worker thread, so the task captures the arguments by
// value (pointers and sizes), never references to the caller's variables. Argument errors are
// thrown inside the task: they poison the stream and the next synchronize() rethrows them.
#include "kernels/cpu/cpu_ops.h"

#include <type_traits>

#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/ref_ops.h"
#include "kernels/device.h"

namespace strata {
namespace {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(CpuOpsMode mode) : reference_(mode == CpuOpsMode::reference) {}

  void embedding_fwd(Stream& s, float* out, const int32_t* tokens, const float* wte, int N, int C,
                     int V) override {
    launch(s, "embedding_fwd", cpu::fast::embedding_fwd, cpu::ref::embedding_fwd<float>, out,
           tokens, wte, N, C, V);
  }
  void embedding_bwd(Stream& s, float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                     int V) override {
    launch(s, "embedding_bwd", cpu::fast::embedding_bwd, cpu::ref::embedding_bwd<float>, dwte, dout,
           tokens, N, C, V);
  }
  void embedding_part_fwd(Stream& s, float* out, const int32_t* tokens, const float* wte_part,
                          int N, int C, int V, int row_begin, int rows) override {
    launch(s, "embedding_part_fwd", cpu::fast::embedding_part_fwd,
           cpu::ref::embedding_part_fwd<float>, out, tokens, wte_part, N, C, V, row_begin, rows);
  }
  void embedding_part_bwd(Stream& s, float* dwte_part, const float* dout, const int32_t* tokens,
                          int N, int C, int V, int row_begin, int rows) override {
    launch(s, "embedding_part_bwd", cpu::fast::embedding_part_bwd,
           cpu::ref::embedding_part_bwd<float>, dwte_part, dout, tokens, N, C, V, row_begin, rows);
  }
  void rmsnorm_fwd(Stream& s, float* out, float* rstd, const float* x, const float* w, int N, int C,
                   float eps) override {
    launch(s, "rmsnorm_fwd", cpu::fast::rmsnorm_fwd, cpu::ref::rmsnorm_fwd<float>, out, rstd, x, w,
           N, C, eps);
  }
  void rmsnorm_bwd(Stream& s, float* dx, float* dw, const float* dout, const float* x,
                   const float* w, const float* rstd, int N, int C) override {
    launch(s, "rmsnorm_bwd", cpu::fast::rmsnorm_bwd, cpu::ref::rmsnorm_bwd<float>, dx, dw, dout, x,
           w, rstd, N, C);
  }
  void linear_fwd(Stream& s, float* out, const float* in, const float* w, int N, int IC,
                  int OC) override {
    launch(s, "linear_fwd", cpu::fast::linear_fwd, cpu::ref::linear_fwd<float>, out, in, w, N, IC,
           OC);
  }
  void linear_bwd(Stream& s, float* din, float* dw, const float* dout, const float* in,
                  const float* w, int N, int IC, int OC) override {
    launch(s, "linear_bwd", cpu::fast::linear_bwd, cpu::ref::linear_bwd<float>, din, dw, dout, in,
           w, N, IC, OC);
  }
  void rope_fwd(Stream& s, float* x, const float* cos, const float* sin, int B, int T,
                int n_heads, int D, int ld) override {
    launch(s, "rope_fwd", cpu::fast::rope_fwd, cpu::ref::rope_fwd<float>, x, cos, sin, B, T,
           n_heads, D, ld);
  }
  void rope_bwd(Stream& s, float* dx, const float* cos, const float* sin, int B, int T,
                int n_heads, int D, int ld) override {
    launch(s, "rope_bwd", cpu::fast::rope_bwd, cpu::ref::rope_bwd<float>, dx, cos, sin, B, T,
           n_heads, D, ld);
  }
  void attention_fwd(Stream& s, float* out, float* lse, const float* q, const float* k,
                     const float* v, int B, int T, int H, int KVH, int D, int ldq,
                     int ldkv) override {
    launch(s, "attention_fwd", cpu::fast::attention_fwd, cpu::ref::attention_fwd<float>, out, lse,
           q, k, v, B, T, H, KVH, D, ldq, ldkv);
  }
  void attention_bwd(Stream& s, float* dq, float* dk, float* dv, const float* dout,
                     const float* out, const float* lse, const float* q, const float* k,
                     const float* v, int B, int T, int H, int KVH, int D, int ldq,
                     int ldkv) override {
    launch(s, "attention_bwd", cpu::fast::attention_bwd, cpu::ref::attention_bwd<float>, dq, dk, dv,
           dout, out, lse, q, k, v, B, T, H, KVH, D, ldq, ldkv);
  }
  void swiglu_fwd(Stream& s, float* out, const float* gate, const float* up, int N, int F,
                  int ld) override {
    launch(s, "swiglu_fwd", cpu::fast::swiglu_fwd, cpu::ref::swiglu_fwd<float>, out, gate, up, N, F,
           ld);
  }
  void swiglu_bwd(Stream& s, float* dgate, float* dup, const float* dout, const float* gate,
                  const float* up, int N, int F, int ld) override {
    launch(s, "swiglu_bwd", cpu::fast::swiglu_bwd, cpu::ref::swiglu_bwd<float>, dgate, dup, dout,
           gate, up, N, F, ld);
  }
  void cross_entropy_fwd(Stream& s, float* losses, const float* logits, const int32_t* targets,
                         int N, int V) override {
    launch(s, "cross_entropy_fwd", cpu::fast::cross_entropy_fwd, cpu::ref::cross_entropy_fwd<float>,
           losses, logits, targets, N, V);
  }
  void cross_entropy_bwd(Stream& s, float* dlogits, const float* logits, const int32_t* targets,
                         float dloss, int N, int V) override {
    launch(s, "cross_entropy_bwd", cpu::fast::cross_entropy_bwd, cpu::ref::cross_entropy_bwd<float>,
           dlogits, logits, targets, dloss, N, V);
  }
  void cross_entropy_part_fwd(Stream& s, float* stats, const float* logits,
                              const int32_t* targets, int N, int Vp, int col_begin,
                              int V) override {
    launch(s, "cross_entropy_part_fwd", cpu::fast::cross_entropy_part_fwd,
           cpu::ref::cross_entropy_part_fwd<float>, stats, logits, targets, N, Vp, col_begin, V);
  }
  void cross_entropy_combine(Stream& s, float* losses, float* lse, const float* stats_all,
                             const int32_t* targets, int N, int P) override {
    launch(s, "cross_entropy_combine", cpu::fast::cross_entropy_combine,
           cpu::ref::cross_entropy_combine<float>, losses, lse, stats_all, targets, N, P);
  }
  void cross_entropy_part_bwd(Stream& s, float* dlogits, const float* logits, const float* lse,
                              const int32_t* targets, float dloss, int N, int Vp, int col_begin,
                              int V) override {
    launch(s, "cross_entropy_part_bwd", cpu::fast::cross_entropy_part_bwd,
           cpu::ref::cross_entropy_part_bwd<float>, dlogits, logits, lse, targets, dloss, N, Vp,
           col_begin, V);
  }
  void add(Stream& s, float* out, const float* a, const float* b, size_t n) override {
    launch(s, "add", cpu::fast::add, cpu::ref::add<float>, out, a, b, n);
  }
  void scale(Stream& s, float* x, float alpha, size_t n) override {
    launch(s, "scale", cpu::fast::scale, cpu::ref::scale<float>, x, alpha, n);
  }
  void cast_f32_to_bf16(Stream& s, uint16_t* out, const float* in, size_t n) override {
    launch(s, "cast_f32_to_bf16", cpu::fast::cast_f32_to_bf16, cpu::ref::cast_f32_to_bf16, out, in,
           n);
  }
  void cast_bf16_to_f32(Stream& s, float* out, const uint16_t* in, size_t n) override {
    launch(s, "cast_bf16_to_f32", cpu::fast::cast_bf16_to_f32, cpu::ref::cast_bf16_to_f32, out, in,
           n);
  }
  void round_to_bf16(Stream& s, float* out, const float* in, size_t n) override {
    launch(s, "round_to_bf16", cpu::fast::round_to_bf16, cpu::ref::round_to_bf16, out, in, n);
  }
  void sum(Stream& s, double* out, const float* x, size_t n) override {
    launch(s, "sum", cpu::fast::sum, cpu::ref::sum<float>, out, x, n);
  }
  void sum_squares(Stream& s, double* out, const float* x, size_t n) override {
    launch(s, "sum_squares", cpu::fast::sum_squares, cpu::ref::sum_squares<float>, out, x, n);
  }

 private:
  // Enqueues fn(args...) with fn the fast or the reference implementation; the arguments are
  // copied into the task (they are pointers and sizes).
  template <class... A>
  void launch(Stream& s, const char* label, void (*fast_fn)(A...), void (*ref_fn)(A...),
              std::type_identity_t<A>... args) {
    void (*fn)(A...) = reference_ ? ref_fn : fast_fn;
    s.host_task(label, [fn, args...] { fn(args...); });
  }

  bool reference_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(CpuOpsMode mode) { return std::make_unique<CpuOps>(mode); }

}  // namespace strata
