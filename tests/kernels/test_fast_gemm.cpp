// GEMM-based fast ops against the scalar reference: the blocked parallel sgemm (blas.h), linear
// forward/backward and causal grouped-query attention, at shapes that hit the SIMD, BLAS
// micro-kernel and attention-block (64 rows) tails; and determinism across thread counts.
//
// GEMM tolerances use the classic bound for a dot product summed in any order in f32:
// |fl(Σ a_k b_k) − Σ a_k b_k| ≤ γ_K·Σ|a_k b_k|, γ_K ≈ K·u (u = 2^-24); the reference sums in
// double, so its own error is one rounding.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/ref_ops.h"
#include "tests/kernels/op_test_util.h"

namespace strata {
namespace {

namespace fast = cpu::fast;
namespace ref = cpu::ref;
using test::AttnLayout;
using test::AttnShape;
using test::expect_close;
using test::expect_close_fn;
using test::expect_equal;
using test::kU32;
using test::max_abs;
using test::random_tokens;
using test::random_vec;

// ---- blas::gemm -----------------------------------------------------------------------------

struct GemmCase {
  int M, N, K;
};

TEST(FastVsRef, BlockedGemmAllTransposes) {
  // 300×700×19 and 520×300×40 are split into blocks (more than 2^20 multiply-adds); the others
  // run as one call; 1×4097 and 257×1 are the degenerate vector shapes.
  const GemmCase cases[] = {{300, 700, 19}, {520, 300, 40}, {1, 4097, 33},
                            {257, 1, 17},   {65, 67, 300},  {7, 5, 1}};
  for (const GemmCase& c : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f}) {
          const int lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 2, ldc = c.N + 1;
          auto A = random_vec(size_t(ta ? c.K : c.M) * lda, 1);
          auto B = random_vec(size_t(tb ? c.N : c.K) * ldb, 2);
          auto C = random_vec(size_t(c.M) * ldc, 3);
          auto C0 = C;
          const float alpha = 0.75f;
          cpu::blas::gemm(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta,
                          C.data(), ldc);
          auto a = [&](int i, int k) {
            return double(ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]);
          };
          auto b = [&](int k, int j) {
            return double(tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j]);
          };
          std::vector<float> want(C.size());
          std::vector<double> bound(C.size(), 0.0);
          for (int i = 0; i < c.M; ++i)
            for (int j = 0; j < ldc; ++j) {
              const size_t idx = size_t(i) * ldc + j;
              if (j >= c.N) {  // padding column: must be untouched
                want[idx] = C0[idx];
                continue;
              }
              double s = 0, sa = 0;
              for (int k = 0; k < c.K; ++k) {
                s += a(i, k) * b(k, j);
                sa += std::fabs(a(i, k) * b(k, j));
              }
              want[idx] = float(alpha * s + beta * C0[idx]);
              // γ_{K+2} on |alpha|·Σ|ab| + |beta C0|, plus the reference's rounding.
              bound[idx] = (c.K + 3) * kU32 * (alpha * sa + std::fabs(beta * C0[idx])) +
                           kU32 * std::fabs(want[idx]);
            }
          expect_close_fn("gemm M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
                              " K=" + std::to_string(c.K) + " ta=" + std::to_string(ta) +
                              " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta),
                          C.data(), want.data(), C.size(), [&](size_t i) { return bound[i]; });
        }
}

TEST(FastVsRef, GemmEmptyShapes) {
  std::vector<float> C(6, 5.0f), A(6, 1.0f), B(6, 1.0f);
  cpu::blas::gemm(false, false, 2, 3, 0, 1.0f, A.data(), 1, B.data(), 3, 1.0f, C.data(), 3);
  expect_equal("K=0, beta=1 keeps C", C, std::vector<float>(6, 5.0f));
  C.assign(6, NAN);
  cpu::blas::gemm(false, false, 2, 3, 0, 1.0f, A.data(), 1, B.data(), 3, 0.0f, C.data(), 3);
  expect_equal("K=0, beta=0 zeroes C (even NaN)", C, std::vector<float>(6, 0.0f));
  EXPECT_THROW(
      cpu::blas::gemm(false, false, 2, 3, 4, 1.0f, A.data(), 2, B.data(), 3, 0.0f, C.data(), 3),
      Error);  // lda < K
}

// ---- linear ---------------------------------------------------------------------------------

TEST(FastVsRef, LinearForwardAndBackward) {
  struct Shape {
    int N, IC, OC;
  };
  const Shape shapes[] = {{1, 1, 1},    {7, 15, 17},   {33, 16, 31},  {5, 33, 4097},
                          {3, 4097, 7}, {129, 64, 96}, {300, 65, 130}};
  for (const Shape& s : shapes) {
    const std::string tag =
        " N=" + std::to_string(s.N) + " IC=" + std::to_string(s.IC) + " OC=" + std::to_string(s.OC);
    auto in = random_vec(size_t(s.N) * s.IC, 10);
    auto w = random_vec(size_t(s.OC) * s.IC, 11);
    auto dout = random_vec(size_t(s.N) * s.OC, 12);
    // Every input is in [-1, 1], so Σ|a b| ≤ K and the γ_K bound is (K + 2)·u·K; computed per
    // element from the actual values below, which is tighter.
    std::vector<float> o1(size_t(s.N) * s.OC), o2(o1.size());
    fast::linear_fwd(o1.data(), in.data(), w.data(), s.N, s.IC, s.OC);
    ref::linear_fwd<float>(o2.data(), in.data(), w.data(), s.N, s.IC, s.OC);
    expect_close_fn("linear_fwd" + tag, o1.data(), o2.data(), o1.size(), [&](size_t i) {
      const size_t n = i / s.OC, o = i % s.OC;
      double sa = 0;
      for (int k = 0; k < s.IC; ++k) sa += std::fabs(double(in[n * s.IC + k]) * w[o * s.IC + k]);
      return (s.IC + 2) * kU32 * sa;
    });

    std::vector<float> din1(size_t(s.N) * s.IC, 3.0f), din2 = din1;
    auto dw1 = random_vec(size_t(s.OC) * s.IC, 13), dw2 = dw1;  // dw accumulates
    const auto dw0 = dw1;
    fast::linear_bwd(din1.data(), dw1.data(), dout.data(), in.data(), w.data(), s.N, s.IC, s.OC);
    ref::linear_bwd<float>(din2.data(), dw2.data(), dout.data(), in.data(), w.data(), s.N, s.IC,
                           s.OC);
    expect_close_fn("linear_bwd din" + tag, din1.data(), din2.data(), din1.size(), [&](size_t i) {
      const size_t n = i / s.IC, c = i % s.IC;
      double sa = 0;
      for (int o = 0; o < s.OC; ++o) sa += std::fabs(double(dout[n * s.OC + o]) * w[o * s.IC + c]);
      return (s.OC + 2) * kU32 * sa;
    });
    expect_close_fn("linear_bwd dw" + tag, dw1.data(), dw2.data(), dw1.size(), [&](size_t i) {
      const size_t o = i / s.IC, c = i % s.IC;
      double sa = std::fabs(double(dw0[i]));
      for (int n = 0; n < s.N; ++n) sa += std::fabs(double(dout[n * s.OC + o]) * in[n * s.IC + c]);
      return (s.N + 3) * kU32 * sa;
    });

    // din = null: only dw is computed.
    auto dw3 = dw0;
    fast::linear_bwd(nullptr, dw3.data(), dout.data(), in.data(), w.data(), s.N, s.IC, s.OC);
    expect_equal("linear_bwd without din" + tag, dw3, dw1);
  }
}

// ---- attention ------------------------------------------------------------------------------

const AttnShape kAttnShapes[] = {{1, 1, 1, 1, 8},   {2, 7, 2, 1, 16},  {3, 17, 4, 1, 8},
                                 {2, 64, 2, 2, 16}, {1, 65, 4, 2, 64}, {1, 130, 8, 2, 64},
                                 {1, 129, 4, 4, 16}};

std::string attn_tag(const AttnShape& s, bool packed) {
  return " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " KVH=" + std::to_string(s.KVH) + " D=" + std::to_string(s.D) +
         (packed ? " packed" : " separate");
}

// Worst-case f32 error of a score s = (q·k)/sqrt(D) with |q|, |k| ≤ 1: (D + 1)·u·sqrt(D).
// Probabilities inherit it (dp/p = ds) plus 2 ulp from exp.
double score_error(int D) { return (D + 1) * kU32 * std::sqrt(double(D)) + 2 * kU32; }

TEST(FastVsRef, AttentionForward) {
  for (const AttnShape& s : kAttnShapes)
    for (bool packed : {true, false}) {
      const AttnLayout L(s, packed);
      auto qkv = random_vec(L.size, 20);
      const size_t n_out = size_t(s.B) * s.T * s.H * s.D, n_lse = size_t(s.B) * s.H * s.T;
      std::vector<float> o1(n_out), o2(n_out), l1(n_lse), l2(n_lse);
      fast::attention_fwd(o1.data(), l1.data(), qkv.data() + L.q_off, qkv.data() + L.k_off,
                          qkv.data() + L.v_off, s.B, s.T, s.H, s.KVH, s.D, L.ldq, L.ldkv);
      ref::attention_fwd<float>(o2.data(), l2.data(), qkv.data() + L.q_off, qkv.data() + L.k_off,
                                qkv.data() + L.v_off, s.B, s.T, s.H, s.KVH, s.D, L.ldq, L.ldkv);
      // out = Σ p v with |v| ≤ 1: error ≤ max relative error of p (score_error) plus the f32
      // sum over ≤ T keys ((T + 2)·u). lse: the score error, the f32 sum of the exponentials
      // ((T + 2)·u relative → absolute in the log) and one rounding of |lse| (≤ log T + sqrt D).
      const double e = score_error(s.D) + (s.T + 2) * kU32;
      expect_close("attention_fwd out" + attn_tag(s, packed), o1, o2, 0.0, 2 * e);
      expect_close("attention_fwd lse" + attn_tag(s, packed), l1, l2, 2 * kU32, 2 * e);
    }
}

TEST(FastVsRef, AttentionBackward) {
  for (const AttnShape& s : kAttnShapes)
    for (bool packed : {true, false}) {
      const AttnLayout L(s, packed);
      auto qkv = random_vec(L.size, 30);
      const size_t n_out = size_t(s.B) * s.T * s.H * s.D, n_lse = size_t(s.B) * s.H * s.T;
      std::vector<float> out(n_out), lse(n_lse);
      const float *q = qkv.data() + L.q_off, *k = qkv.data() + L.k_off, *v = qkv.data() + L.v_off;
      ref::attention_fwd<float>(out.data(), lse.data(), q, k, v, s.B, s.T, s.H, s.KVH, s.D, L.ldq,
                                L.ldkv);
      auto dout = random_vec(n_out, 31);
      // Gradients land in a buffer with the same layout, prefilled with a sentinel: whatever
      // is not a gradient (padding) must keep it, whatever is must be overwritten.
      std::vector<float> g1(L.size, 7.0f), g2(L.size, 7.0f);
      fast::attention_bwd(g1.data() + L.q_off, g1.data() + L.k_off, g1.data() + L.v_off,
                          dout.data(), out.data(), lse.data(), q, k, v, s.B, s.T, s.H, s.KVH, s.D,
                          L.ldq, L.ldkv);
      ref::attention_bwd<float>(g2.data() + L.q_off, g2.data() + L.k_off, g2.data() + L.v_off,
                                dout.data(), out.data(), lse.data(), q, k, v, s.B, s.T, s.H, s.KVH,
                                s.D, L.ldq, L.ldkv);
      // Every gradient is linear in P and dS; P carries score_error, dP = dO·V and
      // rowsum(dO∘O) are f32 dot products over D (relative D·u of their scale), and the
      // gradients sum over ≤ T·(H/KVH) rows. Bound normwise, relative to the tensor's largest
      // element (gradients cancel element-wise), with a factor 8 for the chain of products.
      const int G = s.H / s.KVH;
      const double rel = 8 * (score_error(s.D) + (s.T * G + 2 * s.D + 8) * kU32);
      expect_close("attention_bwd dq/dk/dv" + attn_tag(s, packed), g1, g2, 0.0, rel * max_abs(g2));
    }
}

TEST(FastVsRef, AttentionRejectsBadHeads) {
  std::vector<float> buf(1024);
  EXPECT_THROW(fast::attention_fwd(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), 1, 2,
                                   3, 2, 4, 12, 8),
               Error);  // 3 heads over 2 kv heads
  EXPECT_THROW(fast::attention_fwd(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), 1, 2,
                                   2, 1, 4, 7, 8),
               Error);  // ldq < H·D
}

// ---- determinism ----------------------------------------------------------------------------

// Runs fn in an arena of `threads` threads.
template <class Fn>
void with_threads(int threads, Fn&& fn) {
  tbb::task_arena arena(threads);
  arena.execute(fn);
}

TEST(FastOps, ResultsDoNotDependOnThreadCount) {
  // Partitions of reductions are fixed by the shape, so the bits are the same with 1 thread and
  // with all of them (the property that makes offloaded and resident runs bit-identical).
  const int N = 300, C = 517, OC = 260;
  auto x = random_vec(size_t(N) * C, 40), w = random_vec(size_t(OC) * C, 41);
  auto g = random_vec(size_t(N) * OC, 42), wn = random_vec(C, 43, 0.5, 1.5);
  const AttnShape s{2, 130, 4, 2, 16};
  const AttnLayout L(s, true);
  auto qkv = random_vec(L.size, 44);
  const size_t n_out = size_t(s.B) * s.T * s.H * s.D;
  auto dout_attn = random_vec(n_out, 45);

  struct Results {
    std::vector<float> lin, din, dw, norm, rstd, dx, dwn, attn, lse, dqkv;
    double sum = 0;
  };
  auto run = [&] {
    Results r;
    r.lin.resize(size_t(N) * OC);
    fast::linear_fwd(r.lin.data(), x.data(), w.data(), N, C, OC);
    r.din.resize(size_t(N) * C);
    r.dw.assign(size_t(OC) * C, 0.0f);
    fast::linear_bwd(r.din.data(), r.dw.data(), g.data(), x.data(), w.data(), N, C, OC);
    r.norm.resize(size_t(N) * C);
    r.rstd.resize(N);
    fast::rmsnorm_fwd(r.norm.data(), r.rstd.data(), x.data(), wn.data(), N, C, 1e-6f);
    r.dx.assign(size_t(N) * C, 0.0f);
    r.dwn.assign(C, 0.0f);
    fast::rmsnorm_bwd(r.dx.data(), r.dwn.data(), x.data(), x.data(), wn.data(), r.rstd.data(), N,
                      C);
    r.attn.resize(n_out);
    r.lse.resize(size_t(s.B) * s.H * s.T);
    fast::attention_fwd(r.attn.data(), r.lse.data(), qkv.data() + L.q_off, qkv.data() + L.k_off,
                        qkv.data() + L.v_off, s.B, s.T, s.H, s.KVH, s.D, L.ldq, L.ldkv);
    r.dqkv.assign(L.size, 0.0f);
    fast::attention_bwd(r.dqkv.data() + L.q_off, r.dqkv.data() + L.k_off, r.dqkv.data() + L.v_off,
                        dout_attn.data(), r.attn.data(), r.lse.data(), qkv.data() + L.q_off,
                        qkv.data() + L.k_off, qkv.data() + L.v_off, s.B, s.T, s.H, s.KVH, s.D,
                        L.ldq, L.ldkv);
    fast::sum(&r.sum, r.dx.data(), r.dx.size());
    return r;
  };
  Results one, all, again;
  with_threads(1, [&] { one = run(); });
  with_threads(tbb::this_task_arena::max_concurrency(), [&] { all = run(); });
  again = run();
  for (const Results* r : {&all, &again}) {
    expect_equal("linear_fwd", r->lin, one.lin);
    expect_equal("linear_bwd din", r->din, one.din);
    expect_equal("linear_bwd dw", r->dw, one.dw);
    expect_equal("rmsnorm_fwd", r->norm, one.norm);
    expect_equal("rmsnorm_bwd dx", r->dx, one.dx);
    expect_equal("rmsnorm_bwd dw", r->dwn, one.dwn);
    expect_equal("attention_fwd", r->attn, one.attn);
    expect_equal("attention_fwd lse", r->lse, one.lse);
    expect_equal("attention_bwd", r->dqkv, one.dqkv);
    EXPECT_EQ(r->sum, one.sum);
  }
}

}  // namespace
}  // namespace strata
