// Finite-difference checks of every backward op, on the reference in double (ref<double>).
//
// For each op, L = Σ_i out_i · W_i with fixed random weights W; the backward op is run with
// dout = W and its gradients compared with central differences (L(x + h) − L(x − h)) / 2h of
// every input element. With h = 1e-5 in double the truncation error is h²/6·|L'''| ≈ 1e-11 and
// the rounding error ≈ 2^-53·|L|/h ≈ 1e-11·|L| (|L| ≤ 100 here), so a tolerance of
// 1e-6·(1 + |g|) is loose for correct code yet far below the O(0.1) error of a wrong formula.
// Also checked: which gradients accumulate (+=) and which are written (=), per kernels/ops.h.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/ref_ops.h"
#include "tests/kernels/op_test_util.h"

namespace strata {
namespace {

namespace ref = cpu::ref;
using test::random_tokens;
using Vec = std::vector<double>;

constexpr double kStep = 1e-5;
constexpr double kTol = 1e-6;

Vec rand_d(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  return test::random_vec<double>(n, seed, lo, hi);
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central-difference gradient of loss() with respect to each element of x (x is restored).
// `skip(i)` excludes elements that are not inputs (padding).
Vec numeric_grad(Vec& x, const std::function<double()>& loss,
                 const std::function<bool(size_t)>& skip = nullptr) {
  Vec g(x.size(), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    if (skip && skip(i)) continue;
    const double keep = x[i];
    x[i] = keep + kStep;
    const double lp = loss();
    x[i] = keep - kStep;
    const double lm = loss();
    x[i] = keep;
    g[i] = (lp - lm) / (2 * kStep);
  }
  return g;
}

void expect_grad(const std::string& what, const Vec& analytic, const Vec& numeric) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_err = -1;
  for (size_t i = 0; i < analytic.size(); ++i) {
    const double err = std::fabs(analytic[i] - numeric[i]) / (1.0 + std::fabs(numeric[i]));
    if (!(err <= kTol)) ++bad;
    if (!(err <= worst_err)) {
      worst_err = err;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": worst [" << worst << "] analytic " << analytic[worst]
                     << " numeric " << numeric[worst] << " (relative error " << worst_err << ")";
}

TEST(GradCheck, Embedding) {
  const int N = 9, C = 5, V = 4;
  auto tok = random_tokens(N, V, 1);
  Vec wte = rand_d(size_t(V) * C, 2), W = rand_d(size_t(N) * C, 3), out(size_t(N) * C);
  auto loss = [&] {
    ref::embedding_fwd<double>(out.data(), tok.data(), wte.data(), N, C, V);
    return dot(out, W);
  };
  Vec dwte(wte.size(), 0.0);
  ref::embedding_bwd<double>(dwte.data(), W.data(), tok.data(), N, C, V);
  expect_grad("embedding dwte", dwte, numeric_grad(wte, loss));
}

TEST(GradCheck, Rmsnorm) {
  for (int C : {1, 3, 17}) {
    const int N = 4;
    Vec x = rand_d(size_t(N) * C, 10, -2.0, 2.0), w = rand_d(C, 11, 0.5, 1.5);
    for (auto& v : x) v += v >= 0 ? 0.3 : -0.3;  // keep rows away from 0 (rstd → 1/sqrt(eps))
    Vec W = rand_d(x.size(), 12), out(x.size()), rstd(N);
    auto loss = [&] {
      ref::rmsnorm_fwd<double>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
      return dot(out, W);
    };
    loss();
    Vec dx(x.size(), 0.0), dw(C, 0.0);
    ref::rmsnorm_bwd<double>(dx.data(), dw.data(), W.data(), x.data(), w.data(), rstd.data(), N, C);
    expect_grad("rmsnorm dx C=" + std::to_string(C), dx, numeric_grad(x, loss));
    expect_grad("rmsnorm dw C=" + std::to_string(C), dw, numeric_grad(w, loss));
  }
}

TEST(GradCheck, Linear) {
  const int N = 5, IC = 7, OC = 3;
  Vec in = rand_d(size_t(N) * IC, 20), w = rand_d(size_t(OC) * IC, 21);
  Vec W = rand_d(size_t(N) * OC, 22), out(size_t(N) * OC);
  auto loss = [&] {
    ref::linear_fwd<double>(out.data(), in.data(), w.data(), N, IC, OC);
    return dot(out, W);
  };
  Vec din(in.size(), 0.0), dw(w.size(), 0.0);
  ref::linear_bwd<double>(din.data(), dw.data(), W.data(), in.data(), w.data(), N, IC, OC);
  expect_grad("linear din", din, numeric_grad(in, loss));
  expect_grad("linear dw", dw, numeric_grad(w, loss));
}

TEST(GradCheck, Rope) {
  const int B = 2, T = 40, heads = 2, D = 16, ld = heads * D + 1;
  for (const auto& [name, rope] : test::rope_variants()) {  // T > llama3's original context 32
    const test::RopeTablesAs<double> tab(rope, T, D);
    Vec x = rand_d(size_t(B) * T * ld, 30), W = rand_d(x.size(), 31);
    for (size_t r = 0; r < size_t(B) * T; ++r) W[r * ld + ld - 1] = 0;  // padding is not output
    auto loss = [&] {
      Vec y = x;
      ref::rope_fwd<double>(y.data(), tab.cos.data(), tab.sin.data(), B, T, heads, D, ld);
      return dot(y, W);
    };
    Vec dx = W;
    ref::rope_bwd<double>(dx.data(), tab.cos.data(), tab.sin.data(), B, T, heads, D, ld);
    auto pad = [&](size_t i) { return i % ld == size_t(ld - 1); };
    Vec num = numeric_grad(x, loss, pad);
    for (size_t r = 0; r < size_t(B) * T; ++r) dx[r * ld + ld - 1] = 0;
    expect_grad("rope dx " + name, dx, num);
  }
}

TEST(GradCheck, AttentionGroupedQuery) {
  struct Shape {
    int B, T, H, KVH, D;
  };
  for (Shape s : {Shape{2, 5, 4, 2, 4}, Shape{1, 6, 3, 1, 2}, Shape{1, 4, 2, 2, 3}}) {
    // Packed layout: each row holds q (H·D), k (KVH·D), v (KVH·D).
    const int ld = (s.H + 2 * s.KVH) * s.D;
    Vec qkv = rand_d(size_t(s.B) * s.T * ld, 40);
    const size_t n_out = size_t(s.B) * s.T * s.H * s.D;
    Vec W = rand_d(n_out, 41), out(n_out), lse(size_t(s.B) * s.H * s.T);
    auto fwd = [&] {
      ref::attention_fwd<double>(out.data(), lse.data(), qkv.data(), qkv.data() + s.H * s.D,
                                 qkv.data() + (s.H + s.KVH) * s.D, s.B, s.T, s.H, s.KVH, s.D, ld,
                                 ld);
    };
    auto loss = [&] {
      fwd();
      return dot(out, W);
    };
    fwd();
    Vec g(qkv.size(), 0.0);
    ref::attention_bwd<double>(g.data(), g.data() + s.H * s.D, g.data() + (s.H + s.KVH) * s.D,
                               W.data(), out.data(), lse.data(), qkv.data(), qkv.data() + s.H * s.D,
                               qkv.data() + (s.H + s.KVH) * s.D, s.B, s.T, s.H, s.KVH, s.D, ld, ld);
    expect_grad("attention dq/dk/dv H=" + std::to_string(s.H) + " KVH=" + std::to_string(s.KVH), g,
                numeric_grad(qkv, loss));
  }
}

TEST(GradCheck, AttentionLseIsTheLogSumExp) {
  // lse is saved for backward; check it against its definition on one row.
  const int T = 3, D = 2;
  Vec q = rand_d(T * D, 45), k = rand_d(T * D, 46), v = rand_d(T * D, 47), out(T * D), lse(T);
  ref::attention_fwd<double>(out.data(), lse.data(), q.data(), k.data(), v.data(), 1, T, 1, 1, D, D,
                             D);
  double z = 0;
  for (int j = 0; j < T; ++j)
    z += std::exp((q[2 * D] * k[j * D] + q[2 * D + 1] * k[j * D + 1]) / std::sqrt(2.0));
  EXPECT_NEAR(lse[2], std::log(z), 1e-14);
  EXPECT_NEAR(lse[0], (q[0] * k[0] + q[1] * k[1]) / std::sqrt(2.0), 1e-14);
}

TEST(GradCheck, Swiglu) {
  const int N = 3, F = 5, ld = 2 * F;  // gate and up are the halves of one (N, 2F) buffer
  Vec gu = rand_d(size_t(N) * ld, 50, -4.0, 4.0), W = rand_d(size_t(N) * F, 51), out(size_t(N) * F);
  auto loss = [&] {
    ref::swiglu_fwd<double>(out.data(), gu.data(), gu.data() + F, N, F, ld);
    return dot(out, W);
  };
  Vec g(gu.size(), 0.0);
  ref::swiglu_bwd<double>(g.data(), g.data() + F, W.data(), gu.data(), gu.data() + F, N, F, ld);
  expect_grad("swiglu dgate/dup", g, numeric_grad(gu, loss));
}

TEST(GradCheck, CrossEntropy) {
  const int N = 4, V = 6;
  Vec logits = rand_d(size_t(N) * V, 60, -3.0, 3.0), losses(N);
  std::vector<int32_t> targets = {2, -1, 0, 5};  // row 1 is ignored
  const double dloss = 0.25;                     // the op's scalar upstream gradient
  auto loss = [&] {
    ref::cross_entropy_fwd<double>(losses.data(), logits.data(), targets.data(), N, V);
    double s = 0;
    for (double l : losses) s += l;
    return dloss * s;
  };
  Vec d(logits.size(), 0.0);
  ref::cross_entropy_bwd<double>(d.data(), logits.data(), targets.data(), dloss, N, V);
  expect_grad("cross_entropy dlogits", d, numeric_grad(logits, loss));
  loss();
  EXPECT_EQ(losses[1], 0.0);
}

// ---- accumulate (+=) versus write (=) -------------------------------------------------------

TEST(Conventions, ParameterGradsAccumulateActivationGradsAreWritten) {
  const int N = 3, C = 4, OC = 2, V = 5;
  Vec x = rand_d(size_t(N) * C, 70, 0.5, 1.5), w = rand_d(size_t(OC) * C, 71);
  Vec dout = rand_d(size_t(N) * OC, 72);
  // linear: dw accumulates, din is written (prefilled with garbage to make sure).
  Vec din(size_t(N) * C, 9.0), dw(w.size(), 0.0);
  auto lin = [&] {
    ref::linear_bwd<double>(din.data(), dw.data(), dout.data(), x.data(), w.data(), N, C, OC);
  };
  lin();
  const Vec din1 = din, dw1 = dw;
  lin();
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], 2 * dw1[i], 1e-12) << "linear dw +=";
  for (size_t i = 0; i < din.size(); ++i) EXPECT_EQ(din[i], din1[i]) << "linear din =";
  for (size_t i = 0; i < din.size(); ++i) EXPECT_NE(din[i], 9.0) << "linear din written";

  // rmsnorm: dx and dw both accumulate.
  Vec wn = rand_d(C, 73, 0.5, 1.5), out(x.size()), rstd(N), g = rand_d(x.size(), 74);
  ref::rmsnorm_fwd<double>(out.data(), rstd.data(), x.data(), wn.data(), N, C, 1e-6);
  Vec dx(x.size(), 0.0), dwn(C, 0.0);
  ref::rmsnorm_bwd<double>(dx.data(), dwn.data(), g.data(), x.data(), wn.data(), rstd.data(), N, C);
  Vec dx1 = dx, dwn1 = dwn;
  ref::rmsnorm_bwd<double>(dx.data(), dwn.data(), g.data(), x.data(), wn.data(), rstd.data(), N, C);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], 2 * dx1[i], 1e-12) << "rmsnorm dx +=";
  for (int c = 0; c < C; ++c) EXPECT_NEAR(dwn[c], 2 * dwn1[c], 1e-12) << "rmsnorm dw +=";

  // embedding: dwte accumulates.
  auto tok = random_tokens(N, V, 75);
  Vec dwte(size_t(V) * C, 1.0), gout = rand_d(size_t(N) * C, 76);
  ref::embedding_bwd<double>(dwte.data(), gout.data(), tok.data(), N, C, V);
  double total = 0;
  for (double v : dwte) total += v;
  double expect = V * C;
  for (double v : gout) expect += v;
  EXPECT_NEAR(total, expect, 1e-12) << "embedding dwte +=";

  // attention, swiglu, cross-entropy: written (a prefilled output gives the same result).
  const int T = 3, D = 2;
  Vec q = rand_d(T * D, 77), k = rand_d(T * D, 78), v = rand_d(T * D, 79), ao(T * D), lse(T);
  ref::attention_fwd<double>(ao.data(), lse.data(), q.data(), k.data(), v.data(), 1, T, 1, 1, D, D,
                             D);
  Vec ag = rand_d(T * D, 80);
  Vec dq0(T * D, 0.0), dk0(T * D, 0.0), dv0(T * D, 0.0), dq1(T * D, 5.0), dk1(T * D, 5.0),
      dv1(T * D, 5.0);
  ref::attention_bwd<double>(dq0.data(), dk0.data(), dv0.data(), ag.data(), ao.data(), lse.data(),
                             q.data(), k.data(), v.data(), 1, T, 1, 1, D, D, D);
  ref::attention_bwd<double>(dq1.data(), dk1.data(), dv1.data(), ag.data(), ao.data(), lse.data(),
                             q.data(), k.data(), v.data(), 1, T, 1, 1, D, D, D);
  EXPECT_EQ(dq0, dq1);
  EXPECT_EQ(dk0, dk1);
  EXPECT_EQ(dv0, dv1);
}

}  // namespace
}  // namespace strata
