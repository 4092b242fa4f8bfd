// Fast CPU ops against the scalar reference (ref<float>), element by element, at sizes that hit
// the SIMD tails (vector widths 8 and 16) and the task-partition boundaries. This file: the
// memory-bound ops (embedding, RMSNorm, rotary, SwiGLU, cross-entropy, elementwise, casts,
// sums). GEMM-based ops (linear, attention) are in test_fast_gemm.cpp.
//
// Tolerances are written as multiples of u = 2^-24 (f32 unit roundoff) with the reasoning next to
// each; the reference accumulates in double, so its own error is one final rounding (≤ u·|x|).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/fast_common.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/ref_ops.h"
#include "tests/kernels/op_test_util.h"

namespace strata {
namespace {

namespace fast = cpu::fast;
namespace ref = cpu::ref;
using test::expect_close;
using test::expect_close_fn;
using test::expect_equal;
using test::kU32;
using test::random_tokens;
using test::random_vec;

// Widths of the vectorized dimension: 1, below / at / above one and two vectors of 8 and 16
// lanes, and one past a page of floats.
const int kTailSizes[] = {1, 7, 15, 16, 17, 31, 33, 4097};

// ---- the vectorizable exp of the fast path --------------------------------------------------

TEST(FastVsRef, ExpFastIsWithinTwoUlp) {
  // Claimed in fast_common.h: within ~2 ulp of e^x on [-87.3, 88.3] (Taylor truncation < 0.1
  // ulp, the rest is rounding of the Horner steps and of r). Checked on a dense sweep.
  double worst_ulps = 0;
  for (double x = -87.3; x <= 88.3; x += 1.0 / 4099) {
    const float xf = float(x);
    const double want = std::exp(double(xf));
    const double got = cpu::fast::exp_fast(xf);
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst_ulps = std::max(worst_ulps, std::fabs(got - want) / ulp);
  }
  EXPECT_LE(worst_ulps, 2.0);
  EXPECT_EQ(cpu::fast::exp_fast(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::fast::exp_fast(-100.0f), 0.0f);
  EXPECT_EQ(cpu::fast::exp_fast(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(cpu::fast::exp_fast(1000.0f)));  // saturates, documented
  EXPECT_TRUE(std::isnan(cpu::fast::exp_fast(NAN)));
}

// ---- embedding ------------------------------------------------------------------------------

TEST(FastVsRef, EmbeddingForwardIsExact) {
  // A copy: bit-exact.
  const int V = 11;
  for (int C : kTailSizes)
    for (int N : {1, 7, 130}) {
      auto wte = random_vec(size_t(V) * C, 1);
      auto tok = random_tokens(N, V, 2);
      std::vector<float> a(size_t(N) * C), b(size_t(N) * C);
      fast::embedding_fwd(a.data(), tok.data(), wte.data(), N, C, V);
      ref::embedding_fwd<float>(b.data(), tok.data(), wte.data(), N, C, V);
      expect_equal("embedding_fwd C=" + std::to_string(C), a, b);
    }
}

TEST(FastVsRef, EmbeddingBackwardIsExactAndAccumulates) {
  // Both add the rows into dwte in row order, one f32 addition each: bit-exact. Few tokens over
  // many rows, so every row of dwte receives many (repeated) contributions.
  const int V = 5;
  for (int C : kTailSizes)
    for (int N : {1, 7, 257}) {
      auto dout = random_vec(size_t(N) * C, 3);
      auto tok = random_tokens(N, V, 4);
      auto a = random_vec(size_t(V) * C, 5), b = a;  // nonzero: the op must accumulate
      fast::embedding_bwd(a.data(), dout.data(), tok.data(), N, C, V);
      ref::embedding_bwd<float>(b.data(), dout.data(), tok.data(), N, C, V);
      expect_equal("embedding_bwd C=" + std::to_string(C) + " N=" + std::to_string(N), a, b);
    }
}

TEST(FastVsRef, EmbeddingRejectsOutOfRangeTokens) {
  std::vector<float> wte(4 * 3), out(2 * 3), dwte(4 * 3), dout(2 * 3);
  std::vector<int32_t> tok = {1, 4};
  EXPECT_THROW(fast::embedding_bwd(dwte.data(), dout.data(), tok.data(), 2, 3, 4), Error);
  EXPECT_THROW(ref::embedding_bwd<float>(dwte.data(), dout.data(), tok.data(), 2, 3, 4), Error);
  EXPECT_THROW(fast::embedding_fwd(out.data(), tok.data(), wte.data(), 2, 3, 4), Error);
  EXPECT_THROW(ref::embedding_fwd<float>(out.data(), tok.data(), wte.data(), 2, 3, 4), Error);
  tok = {1, -1};
  EXPECT_THROW(fast::embedding_fwd(out.data(), tok.data(), wte.data(), 2, 3, 4), Error);
}

// ---- RMSNorm --------------------------------------------------------------------------------

TEST(FastVsRef, RmsnormForward) {
  for (int C : kTailSizes)
    for (int N : {1, 7, 33}) {
      auto x = random_vec(size_t(N) * C, 10, -2.0, 2.0);
      auto w = random_vec(C, 11, 0.5, 1.5);
      std::vector<float> o1(size_t(N) * C), o2(o1.size()), r1(N), r2(N);
      fast::rmsnorm_fwd(o1.data(), r1.data(), x.data(), w.data(), N, C, 1e-5f);
      ref::rmsnorm_fwd<float>(o2.data(), r2.data(), x.data(), w.data(), N, C, 1e-5f);
      // Σx² of positive terms summed in f32 over SIMD lanes of at most C/8 + 3 additions each:
      // relative error ≤ (C/8 + 3)·u (Higham's bound for any order); rstd halves it, plus 2u
      // for the sqrt and division. out = (x·r)·w adds 2u. Reference: u.
      const double rt = (C / 8.0 + 3) * kU32 / 2 + 6 * kU32;
      const std::string tag = " C=" + std::to_string(C) + " N=" + std::to_string(N);
      expect_close("rstd" + tag, r1, r2, rt, 0.0);
      expect_close("out" + tag, o1, o2, rt, 0.0);
    }
}

TEST(FastVsRef, RmsnormBackwardAccumulatesDxAndDw) {
  for (int C : kTailSizes)
    for (int N : {1, 7, 65}) {
      auto x = random_vec(size_t(N) * C, 20, -2.0, 2.0);
      auto w = random_vec(C, 21, 0.5, 1.5);
      auto g = random_vec(size_t(N) * C, 22);
      std::vector<float> out(size_t(N) * C), rstd(N);
      ref::rmsnorm_fwd<float>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      auto dx1 = random_vec(size_t(N) * C, 23), dx2 = dx1;  // dx accumulates
      auto dw1 = random_vec(C, 24), dw2 = dw1;              // dw accumulates
      fast::rmsnorm_bwd(dx1.data(), dw1.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
      ref::rmsnorm_bwd<float>(dx2.data(), dw2.data(), g.data(), x.data(), w.data(), rstd.data(), N,
                              C);
      const std::string tag = " C=" + std::to_string(C) + " N=" + std::to_string(N);
      // Running error bounds from the actual values (A_n = Σ_c |w g y| / C, y = x·r):
      // dx = old + r·(w·g − y·A): the mean is an f32 dot product over C in SIMD lanes (error
      // ≤ (C/8 + 3)·u·A), the rest ~8 roundings of terms of size r·|w g| and r·|y|·A; dx may
      // cancel to ~0, so the bound is on the terms, not on |dx|. Plus u·|old| for the add.
      std::vector<double> A(N, 0.0);
      for (int n = 0; n < N; ++n) {
        for (int c = 0; c < C; ++c) {
          const size_t i = size_t(n) * C + c;
          A[n] += std::fabs(double(w[c]) * g[i] * x[i] * rstd[n]);
        }
        A[n] /= C;
      }
      auto old_dx = random_vec(size_t(N) * C, 23);
      auto tol_dx = [&](size_t i) {
        const size_t n = i / C, c = i % C;
        const double r = rstd[n], y = std::fabs(double(x[i]) * r);
        return 2 * kU32 * std::fabs(old_dx[i]) + 8 * kU32 * r * std::fabs(double(w[c]) * g[i]) +
               (C / 8.0 + 11) * kU32 * r * y * A[n];
      };
      expect_close_fn("dx" + tag, dx1.data(), dx2.data(), dx1.size(), tol_dx);
      // dw = old + Σ_n g·y: f32 sums over fixed chunks of 32 rows, the chunk sums added in
      // double: ≤ (32 + 2)·u·Σ_n |g y|, plus u·|old|.
      auto old_dw = random_vec(C, 24);
      auto tol_dw = [&](size_t c) {
        double s = 0;
        for (int n = 0; n < N; ++n)
          s += std::fabs(double(g[size_t(n) * C + c]) * x[size_t(n) * C + c] * rstd[n]);
        return 2 * kU32 * std::fabs(old_dw[c]) + 34 * kU32 * s;
      };
      expect_close_fn("dw" + tag, dw1.data(), dw2.data(), dw1.size(), tol_dw);
    }
}

// ---- rotary ---------------------------------------------------------------------------------

TEST(FastVsRef, RopeForwardAndBackward) {
  struct Shape {
    int B, T, heads, D, pad;
  };
  const Shape shapes[] = {{1, 1, 1, 2, 0},   {1, 7, 3, 8, 5},   {3, 33, 2, 16, 0},
                          {2, 17, 1, 34, 3}, {1, 65, 4, 64, 7}, {2, 9, 2, 128, 1}};
  for (const auto& [name, rope] : test::rope_variants())
    for (const Shape& s : shapes) {
      const test::RopeTablesAs<float> tab(rope, s.T, s.D);
      const int ld = s.heads * s.D + s.pad;  // padding between rows must stay untouched
      auto x = random_vec(size_t(s.B) * s.T * ld, 30);
      for (bool backward : {false, true}) {
        auto a = x, b = x;
        const float *cs = tab.cos.data(), *sn = tab.sin.data();
        if (backward) {
          fast::rope_bwd(a.data(), cs, sn, s.B, s.T, s.heads, s.D, ld);
          ref::rope_bwd<float>(b.data(), cs, sn, s.B, s.T, s.heads, s.D, ld);
        } else {
          fast::rope_fwd(a.data(), cs, sn, s.B, s.T, s.heads, s.D, ld);
          ref::rope_fwd<float>(b.data(), cs, sn, s.B, s.T, s.heads, s.D, ld);
        }
        // Both read the same tables and run the same IEEE double sequence with one final
        // rounding (fast_rope.cpp is built without FMA contraction): equal bit for bit.
        const std::string tag = std::string(backward ? "rope_bwd " : "rope_fwd ") + name +
                                " D=" + std::to_string(s.D) + " T=" + std::to_string(s.T);
        expect_equal(tag, a, b);
        for (size_t row = 0; row < size_t(s.B) * s.T; ++row)
          for (int p = 0; p < s.pad; ++p) {
            const size_t i = row * ld + size_t(s.heads) * s.D + p;
            ASSERT_EQ(a[i], x[i]) << tag << ": padding written at row " << row;
          }
      }
    }
}

// The rotation against the angle computed independently in double. For |a|, |b| ≤ 1,
// |a c| + |b s| ≤ √2: the f32 tables (c, s within u of cos, sin) add ≤ √2 u, the op's final
// rounding ≤ √2 u, rounding `want` ≤ √2 u: |err| ≤ 3√2 u < 5u.
TEST(FastVsRef, RopeRotatesByTheTableAngle) {
  const int B = 2, T = 40, heads = 3, D = 64;
  for (const auto& [name, rope] : test::rope_variants()) {
    const std::vector<float> inv = rope_inv_freq(rope, D);
    const test::RopeTablesAs<float> tab(rope, T, D);
    auto x = random_vec(size_t(B) * T * heads * D, 32);
    auto y = x;
    fast::rope_fwd(y.data(), tab.cos.data(), tab.sin.data(), B, T, heads, D, heads * D);
    std::vector<float> want(x.size());
    for (int row = 0; row < B * T; ++row)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < D / 2; ++i) {
          const double f = double(float(row % T) * inv[size_t(i)]);  // transformers' f32 angle
          const size_t lo = (size_t(row) * heads + h) * D + i, hi = lo + D / 2;
          want[lo] = float(x[lo] * std::cos(f) - x[hi] * std::sin(f));
          want[hi] = float(x[hi] * std::cos(f) + x[lo] * std::sin(f));
        }
    expect_close("rope_fwd " + name + " vs the double rotation", y, want, 0.0, 5 * kU32);
  }
}

TEST(FastVsRef, RopeBackwardInvertsForward) {
  for (const auto& [name, rope] : test::rope_variants()) {
    const test::RopeTablesAs<float> tab(rope, 33, 64);
    auto x = random_vec(size_t(2) * 33 * 3 * 64, 31);
    auto y = x;
    fast::rope_fwd(y.data(), tab.cos.data(), tab.sin.data(), 2, 33, 3, 64, 3 * 64);
    fast::rope_bwd(y.data(), tab.cos.data(), tab.sin.data(), 2, 33, 3, 64, 3 * 64);
    // Rotation then its transpose: c² + s² = 1 within 2u (f32 tables), two roundings of u each.
    expect_close("rope_bwd(rope_fwd(x)) " + name, y, x, 0.0, 8 * kU32);
  }
}

TEST(FastVsRef, RopeRejectsOddHeadDimAndMissingTables) {
  std::vector<float> x(6), cs(3, 1.0f);
  EXPECT_THROW(fast::rope_fwd(x.data(), cs.data(), cs.data(), 1, 2, 1, 3, 3), Error);
  EXPECT_THROW(ref::rope_fwd<float>(x.data(), cs.data(), cs.data(), 1, 2, 1, 3, 3), Error);
  EXPECT_THROW(fast::rope_fwd(x.data(), nullptr, cs.data(), 1, 2, 1, 2, 2), Error);
  EXPECT_THROW(ref::rope_bwd<float>(x.data(), cs.data(), nullptr, 1, 2, 1, 2, 2), Error);
}

// ---- SwiGLU ---------------------------------------------------------------------------------

// Gate values over the range where silu bends, plus a few far out where exp saturates.
std::vector<float> gate_values(size_t n, uint32_t seed) {
  auto g = random_vec(n, seed, -8.0, 8.0);
  const float extremes[] = {-100.0f, 100.0f, -90.0f, 90.0f, 0.0f, -1.2785f};
  for (size_t i = 0; i < n && i < 6; ++i) g[i * 7 % n] = extremes[i];
  return g;
}

TEST(FastVsRef, SwigluForwardAndBackward) {
  for (int F : kTailSizes)
    for (int N : {1, 3})
      for (bool packed : {false, true}) {  // packed: gate and up are halves of one (N, 2F) row
        const int ld = packed ? 2 * F : F;
        auto gu = gate_values(size_t(N) * ld + F, 40);
        auto upv = random_vec(size_t(N) * ld + F, 41, -3.0, 3.0);
        const float* gate = gu.data();
        const float* up = packed ? gu.data() + F : upv.data();
        auto dout = random_vec(size_t(N) * F, 42);
        std::vector<float> o1(size_t(N) * F), o2(o1.size());
        fast::swiglu_fwd(o1.data(), gate, up, N, F, ld);
        ref::swiglu_fwd<float>(o2.data(), gate, up, N, F, ld);
        const std::string tag = " F=" + std::to_string(F) + (packed ? " packed" : "");
        // exp within 2 ulp (fast_common.h), then 1 + e, the division and the product: ≤ 8u
        // relative. Where e^-g saturates (g ≤ -88.3) silu is below 1e-36 in magnitude and the
        // fast path may differ by that much: 1e-30 absolute.
        expect_close("swiglu_fwd" + tag, o1, o2, 8 * kU32, 1e-30);

        std::vector<float> dg1(size_t(N) * ld, 7.0f), du1(dg1.size(), 7.0f);
        std::vector<float> dg2 = dg1, du2 = du1;
        fast::swiglu_bwd(dg1.data(), du1.data(), dout.data(), gate, up, N, F, ld);
        ref::swiglu_bwd<float>(dg2.data(), du2.data(), dout.data(), gate, up, N, F, ld);
        // dgate = d·u·s·(1 + g(1 − s)) cancels near g ≈ −1.28: bound the error by 16u times
        // the size of its terms, |d·u|·s·(1 + |g|). dup = d·g·s: 8u relative.
        auto tol_dg = [&](size_t i) {
          const size_t n = i / ld, f = i % ld;
          if (f >= size_t(F)) return 0.0;  // between rows (packed layout): must be untouched
          const double g = gate[n * ld + f], u = up[n * ld + f], d = dout[n * F + f];
          const double s = 1.0 / (1.0 + std::exp(-g));
          return 16 * kU32 * std::fabs(d * u) * s * (1.0 + std::fabs(g)) + 1e-30;
        };
        expect_close_fn("swiglu_bwd dgate" + tag, dg1.data(), dg2.data(), dg1.size(), tol_dg);
        expect_close("swiglu_bwd dup" + tag, du1, du2, 8 * kU32, 1e-30);
      }
}

// ---- cross-entropy --------------------------------------------------------------------------

TEST(FastVsRef, CrossEntropyForwardAndBackward) {
  for (int V : kTailSizes)
    for (int N : {1, 5, 67}) {
      auto logits = random_vec(size_t(N) * V, 50, -10.0, 10.0);
      auto targets = random_tokens(N, V, 51);
      targets[0] = V - 1;
      if (N > 1) targets[1] = -1;  // ignored row
      if (N > 2) targets[2] = 0;
      std::vector<float> l1(N), l2(N);
      fast::cross_entropy_fwd(l1.data(), logits.data(), targets.data(), N, V);
      ref::cross_entropy_fwd<float>(l2.data(), logits.data(), targets.data(), N, V);
      const std::string tag = " V=" + std::to_string(V) + " N=" + std::to_string(N);
      // lse = m + log Σ e^(x−m): each exp within 2 ulp, summed in f32 lanes over blocks of 256
      // (≤ (256/8 + 3)·u relative) and the blocks in double, so log z is within ~37u
      // absolutely; m + log z and − x_t round at the scale of |m| + |x_t| ≤ 20 + log V:
      // ≤ (37 + 4·(30 + log V))·u absolutely.
      const double tol_loss = (37 + 4 * (30 + std::log(double(V)))) * kU32;
      expect_close("cross_entropy_fwd" + tag, l1, l2, 0.0, tol_loss);

      const float dloss = 0.37f;
      std::vector<float> d1(logits.size(), 9.0f), d2(logits.size(), 9.0f);
      fast::cross_entropy_bwd(d1.data(), logits.data(), targets.data(), dloss, N, V);
      ref::cross_entropy_bwd<float>(d2.data(), logits.data(), targets.data(), dloss, N, V);
      // p = e^(x − lse): lse off by ≤ tol_loss, exp by 2 ulp → p relative error ≤ tol_loss + 2u;
      // p ≤ 1, times dloss, minus dloss at the target (one more rounding of dloss).
      expect_close("cross_entropy_bwd" + tag, d1, d2, 0.0, (tol_loss + 4 * kU32) * dloss);

      // In place (dlogits == logits) gives the same result.
      auto inplace = logits;
      fast::cross_entropy_bwd(inplace.data(), inplace.data(), targets.data(), dloss, N, V);
      expect_equal("cross_entropy_bwd in place" + tag, inplace, d1);
    }
}

TEST(FastVsRef, CrossEntropyRejectsTargetOutOfRange) {
  std::vector<float> logits(2 * 4), losses(2);
  std::vector<int32_t> targets = {1, 4};
  EXPECT_THROW(fast::cross_entropy_fwd(losses.data(), logits.data(), targets.data(), 2, 4), Error);
  EXPECT_THROW(ref::cross_entropy_fwd<float>(losses.data(), logits.data(), targets.data(), 2, 4),
               Error);
  EXPECT_THROW(fast::cross_entropy_bwd(logits.data(), logits.data(), targets.data(), 1.0f, 2, 4),
               Error);
}

// ---- vocabulary-parallel parts (tensor parallelism) -----------------------------------------

// Part p of n items split into P nearly equal parts (as engine/model.cpp's tp_shard does).
int part_begin(int n, int P, int p) { return int(int64_t(n) * p / P); }

TEST(FastVsRef, EmbeddingPartsAreExactAndSumToTheLookup) {
  const int V = 11;
  for (int P : {1, 2, 3, 4})
    for (int C : {1, 17, 33})
      for (int N : {1, 7, 130}) {
        auto wte = random_vec(size_t(V) * C, 60);
        auto tok = random_tokens(N, V, 61);
        auto dout = random_vec(size_t(N) * C, 62);
        std::vector<float> whole(size_t(N) * C), sum(size_t(N) * C, 0.0f);
        ref::embedding_fwd<float>(whole.data(), tok.data(), wte.data(), N, C, V);
        std::vector<float> dwhole = random_vec(size_t(V) * C, 63), dparts = dwhole;
        ref::embedding_bwd<float>(dwhole.data(), dout.data(), tok.data(), N, C, V);
        for (int p = 0; p < P; ++p) {
          const int b = part_begin(V, P, p), rows = part_begin(V, P, p + 1) - b;
          const float* w = wte.data() + size_t(b) * C;
          std::vector<float> a(size_t(N) * C, 9.0f), r(size_t(N) * C, 7.0f);
          fast::embedding_part_fwd(a.data(), tok.data(), w, N, C, V, b, rows);
          ref::embedding_part_fwd<float>(r.data(), tok.data(), w, N, C, V, b, rows);
          const std::string tag = " P=" + std::to_string(P) + " p=" + std::to_string(p) +
                                  " C=" + std::to_string(C) + " N=" + std::to_string(N);
          expect_equal("embedding_part_fwd" + tag, a, r);
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += a[i];  // zeros but in one part
          std::vector<float> da(dparts.begin() + long(size_t(b) * C),
                                dparts.begin() + long(size_t(b + rows) * C)), dr = da;
          fast::embedding_part_bwd(da.data(), dout.data(), tok.data(), N, C, V, b, rows);
          ref::embedding_part_bwd<float>(dr.data(), dout.data(), tok.data(), N, C, V, b, rows);
          expect_equal("embedding_part_bwd" + tag, da, dr);
          const std::vector<float> want(dwhole.begin() + long(size_t(b) * C),
                                        dwhole.begin() + long(size_t(b + rows) * C));
          expect_equal("embedding_part_bwd rows of the whole" + tag, da, want);
        }
        expect_equal("embedding parts sum to the lookup", sum, whole);
      }
  std::vector<float> w(2 * 3), out(2 * 3);
  std::vector<int32_t> tok = {1, 3};
  EXPECT_THROW(fast::embedding_part_fwd(out.data(), tok.data(), w.data(), 2, 3, 4, 3, 2), Error);
  EXPECT_THROW(ref::embedding_part_fwd<float>(out.data(), tok.data(), w.data(), 2, 3, 4, -1, 2), Error);
  tok = {1, 4};  // outside the vocabulary, even though no part would hold it
  EXPECT_THROW(fast::embedding_part_fwd(out.data(), tok.data(), w.data(), 2, 3, 4, 0, 2), Error);
}

TEST(FastVsRef, CrossEntropyPartsCombineToTheWholeRow) {
  for (int V : {7, 33, 4097})
    for (int P : {1, 2, 3})
      for (int N : {1, 5, 67}) {
        auto logits = random_vec(size_t(N) * V, 70, -10.0, 10.0);
        auto targets = random_tokens(N, V, 71);
        targets[0] = V - 1;
        if (N > 1) targets[1] = -1;
        if (N > 2) targets[2] = 0;
        std::vector<float> whole_loss(N), whole_d(logits.size());
        const float dloss = 0.37f;
        ref::cross_entropy_fwd<float>(whole_loss.data(), logits.data(), targets.data(), N, V);
        ref::cross_entropy_bwd<float>(whole_d.data(), logits.data(), targets.data(), dloss, N, V);
        // Each part's logits (N, Vp): columns [b, b + Vp) of the whole rows.
        std::vector<std::vector<float>> parts(static_cast<size_t>(P));
        std::vector<float> stats_all(size_t(P) * N * 2), stats_ref(size_t(P) * N * 2);
        const std::string tag = " V=" + std::to_string(V) + " P=" + std::to_string(P) +
                                " N=" + std::to_string(N);
        const double tol_loss = (37 + 4 * (30 + std::log(double(V)))) * kU32;  // as above
        for (int p = 0; p < P; ++p) {
          const int b = part_begin(V, P, p), Vp = part_begin(V, P, p + 1) - b;
          auto& part = parts[size_t(p)];
          part.resize(size_t(N) * Vp);
          for (int n = 0; n < N; ++n)
            std::copy_n(logits.begin() + long(size_t(n) * V + b), Vp, part.begin() + long(size_t(n) * Vp));
          fast::cross_entropy_part_fwd(stats_all.data() + size_t(p) * N * 2, part.data(),
                                       targets.data(), N, Vp, b, V);
          ref::cross_entropy_part_fwd<float>(stats_ref.data() + size_t(p) * N * 2, part.data(),
                                             targets.data(), N, Vp, b, V);
        }
        expect_close("cross_entropy_part_fwd" + tag, stats_all, stats_ref, 0.0, tol_loss);
        std::vector<float> l1(N), l2(N), lse1(N), lse2(N);
        fast::cross_entropy_combine(l1.data(), lse1.data(), stats_all.data(), targets.data(), N, P);
        ref::cross_entropy_combine<float>(l2.data(), lse2.data(), stats_ref.data(), targets.data(), N, P);
        expect_close("cross_entropy_combine" + tag, l1, l2, 0.0, 2 * tol_loss);
        // The parts' loss is the whole row's: the part lse round once more to f32 (≤ 30u at
        // |lse| ≤ 20 + log V) before the double combination.
        expect_close("cross_entropy parts vs whole" + tag, l1, whole_loss, 0.0, 2 * tol_loss);
        for (int p = 0; p < P; ++p) {
          const int b = part_begin(V, P, p), Vp = part_begin(V, P, p + 1) - b;
          const auto& part = parts[size_t(p)];
          std::vector<float> d1(part.size(), 9.0f), d2(part.size(), 9.0f), want(part.size());
          fast::cross_entropy_part_bwd(d1.data(), part.data(), lse1.data(), targets.data(), dloss, N,
                                       Vp, b, V);
          ref::cross_entropy_part_bwd<float>(d2.data(), part.data(), lse1.data(), targets.data(),
                                             dloss, N, Vp, b, V);
          expect_close("cross_entropy_part_bwd" + tag, d1, d2, 0.0, (tol_loss + 4 * kU32) * dloss);
          for (int n = 0; n < N; ++n)
            std::copy_n(whole_d.begin() + long(size_t(n) * V + b), Vp, want.begin() + long(size_t(n) * Vp));
          expect_close("cross_entropy_part_bwd vs whole" + tag, d1, want, 0.0,
                       (3 * tol_loss + 4 * kU32) * dloss);
          auto inplace = part;
          fast::cross_entropy_part_bwd(inplace.data(), inplace.data(), lse1.data(), targets.data(),
                                       dloss, N, Vp, b, V);
          expect_equal("cross_entropy_part_bwd in place" + tag, inplace, d1);
        }
      }
}

// ---- elementwise, casts, sums ---------------------------------------------------------------

const size_t kLongSizes[] = {0, 1, 7, 15, 16, 17, 31, 33, 4097, 100003};  // > one task chunk

TEST(FastVsRef, AddAndScaleAreExact) {
  // One f32 operation per element in both: bit-exact, including in place.
  for (size_t n : kLongSizes) {
    auto a = random_vec(n, 60), b = random_vec(n, 61);
    std::vector<float> o1(n), o2(n);
    fast::add(o1.data(), a.data(), b.data(), n);
    ref::add<float>(o2.data(), a.data(), b.data(), n);
    expect_equal("add n=" + std::to_string(n), o1, o2);
    auto in_place = a;
    fast::add(in_place.data(), in_place.data(), b.data(), n);
    expect_equal("add in place n=" + std::to_string(n), in_place, o2);
    auto s1 = a, s2 = a;
    fast::scale(s1.data(), -0.3f, n);
    ref::scale<float>(s2.data(), -0.3f, n);
    expect_equal("scale n=" + std::to_string(n), s1, s2);
  }
}

TEST(FastVsRef, CastsAreBitExact) {
  for (size_t n : kLongSizes) {
    auto x = random_vec(n, 70, -1e4, 1e4);
    // Special values and rounding ties at the front.
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::bit_cast<float>(0x7f800001u),  // signalling NaN, low payload
                              INFINITY,
                              -INFINITY,
                              0.0f,
                              -0.0f,
                              std::bit_cast<float>(0x3f808000u),  // tie, rounds to even (down)
                              std::bit_cast<float>(0x3f818000u),  // tie, rounds to even (up)
                              std::numeric_limits<float>::max(),  // rounds to inf
                              std::numeric_limits<float>::denorm_min()};
    for (size_t i = 0; i < n && i < std::size(specials); ++i) x[i] = specials[i];
    std::vector<uint16_t> h1(n), h2(n);
    fast::cast_f32_to_bf16(h1.data(), x.data(), n);
    ref::cast_f32_to_bf16(h2.data(), x.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(h1[i], h2[i]) << "cast_f32_to_bf16 n=" << n << " at " << i << " x=" << x[i];
      ASSERT_EQ(h1[i], f32_to_bf16_bits(x[i])) << "differs from core/dtype.h at " << i;
    }
    std::vector<float> f1(n), f2(n);
    fast::cast_bf16_to_f32(f1.data(), h1.data(), n);
    ref::cast_bf16_to_f32(f2.data(), h1.data(), n);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(f1[i]), std::bit_cast<uint32_t>(f2[i]))
          << "cast_bf16_to_f32 at " << i;
    // The fused round trip: the two casts' bits, fast and reference, and in place.
    std::vector<float> r1(n), r2(n), r3(x);
    fast::round_to_bf16(r1.data(), x.data(), n);
    ref::round_to_bf16(r2.data(), x.data(), n);
    fast::round_to_bf16(r3.data(), r3.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(r1[i]), std::bit_cast<uint32_t>(f1[i]))
          << "round_to_bf16 n=" << n << " at " << i << " x=" << x[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(r2[i]), std::bit_cast<uint32_t>(f1[i])) << "ref at " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(r3[i]), std::bit_cast<uint32_t>(f1[i])) << "in place " << i;
    }
  }
}

TEST(FastVsRef, SumsInDouble) {
  for (size_t n : {size_t(0), size_t(1), size_t(17), size_t(4097), size_t(65536), size_t(200003)}) {
    auto x = random_vec(n, 80, -3.0, 5.0);
    double s1 = -1, s2 = -2, q1 = -1, q2 = -2;
    fast::sum(&s1, x.data(), n);
    ref::sum<float>(&s2, x.data(), n);
    fast::sum_squares(&q1, x.data(), n);
    ref::sum_squares<float>(&q2, x.data(), n);
    double abs_sum = 0, sq_sum = 0;
    for (float v : x) {
      abs_sum += std::fabs(double(v));
      sq_sum += double(v) * v;
    }
    // Two double summations in different orders: each within n·2^-53·Σ|terms| of the exact sum.
    const double u64 = std::ldexp(1.0, -53);
    EXPECT_NEAR(s1, s2, 2 * n * u64 * abs_sum + 1e-300) << "sum n=" << n;
    EXPECT_NEAR(q1, q2, 2 * n * u64 * sq_sum + 1e-300) << "sum_squares n=" << n;
    if (n == 0) {
      EXPECT_EQ(s1, 0.0);
      EXPECT_EQ(q1, 0.0);
    }
  }
  // A case that f32 accumulation gets visibly wrong: 1e8 + 200003 ones.
  std::vector<float> big(200004, 1.0f);
  big[0] = 1e8f;
  double s = 0;
  fast::sum(&s, big.data(), big.size());
  EXPECT_EQ(s, 1e8 + 200003.0);
}

}  // namespace
}  // namespace strata
