// Every CUDA op against the CPU scalar reference (kernels/cpu/ref_ops.h), element by element, at
// sizes that hit the warp (32), block (256) and tile (64 rows) tails, on strided layouts.
//
// Tolerances are multiples of u = 2^-24 (f32 unit roundoff), each derived next to its test:
//  * exact ops (embedding, add, scale, casts): bit-equal to ref<float>;
//  * ops the CUDA path computes in double with the reference's formulas (RMSNorm, rotary,
//    SwiGLU, cross-entropy, the sums): against ref<double>, one or two f32 roundings (plus a tiny
//    floor for double-precision differences: summation order, CUDA's vs glibc's libm);
//  * f32 GEMMs (cuBLASLt, FMA algorithms, no TF32): the dot-product bound γ_K·Σ|a b|, γ_K ≈ K·u;
//  * f32 attention: the bounds the CPU fast path is held to (tests/kernels/test_fast_gemm.cpp).
// Each test skips, with the reason, when no CUDA device is present. Every comparison also records
// the op's largest relative error as a test property (`max_rel_err.<op>`, the largest over the
// shapes of the test), which `--gtest_output=json` carries into scripts/gpu-check.sh's results.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ref_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/op_test_util.h"

namespace strata {
namespace {

namespace ref = cpu::ref;
using test::AttnLayout;
using test::AttnShape;
using test::Gpu;
using test::kU32;
using test::max_abs;
using test::random_tokens;
using test::random_vec;
using test::to_double;

std::string tag(std::initializer_list<std::pair<const char*, long long>> kv) {
  std::string s;
  for (const auto& [k, v] : kv) s += std::string(" ") + k + "=" + std::to_string(v);
  return s;
}

// Records the largest relative error of got against want as the test property
// max_rel_err.<op>, op being `what` up to its first key=value tag: max_i |got_i − want_i| / |want_i|,
// each |want_i| floored at 1e-6 · max_j |want_j| (and at FLT_MIN) so that elements that cancel to
// near zero, whose tolerance is absolute, do not stand for the op. Equal values (infinities
// included) and NaN against NaN count 0; NaN against a number counts infinity. The property keeps
// the largest value over the calls of one test (several shapes of the same op).
template <class W>
void record_rel_error(const std::string& what, const std::vector<float>& got, const std::vector<W>& want) {
  double scale = 0;
  for (const W& w : want)
    if (std::isfinite(double(w))) scale = std::max(scale, std::fabs(double(w)));
  const double floor = std::max(1e-6 * scale, double(std::numeric_limits<float>::min()));
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double g = got[i], w = double(want[i]);
    if (g == w || (std::isnan(g) && std::isnan(w))) continue;
    worst = std::max(worst, std::isnan(g - w) ? INFINITY : std::fabs(g - w) / std::max(std::fabs(w), floor));
  }
  std::string op;
  for (size_t i = 0; i < what.size(); ++i) {
    if (what[i] == ' ' && what.find('=', i) != std::string::npos &&
        what.find('=', i) < what.find(' ', i + 1))
      break;  // " key=value": the tags start here
    op += std::isalnum(static_cast<unsigned char>(what[i])) ? what[i] : '_';
  }
  static std::map<std::string, double> largest;  // per test: test name + op
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  double& m = largest[std::string(info->test_suite_name()) + "." + info->name() + "/" + op];
  m = std::max(m, worst);
  char text[32];
  std::snprintf(text, sizeof text, "%.3e", m);
  testing::Test::RecordProperty("max_rel_err." + op, text);
}

// Expects got == want bit for bit (test::expect_equal), recording the relative error.
void expect_equal(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  record_rel_error(what, got, want);
  test::expect_equal(what, got, want);
}

// test::expect_close (|got − want| ≤ atol + rtol |want|), recording the relative error.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                  double rtol, double atol) {
  record_rel_error(what, got, want);
  test::expect_close(what, got, want, rtol, atol);
}

// Expects |got[i] − want[i]| ≤ tol(i) (want from ref<double>); reports the count of failures and
// the worst element. NaN fails unless both are NaN; equal infinities pass. Records the relative
// error.
void expect_near(const std::string& what, const std::vector<float>& got,
                 const std::vector<double>& want, const std::function<double(size_t)>& tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  record_rel_error(what, got, want);
  size_t bad = 0, worst = 0;
  double worst_ratio = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i], t = tol(i);
    bool ok;
    double ratio;
    if (std::isnan(g) || std::isnan(w)) {
      ok = std::isnan(g) && std::isnan(w);
      ratio = ok ? 0 : INFINITY;
    } else if (g == w) {
      ok = true;
      ratio = 0;
    } else {
      const double err = std::fabs(g - w);
      ok = err <= t;
      ratio = err / std::max(t, 1e-300);
    }
    if (!ok) ++bad;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (got.empty()) return;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements out of tolerance; worst [" << worst << "] got " << got[worst]
                     << " want " << want[worst] << " tol " << tol(worst);
}

std::vector<double> ref_sum_abs_linear(const std::vector<float>& a, const std::vector<float>& b, int N,
                                       int IC, int OC) {
  std::vector<double> aa(a.size()), bb(b.size()), out(size_t(N) * OC);
  for (size_t i = 0; i < a.size(); ++i) aa[i] = std::fabs(double(a[i]));
  for (size_t i = 0; i < b.size(); ++i) bb[i] = std::fabs(double(b[i]));
  ref::linear_fwd<double>(out.data(), aa.data(), bb.data(), N, IC, OC);
  return out;
}

// Runs fn and expects the next synchronize() of g's stream to throw an Error whose message holds
// every fragment; then the stream must be clean again.
void expect_stream_error(Gpu& g, const std::function<void()>& fn, std::vector<std::string> fragments) {
  fn();
  try {
    g.s->synchronize();
    ADD_FAILURE() << "synchronize() did not report the error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
  EXPECT_NO_THROW(g.s->synchronize()) << "the error must be cleared once reported";
}

// ---- embedding ------------------------------------------------------------------------------

TEST(CudaOps, EmbeddingForwardIsExact) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const int V = 11;
  for (int C : {1, 7, 257, 4097})
    for (int N : {1, 7, 130}) {
      auto wte = random_vec(size_t(V) * C, 1);
      auto tok = random_tokens(N, V, 2);
      std::vector<float> want(size_t(N) * C);
      ref::embedding_fwd<float>(want.data(), tok.data(), wte.data(), N, C, V);
      Buffer dwte = g.upload(wte), dtok = g.upload(tok), out = g.dev->alloc(want.size() * 4, "out");
      g.ops().embedding_fwd(*g.s, out.as<float>(), dtok.as<int32_t>(), dwte.as<float>(), N, C, V);
      expect_equal("embedding_fwd" + tag({{"N", N}, {"C", C}}), g.download<float>(out, want.size()), want);
    }
}

TEST(CudaOps, EmbeddingBackwardIsExactAndAccumulates) {
  // The kernel adds each row into its dwte row in token order, one f32 addition each, starting
  // from the existing dwte: the reference's sequence exactly, so bit-equal. Few tokens over many
  // rows (long runs), and a large vocabulary (a 16-bit sort).
  STRATA_REQUIRE_CUDA();
  Gpu g;
  struct Case { int V, N, C; };
  for (const Case c : {Case{5, 1, 7}, Case{5, 257, 1}, Case{5, 1000, 33}, Case{3, 700, 300},
                       Case{50000, 300, 17}, Case{1, 64, 4097}}) {
    auto dout = random_vec(size_t(c.N) * c.C, 3);
    auto tok = random_tokens(c.N, c.V, 4);
    auto want = random_vec(size_t(c.V) * c.C, 5);  // nonzero: the op must accumulate
    Buffer ddwte = g.upload(want), ddout = g.upload(dout), dtok = g.upload(tok);
    ref::embedding_bwd<float>(want.data(), dout.data(), tok.data(), c.N, c.C, c.V);
    g.ops().embedding_bwd(*g.s, ddwte.as<float>(), ddout.as<float>(), dtok.as<int32_t>(), c.N, c.C, c.V);
    expect_equal("embedding_bwd" + tag({{"V", c.V}, {"N", c.N}, {"C", c.C}}),
                 g.download<float>(ddwte, want.size()), want);
  }
}

TEST(CudaOps, EmbeddingReportsOutOfRangeTokensAtSynchronize) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const int V = 4, C = 3;
  Buffer wte = g.upload(random_vec(V * C, 1)), out = g.dev->alloc(2 * C * 4, "out");
  Buffer dout = g.upload(random_vec(2 * C, 2)), dwte = g.upload(std::vector<float>(V * C, 0.0f));
  Buffer neg = g.upload(std::vector<int32_t>{1, -1}), big = g.upload(std::vector<int32_t>{4, 1});
  expect_stream_error(g, [&] {
    g.ops().embedding_fwd(*g.s, out.as<float>(), neg.as<int32_t>(), wte.as<float>(), 2, C, V);
  }, {"embedding_fwd", "-1", "row 1"});
  expect_stream_error(g, [&] {
    g.ops().embedding_bwd(*g.s, dwte.as<float>(), dout.as<float>(), big.as<int32_t>(), 2, C, V);
  }, {"embedding_bwd", "token 4", "row 0", "[0, 4)"});
}

// ---- RMSNorm --------------------------------------------------------------------------------

TEST(CudaOps, RmsnormForward) {
  // rstd: Σx² in double (any order: relative error ~C·2^-53), 1/sqrt in double, one rounding to
  // f32: ≤ u (2u allowed). out = (x·r)·w in f32 with the rounded r: r's u plus two roundings
  // against the reference in double: ≤ 3u (4u allowed).
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (int C : {1, 7, 33, 257, 4097})
    for (int N : {1, 7, 33}) {
      auto x = random_vec(size_t(N) * C, 10, -2.0, 2.0);
      auto w = random_vec(C, 11, 0.5, 1.5);
      std::vector<double> want(size_t(N) * C), want_r(N);
      ref::rmsnorm_fwd<double>(want.data(), want_r.data(), to_double(x).data(), to_double(w).data(), N,
                               C, double(1e-5f));
      Buffer dx = g.upload(x), dw = g.upload(w), out = g.dev->alloc(want.size() * 4, "out"),
             r = g.dev->alloc(N * 4, "rstd");
      g.ops().rmsnorm_fwd(*g.s, out.as<float>(), r.as<float>(), dx.as<float>(), dw.as<float>(), N, C, 1e-5f);
      const auto got_r = g.download<float>(r, N), got = g.download<float>(out, want.size());
      const std::string t = tag({{"N", N}, {"C", C}});
      expect_near("rmsnorm rstd" + t, got_r, want_r, [&](size_t i) { return 2 * kU32 * std::fabs(want_r[i]); });
      expect_near("rmsnorm out" + t, got, want, [&](size_t i) { return 4 * kU32 * std::fabs(want[i]) + 1e-30; });
    }
}

TEST(CudaOps, RmsnormBackwardAccumulatesDxAndDw) {
  // dx: the per-element term r·(w·dout − y·mean) is computed in double from the f32 inputs (as
  // the reference) and rounded, then added to dx in f32: ≤ u·|term| + u·|result|. dw: Σ_n dout·y
  // in double over fixed row chunks, rounded once and added to dw: the same two roundings. A
  // floor of 1e-12·max|want| covers the double sums' order (~C·2^-53 of their magnitude).
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (int C : {1, 7, 33, 257, 1031})
    for (int N : {1, 7, 300, 513}) {
      auto x = random_vec(size_t(N) * C, 20, -2.0, 2.0);
      auto w = random_vec(C, 21, 0.5, 1.5);
      auto dout = random_vec(size_t(N) * C, 22);
      auto dx0 = random_vec(size_t(N) * C, 23);
      auto dw0 = random_vec(C, 24);
      std::vector<float> out(size_t(N) * C), rstd(N);
      ref::rmsnorm_fwd<float>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      auto want_dx = to_double(dx0), want_dw = to_double(dw0);
      ref::rmsnorm_bwd<double>(want_dx.data(), want_dw.data(), to_double(dout).data(), to_double(x).data(),
                               to_double(w).data(), to_double(rstd).data(), N, C);
      Buffer ddx = g.upload(dx0), ddw = g.upload(dw0), ddout = g.upload(dout), dxx = g.upload(x),
             dww = g.upload(w), dr = g.upload(rstd);
      g.ops().rmsnorm_bwd(*g.s, ddx.as<float>(), ddw.as<float>(), ddout.as<float>(), dxx.as<float>(),
                          dww.as<float>(), dr.as<float>(), N, C);
      const std::string t = tag({{"N", N}, {"C", C}});
      const double floor_dx = 1e-12 * test::max_abs(std::vector<float>(want_dx.begin(), want_dx.end()));
      const double floor_dw = 1e-12 * test::max_abs(std::vector<float>(want_dw.begin(), want_dw.end()));
      expect_near("rmsnorm_bwd dx" + t, g.download<float>(ddx, dx0.size()), want_dx, [&](size_t i) {
        return 2 * kU32 * (std::fabs(want_dx[i] - dx0[i]) + std::fabs(want_dx[i])) + floor_dx;
      });
      expect_near("rmsnorm_bwd dw" + t, g.download<float>(ddw, dw0.size()), want_dw, [&](size_t i) {
        return 2 * kU32 * (std::fabs(want_dw[i] - dw0[i]) + std::fabs(want_dw[i])) + floor_dw;
      });
    }
}

// ---- linear (cuBLASLt) ----------------------------------------------------------------------

struct LinearShape {
  int N, IC, OC;
};
const LinearShape kLinearShapes[] = {{1, 1, 1}, {7, 33, 17}, {67, 129, 65}, {130, 256, 384}, {3, 4097, 5},
                                     {4, 0, 3}};

TEST(CudaOps, LinearForwardWithinTheDotProductBound) {
  // |fl(Σ a b) − Σ a b| ≤ γ_K·Σ|a b| with γ_K ≈ K·u for any summation order (blocked, split-K):
  // (IC + 2)·u·Σ|in||w|, plus the reference's own rounding. Pointers at offset 0 and offset 1
  // float (4-byte aligned only): cuBLASLt must be asked for algorithms that accept them.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (const LinearShape s : kLinearShapes)
    for (int offset : {0, 1}) {
      auto in = random_vec(size_t(s.N) * s.IC + offset, 30);
      auto w = random_vec(size_t(s.OC) * s.IC + offset, 31);
      std::vector<float> in_v(in.begin() + offset, in.end()), w_v(w.begin() + offset, w.end());
      std::vector<double> want(size_t(s.N) * s.OC);
      ref::linear_fwd<double>(want.data(), to_double(in_v).data(), to_double(w_v).data(), s.N, s.IC, s.OC);
      const auto mag = ref_sum_abs_linear(in_v, w_v, s.N, s.IC, s.OC);
      Buffer din = g.upload(in), dw = g.upload(w),
             out = g.upload(std::vector<float>(want.size() + offset, 123.0f));  // stale contents
      g.ops().linear_fwd(*g.s, test::at<float>(out, offset), test::at<float>(din, offset),
                         test::at<float>(dw, offset), s.N, s.IC, s.OC);
      auto got = g.download<float>(out, want.size() + offset);
      got.erase(got.begin(), got.begin() + offset);
      expect_near("linear_fwd" + tag({{"N", s.N}, {"IC", s.IC}, {"OC", s.OC}, {"offset", offset}}), got,
                  want, [&](size_t i) { return (s.IC + 2) * kU32 * mag[i] + kU32 * std::fabs(want[i]); });
    }
}

TEST(CudaOps, LinearBackwardWithinTheDotProductBound) {
  // din = dout·w: (OC + 2)·u·Σ|dout||w|. dw += dout^T·in: (N + 2)·u·Σ|dout||in| plus the
  // accumulation's rounding u·|result| (dw starts nonzero). Also with din = null (dw only).
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (const LinearShape s : kLinearShapes)
    for (bool with_din : {true, false}) {
      auto in = random_vec(size_t(s.N) * s.IC, 40);
      auto w = random_vec(size_t(s.OC) * s.IC, 41);
      auto dout = random_vec(size_t(s.N) * s.OC, 42);
      auto dw0 = random_vec(size_t(s.OC) * s.IC, 43);
      std::vector<double> want_din(size_t(s.N) * s.IC), want_dw = to_double(dw0);
      ref::linear_bwd<double>(want_din.data(), want_dw.data(), to_double(dout).data(), to_double(in).data(),
                              to_double(w).data(), s.N, s.IC, s.OC);
      // Σ|dout||w| (N, IC): a forward product of |dout| (N, OC) with |w|^T viewed as (IC, OC).
      std::vector<float> wt(size_t(s.IC) * s.OC), doutt(size_t(s.OC) * s.N), in_t(size_t(s.IC) * s.N);
      for (int o = 0; o < s.OC; ++o)
        for (int i = 0; i < s.IC; ++i) wt[size_t(i) * s.OC + o] = w[size_t(o) * s.IC + i];
      for (int n = 0; n < s.N; ++n) {
        for (int o = 0; o < s.OC; ++o) doutt[size_t(o) * s.N + n] = dout[size_t(n) * s.OC + o];
        for (int i = 0; i < s.IC; ++i) in_t[size_t(i) * s.N + n] = in[size_t(n) * s.IC + i];
      }
      const auto mag_din = ref_sum_abs_linear(dout, wt, s.N, s.OC, s.IC);
      const auto mag_dw = ref_sum_abs_linear(doutt, in_t, s.OC, s.N, s.IC);
      Buffer ddin = g.upload(std::vector<float>(want_din.size(), 123.0f)), ddw = g.upload(dw0),
             ddout = g.upload(dout), dinp = g.upload(in), dww = g.upload(w);
      g.ops().linear_bwd(*g.s, with_din ? ddin.as<float>() : nullptr, ddw.as<float>(), ddout.as<float>(),
                         dinp.as<float>(), dww.as<float>(), s.N, s.IC, s.OC);
      const std::string t = tag({{"N", s.N}, {"IC", s.IC}, {"OC", s.OC}, {"din", with_din}});
      if (with_din)
        expect_near("linear_bwd din" + t, g.download<float>(ddin, want_din.size()), want_din, [&](size_t i) {
          return (s.OC + 2) * kU32 * mag_din[i] + kU32 * std::fabs(want_din[i]);
        });
      else
        EXPECT_EQ(g.download<float>(ddin, want_din.size()), std::vector<float>(want_din.size(), 123.0f))
            << "din = null must leave the buffer alone" << t;
      expect_near("linear_bwd dw" + t, g.download<float>(ddw, want_dw.size()), want_dw, [&](size_t i) {
        return (s.N + 2) * kU32 * mag_dw[i] + 2 * kU32 * (std::fabs(want_dw[i]) + std::fabs(dw0[i]));
      });
    }
}

TEST(CudaOps, Bf16GemmWithinItsBound) {
  // out (m, n) = a (m, k) · b^T (n, k), bf16 in and out, f32 accumulation (the benchmark's path):
  // the f32 dot-product bound (k + 2)·u·Σ|a b| plus the bf16 rounding of the result (half an
  // ulp, 2^-9 relative; 2^-8 allowed). Every candidate cuBLASLt offers, as the benchmark times
  // them all; the reference is ref<double> on the bf16 values.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  struct Shape { int m, n, k; };
  for (const Shape sh : {Shape{1, 1, 1}, Shape{7, 33, 17}, Shape{130, 256, 384}, Shape{64, 64, 4097}}) {
    auto a = random_vec(size_t(sh.m) * sh.k, 130), b = random_vec(size_t(sh.n) * sh.k, 131);
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    ref::cast_f32_to_bf16(a16.data(), a.data(), a.size());
    ref::cast_f32_to_bf16(b16.data(), b.data(), b.size());
    ref::cast_bf16_to_f32(a.data(), a16.data(), a.size());  // the values the GPU multiplies
    ref::cast_bf16_to_f32(b.data(), b16.data(), b.size());
    std::vector<double> want(size_t(sh.m) * sh.n);
    ref::linear_fwd<double>(want.data(), to_double(a).data(), to_double(b).data(), sh.m, sh.k, sh.n);
    const auto mag = ref_sum_abs_linear(a, b, sh.m, sh.k, sh.n);
    Buffer da = g.upload(a16), db = g.upload(b16), out = g.dev->alloc(want.size() * 2, "out");
    const int candidates = cuda::gemm_bf16_candidates(*g.s, out.as<uint16_t>(), da.as<uint16_t>(),
                                                      db.as<uint16_t>(), sh.m, sh.n, sh.k);
    ASSERT_GE(candidates, 1);
    for (int c = 0; c < candidates; ++c) {
      cuda::gemm_bf16(*g.s, out.as<uint16_t>(), da.as<uint16_t>(), db.as<uint16_t>(), sh.m, sh.n, sh.k, c);
      const auto got16 = g.download<uint16_t>(out, want.size());
      std::vector<float> got(got16.size());
      ref::cast_bf16_to_f32(got.data(), got16.data(), got16.size());
      expect_near("gemm_bf16" + tag({{"m", sh.m}, {"n", sh.n}, {"k", sh.k}, {"candidate", c}}), got, want,
                  [&](size_t i) { return (sh.k + 2) * kU32 * mag[i] + std::ldexp(1.0, -8) * std::fabs(want[i]); });
    }
  }
}

// ---- rotary ---------------------------------------------------------------------------------

TEST(CudaOps, RopeForwardAndBackwardMatchTheReference) {
  // The kernel reads the same f32 cos/sin tables as the reference and runs its exact sequence of
  // IEEE double operations with round-to-nearest intrinsics and one final rounding: equal to
  // ref<float> bit for bit, for every rope type (the tables carry the type). The row padding
  // (ld > heads·D) must be left untouched.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (const auto& [name, rope] : test::rope_variants())
    for (int D : {2, 8, 64, 128})
      for (bool inverse : {false, true}) {
        const int B = 2, T = 37, heads = 3, ld = heads * D + 5;  // T > llama3's original 32
        const test::RopeTablesAs<float> tab(rope, T, D);
        auto x = random_vec(size_t(B) * T * ld, 50, -2.0, 2.0);
        auto want = x;
        const float *cs = tab.cos.data(), *sn = tab.sin.data();
        if (inverse) ref::rope_bwd<float>(want.data(), cs, sn, B, T, heads, D, ld);
        else ref::rope_fwd<float>(want.data(), cs, sn, B, T, heads, D, ld);
        Buffer dx = g.upload(x), dcos = g.upload(tab.cos), dsin = g.upload(tab.sin);
        const float *dcs = dcos.as<float>(), *dsn = dsin.as<float>();
        if (inverse) g.ops().rope_bwd(*g.s, dx.as<float>(), dcs, dsn, B, T, heads, D, ld);
        else g.ops().rope_fwd(*g.s, dx.as<float>(), dcs, dsn, B, T, heads, D, ld);
        const auto got = g.download<float>(dx, x.size());
        expect_equal("rope " + name + tag({{"D", D}, {"inverse", inverse}}), got, want);
        for (int row = 0; row < B * T; ++row)
          for (int c = heads * D; c < ld; ++c)
            ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(row) * ld + c]), std::bit_cast<uint32_t>(x[size_t(row) * ld + c]))
                << "rope wrote into the row padding";
      }
}

// ---- attention ------------------------------------------------------------------------------

// Query blocks of 64 rows: T = 1, 63, 64, 65, 130 hit the tails; D not a multiple of 4 (lanes
// with partial dims), D up to the kernel's 256; GQA groups of 1, 2 and 4.
const AttnShape kAttnShapes[] = {{1, 1, 1, 1, 8},    {2, 7, 2, 1, 16},   {3, 17, 4, 1, 6},
                                 {2, 64, 2, 2, 16},  {1, 65, 4, 2, 64},  {1, 130, 8, 2, 64},
                                 {1, 63, 4, 4, 100}, {1, 70, 2, 1, 128}, {1, 33, 2, 2, 256},
                                 {2, 20, 4, 1, 2}};

std::string attn_tag(const AttnShape& s, bool packed) {
  return tag({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"KVH", s.KVH}, {"D", s.D}}) + (packed ? " packed" : " separate");
}

// Worst-case f32 error of a score s = (q·k)/sqrt(D) with |q|, |k| ≤ 1: (D + 1)·u·sqrt(D);
// probabilities inherit it plus 2 ulp from expf (the bound of tests/kernels/test_fast_gemm.cpp).
double score_error(int D) { return (D + 1) * kU32 * std::sqrt(double(D)) + 2 * kU32; }

TEST(CudaOps, AttentionForward) {
  // out = Σ p v (|v| ≤ 1): the score error plus an f32 sum over ≤ T keys ((T + 2)·u), doubled;
  // lse: the score error, the f32 sum of the exponentials and one rounding of |lse|.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (const AttnShape& s : kAttnShapes)
    for (bool packed : {true, false}) {
      const AttnLayout L(s, packed);
      auto qkv = random_vec(L.size, 60);
      const size_t n_out = size_t(s.B) * s.T * s.H * s.D, n_lse = size_t(s.B) * s.H * s.T;
      std::vector<float> want(n_out), want_lse(n_lse);
      ref::attention_fwd<float>(want.data(), want_lse.data(), qkv.data() + L.q_off, qkv.data() + L.k_off,
                                qkv.data() + L.v_off, s.B, s.T, s.H, s.KVH, s.D, L.ldq, L.ldkv);
      Buffer d = g.upload(qkv), out = g.dev->alloc(n_out * 4, "out"), lse = g.dev->alloc(n_lse * 4, "lse");
      g.ops().attention_fwd(*g.s, out.as<float>(), lse.as<float>(), test::at<float>(d, L.q_off),
                            test::at<float>(d, L.k_off), test::at<float>(d, L.v_off), s.B, s.T, s.H,
                            s.KVH, s.D, L.ldq, L.ldkv);
      const double e = score_error(s.D) + (s.T + 2) * kU32;
      expect_close("attention_fwd out" + attn_tag(s, packed), g.download<float>(out, n_out), want, 0.0, 2 * e);
      expect_close("attention_fwd lse" + attn_tag(s, packed), g.download<float>(lse, n_lse), want_lse,
                         2 * kU32, 2 * e);
    }
}

TEST(CudaOps, AttentionBackward) {
  // Every gradient is linear in P and dS; P carries the score error, dP = dO·V and
  // delta = rowsum(dO∘O) are f32 dot products over D, and the gradients sum over ≤ T·(H/KVH)
  // rows: normwise, relative to the tensor's largest element, with a factor 8 for the chain.
  // Gradients land in a buffer of the same layout prefilled with a sentinel: padding keeps it.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (const AttnShape& s : kAttnShapes)
    for (bool packed : {true, false}) {
      const AttnLayout L(s, packed);
      auto qkv = random_vec(L.size, 70);
      const size_t n_out = size_t(s.B) * s.T * s.H * s.D, n_lse = size_t(s.B) * s.H * s.T;
      std::vector<float> out(n_out), lse(n_lse);
      const float *q = qkv.data() + L.q_off, *k = qkv.data() + L.k_off, *v = qkv.data() + L.v_off;
      ref::attention_fwd<float>(out.data(), lse.data(), q, k, v, s.B, s.T, s.H, s.KVH, s.D, L.ldq, L.ldkv);
      auto dout = random_vec(n_out, 71);
      std::vector<float> want(L.size, 7.0f);
      ref::attention_bwd<float>(want.data() + L.q_off, want.data() + L.k_off, want.data() + L.v_off,
                                dout.data(), out.data(), lse.data(), q, k, v, s.B, s.T, s.H, s.KVH, s.D,
                                L.ldq, L.ldkv);
      Buffer dqkv = g.upload(qkv), dd = g.upload(dout), dfwd = g.upload(out), dlse = g.upload(lse),
             grads = g.upload(std::vector<float>(L.size, 7.0f));
      g.ops().attention_bwd(*g.s, test::at<float>(grads, L.q_off), test::at<float>(grads, L.k_off),
                            test::at<float>(grads, L.v_off), dd.as<float>(), dfwd.as<float>(),
                            dlse.as<float>(), test::at<float>(dqkv, L.q_off), test::at<float>(dqkv, L.k_off),
                            test::at<float>(dqkv, L.v_off), s.B, s.T, s.H, s.KVH, s.D, L.ldq, L.ldkv);
      const int G = s.H / s.KVH;
      const double rel = 8 * (score_error(s.D) + (s.T * G + 2 * s.D + 8) * kU32);
      expect_close("attention_bwd dq/dk/dv" + attn_tag(s, packed), g.download<float>(grads, L.size),
                         want, 0.0, rel * max_abs(want));
    }
}

TEST(CudaOps, AttentionRejectsBadShapesAtSynchronize) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  Buffer buf = g.dev->alloc(1 << 20, "buf");
  float* p = buf.as<float>();
  expect_stream_error(g, [&] { g.ops().attention_fwd(*g.s, p, p, p, p, p, 1, 2, 3, 2, 4, 12, 8); },
                      {"cuda::attention_fwd", "not a multiple"});
  expect_stream_error(g, [&] { g.ops().attention_fwd(*g.s, p, p, p, p, p, 1, 2, 1, 1, 300, 300, 300); },
                      {"head dim", "300"});
}

// ---- SwiGLU ---------------------------------------------------------------------------------

TEST(CudaOps, SwigluForwardAndBackward) {
  // Computed in double with the reference's formulas and rounded once: ≤ u·|want| (2u allowed)
  // up to CUDA's exp and glibc's differing in the last double ulp (far below f32). gate and up
  // are the two halves of one (N, 2F) buffer, as the engine lays them out (ld = 2F).
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (int F : {1, 7, 33, 257, 1031})
    for (int N : {1, 5, 64}) {
      const int ld = 2 * F;
      auto gu = random_vec(size_t(N) * ld, 80, -6.0, 6.0);
      auto dout = random_vec(size_t(N) * F, 81);
      std::vector<double> want(size_t(N) * F), want_g(gu.size(), 0.0), want_u(gu.size(), 0.0);
      const auto gud = to_double(gu);
      ref::swiglu_fwd<double>(want.data(), gud.data(), gud.data() + F, N, F, ld);
      ref::swiglu_bwd<double>(want_g.data(), want_u.data() + F, to_double(dout).data(), gud.data(),
                              gud.data() + F, N, F, ld);
      std::vector<double> want_grad(gu.size());  // dgate in the first half, dup in the second
      for (int n = 0; n < N; ++n)
        for (int f = 0; f < F; ++f) {
          want_grad[size_t(n) * ld + f] = want_g[size_t(n) * ld + f];
          want_grad[size_t(n) * ld + F + f] = want_u[size_t(n) * ld + F + f];
        }
      Buffer d = g.upload(gu), dd = g.upload(dout), out = g.dev->alloc(want.size() * 4, "out"),
             grad = g.dev->alloc(gu.size() * 4, "grad");
      g.ops().swiglu_fwd(*g.s, out.as<float>(), d.as<float>(), test::at<float>(d, F), N, F, ld);
      g.ops().swiglu_bwd(*g.s, grad.as<float>(), test::at<float>(grad, F), dd.as<float>(), d.as<float>(),
                         test::at<float>(d, F), N, F, ld);
      const std::string t = tag({{"N", N}, {"F", F}});
      expect_near("swiglu_fwd" + t, g.download<float>(out, want.size()), want,
                  [&](size_t i) { return 2 * kU32 * std::fabs(want[i]) + 1e-30; });
      expect_near("swiglu_bwd" + t, g.download<float>(grad, gu.size()), want_grad,
                  [&](size_t i) { return 2 * kU32 * std::fabs(want_grad[i]) + 1e-30; });
    }
}

// ---- cross-entropy --------------------------------------------------------------------------

TEST(CudaOps, CrossEntropyForwardAndBackwardInPlace) {
  // log-sum-exp in double (block order instead of index order: ~V·2^-53 relative), then one
  // rounding to f32: ≤ u·|want| (2u allowed) plus a floor of 1e-12·(1 + max|logit|). Rows with
  // a negative target give loss 0 and a zero gradient row; the backward runs in place.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (int V : {1, 7, 256, 4097, 50257}) {
    const int N = 7;
    auto logits = random_vec(size_t(N) * V, 90, -10.0, 10.0);
    auto targets = random_tokens(N, V, 91);
    targets[3] = -1;
    const float dloss = 0.37f;
    std::vector<double> want(N), want_d(logits.size());
    const auto ld = to_double(logits);
    ref::cross_entropy_fwd<double>(want.data(), ld.data(), targets.data(), N, V);
    ref::cross_entropy_bwd<double>(want_d.data(), ld.data(), targets.data(), double(dloss), N, V);
    Buffer dl = g.upload(logits), dt = g.upload(targets), loss = g.dev->alloc(N * 4, "losses");
    g.ops().cross_entropy_fwd(*g.s, loss.as<float>(), dl.as<float>(), dt.as<int32_t>(), N, V);
    g.ops().cross_entropy_bwd(*g.s, dl.as<float>(), dl.as<float>(), dt.as<int32_t>(), dloss, N, V);
    const double floor = 1e-12 * (1 + max_abs(logits));
    expect_near("cross_entropy_fwd V=" + std::to_string(V), g.download<float>(loss, N), want,
                [&](size_t i) { return 2 * kU32 * std::fabs(want[i]) + floor; });
    expect_near("cross_entropy_bwd V=" + std::to_string(V), g.download<float>(dl, logits.size()), want_d,
                [&](size_t i) { return 2 * kU32 * std::fabs(want_d[i]) + floor * dloss; });
  }
}

TEST(CudaOps, VocabularyPartsMatchTheReference) {
  // Tensor parallelism's embedding and loss parts: the embedding part is a copy (bit-equal; the
  // backward adds rows in token order as the whole op does); the loss parts follow the whole
  // op's double log-sum-exp, rounded to f32 once per step (part lse, combined lse): 4u.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const int V = 259, C = 33, N = 37, P = 3;
  auto wte = random_vec(size_t(V) * C, 95);
  auto tok = random_tokens(N, V, 96);
  auto dout = random_vec(size_t(N) * C, 97);
  auto logits = random_vec(size_t(N) * V, 98, -10.0, 10.0);
  auto targets = random_tokens(N, V, 99);
  targets[2] = -1;
  const float dloss = 0.37f;
  Buffer dtok = g.upload(tok), ddout = g.upload(dout), dtgt = g.upload(targets);
  std::vector<float> stats_all(size_t(P) * N * 2);
  std::vector<std::vector<float>> parts;
  for (int p = 0; p < P; ++p) {
    const int b = V * p / P, rows = V * (p + 1) / P - b;
    std::vector<float> part_w(wte.begin() + long(size_t(b) * C), wte.begin() + long(size_t(b + rows) * C));
    std::vector<float> want(size_t(N) * C), want_d = random_vec(size_t(rows) * C, 100);
    ref::embedding_part_fwd<float>(want.data(), tok.data(), part_w.data(), N, C, V, b, rows);
    Buffer dw = g.upload(part_w), out = g.dev->alloc(want.size() * 4, "out"), dd = g.upload(want_d);
    ref::embedding_part_bwd<float>(want_d.data(), dout.data(), tok.data(), N, C, V, b, rows);
    g.ops().embedding_part_fwd(*g.s, out.as<float>(), dtok.as<int32_t>(), dw.as<float>(), N, C, V, b, rows);
    g.ops().embedding_part_bwd(*g.s, dd.as<float>(), ddout.as<float>(), dtok.as<int32_t>(), N, C, V, b, rows);
    expect_equal("embedding_part_fwd p=" + std::to_string(p), g.download<float>(out, want.size()), want);
    expect_equal("embedding_part_bwd p=" + std::to_string(p), g.download<float>(dd, want_d.size()), want_d);
    std::vector<float> part(size_t(N) * rows);
    for (int n = 0; n < N; ++n)
      std::copy_n(logits.begin() + long(size_t(n) * V + b), rows, part.begin() + long(size_t(n) * rows));
    Buffer dpart = g.upload(part), st = g.dev->alloc(size_t(N) * 2 * 4, "stats");
    g.ops().cross_entropy_part_fwd(*g.s, st.as<float>(), dpart.as<float>(), dtgt.as<int32_t>(), N, rows, b, V);
    auto got = g.download<float>(st, size_t(N) * 2);
    std::copy(got.begin(), got.end(), stats_all.begin() + long(size_t(p) * N * 2));
    parts.push_back(std::move(part));
  }
  std::vector<double> want(N), want_d(logits.size());
  const auto ld = to_double(logits);
  ref::cross_entropy_fwd<double>(want.data(), ld.data(), targets.data(), N, V);
  ref::cross_entropy_bwd<double>(want_d.data(), ld.data(), targets.data(), double(dloss), N, V);
  Buffer dall = g.upload(stats_all), loss = g.dev->alloc(N * 4, "losses"), lse = g.dev->alloc(N * 4, "lse");
  g.ops().cross_entropy_combine(*g.s, loss.as<float>(), lse.as<float>(), dall.as<float>(), dtgt.as<int32_t>(), N, P);
  const double floor = 1e-12 * (1 + max_abs(logits));
  expect_near("cross_entropy parts", g.download<float>(loss, N), want,
              [&](size_t i) { return 4 * kU32 * (std::fabs(want[i]) + 20) + floor; });
  for (int p = 0; p < P; ++p) {
    const int b = V * p / P, rows = V * (p + 1) / P - b;
    Buffer dpart = g.upload(parts[size_t(p)]);
    g.ops().cross_entropy_part_bwd(*g.s, dpart.as<float>(), dpart.as<float>(), lse.as<float>(),
                                   dtgt.as<int32_t>(), dloss, N, rows, b, V);
    std::vector<double> w(size_t(N) * rows);
    for (int n = 0; n < N; ++n)
      std::copy_n(want_d.begin() + long(size_t(n) * V + b), rows, w.begin() + long(size_t(n) * rows));
    expect_near("cross_entropy_part_bwd p=" + std::to_string(p), g.download<float>(dpart, w.size()), w,
                [&](size_t i) { return 4 * kU32 * (std::fabs(w[i]) + 20 * dloss) + floor * dloss; });
  }
}

TEST(CudaOps, CrossEntropyReportsTargetsPastTheVocabulary) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  Buffer logits = g.upload(random_vec(2 * 5, 1)), loss = g.dev->alloc(8, "loss");
  Buffer targets = g.upload(std::vector<int32_t>{2, 5});
  expect_stream_error(g, [&] {
    g.ops().cross_entropy_fwd(*g.s, loss.as<float>(), logits.as<float>(), targets.as<int32_t>(), 2, 5);
  }, {"cross_entropy_fwd", "target 5", "row 1"});
}

// ---- elementwise, casts, sums ---------------------------------------------------------------

TEST(CudaOps, AddScaleAndCastsAreBitExact) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  for (size_t n : {size_t(1), size_t(7), size_t(4097), (size_t(1) << 20) + 3}) {
    auto a = random_vec(n, 100, -1e3, 1e3), b = random_vec(n, 101, -1e3, 1e3);
    std::vector<float> sum(n), scaled = a;
    ref::add<float>(sum.data(), a.data(), b.data(), n);
    ref::scale<float>(scaled.data(), 0.1f, n);
    Buffer da = g.upload(a), db = g.upload(b), out = g.dev->alloc(n * 4, "out");
    g.ops().add(*g.s, out.as<float>(), da.as<float>(), db.as<float>(), n);
    expect_equal("add n=" + std::to_string(n), g.download<float>(out, n), sum);
    g.ops().add(*g.s, da.as<float>(), da.as<float>(), db.as<float>(), n);  // out aliases a
    expect_equal("add in place n=" + std::to_string(n), g.download<float>(da, n), sum);
    Buffer dsc = g.upload(a);
    g.ops().scale(*g.s, dsc.as<float>(), 0.1f, n);
    expect_equal("scale n=" + std::to_string(n), g.download<float>(dsc, n), scaled);
  }
  // Casts: random values plus every awkward case — ties to even both ways, the largest finite
  // values (which round to infinity), subnormals, signed zeros, infinities and NaNs.
  auto x = random_vec(4097, 102, -100, 100);
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,
                        0x00000001u, 0x80000001u, 0x007fffffu, 0x00000000u, 0x80000000u, 0x7f800000u,
                        0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc00001u})
    x.push_back(std::bit_cast<float>(bits));
  std::vector<uint16_t> want16(x.size());
  ref::cast_f32_to_bf16(want16.data(), x.data(), x.size());
  Buffer dx = g.upload(x), d16 = g.dev->alloc(x.size() * 2, "bf16"), back = g.dev->alloc(x.size() * 4, "f32");
  g.ops().cast_f32_to_bf16(*g.s, d16.as<uint16_t>(), dx.as<float>(), x.size());
  EXPECT_EQ(g.download<uint16_t>(d16, x.size()), want16) << "cast_f32_to_bf16";
  std::vector<float> want32(x.size());
  ref::cast_bf16_to_f32(want32.data(), want16.data(), x.size());
  g.ops().cast_bf16_to_f32(*g.s, back.as<float>(), d16.as<uint16_t>(), x.size());
  const auto got32 = g.download<float>(back, x.size());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got32[i]), std::bit_cast<uint32_t>(want32[i])) << "cast_bf16_to_f32 [" << i << "]";
}

TEST(CudaOps, SumsInDouble) {
  // Both sides add in double, in different orders: each is within n·2^-53·Σ|terms| of the exact
  // sum (x² is exact in double), so they agree within twice that.
  STRATA_REQUIRE_CUDA();
  Gpu g;
  Buffer out = g.dev->alloc(16, "out");
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(4097), (size_t(1) << 20) + 3}) {
    auto x = random_vec(n, 110, -3, 3);
    double want = 0, want_sq = 0, mag = 0;
    ref::sum<float>(&want, x.data(), n);
    ref::sum_squares<float>(&want_sq, x.data(), n);
    for (float v : x) mag += std::fabs(double(v));
    Buffer dx = g.upload(x);
    g.ops().sum(*g.s, out.as<double>(), dx.as<float>(), n);
    g.ops().sum_squares(*g.s, out.as<double>() + 1, dx.as<float>(), n);
    const auto got = g.download<double>(out, 2);
    const double tol = 2 * double(n) * std::ldexp(1.0, -53);
    EXPECT_NEAR(got[0], want, tol * mag + 1e-300) << "sum n=" << n;
    EXPECT_NEAR(got[1], want_sq, tol * want_sq + 1e-300) << "sum_squares n=" << n;
  }
}

// ---- determinism ----------------------------------------------------------------------------

TEST(CudaOps, BackwardOpsAndSumsAreDeterministic) {
  // No float atomics anywhere: the same inputs give the same bits on every run (what makes every
  // offload placement bit-identical on CUDA).
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const AttnShape s{2, 130, 4, 2, 64};
  const AttnLayout L(s, true);
  const int N = s.B * s.T, C = 257, V = 97;
  auto qkv = random_vec(L.size, 120), dout = random_vec(size_t(N) * s.H * s.D, 121);
  auto x = random_vec(size_t(N) * C, 122), w = random_vec(C, 123), gx = random_vec(size_t(N) * C, 124);
  auto tok = random_tokens(N, V, 125);
  auto run = [&] {
    Buffer dq = g.upload(qkv), dd = g.upload(dout), out = g.dev->alloc(dout.size() * 4, "out"),
           lse = g.dev->alloc(size_t(s.B) * s.H * s.T * 4, "lse"), grads = g.dev->alloc(L.size * 4, "grads");
    g.ops().attention_fwd(*g.s, out.as<float>(), lse.as<float>(), test::at<float>(dq, L.q_off),
                          test::at<float>(dq, L.k_off), test::at<float>(dq, L.v_off), s.B, s.T, s.H, s.KVH,
                          s.D, L.ldq, L.ldkv);
    g.ops().attention_bwd(*g.s, test::at<float>(grads, L.q_off), test::at<float>(grads, L.k_off),
                          test::at<float>(grads, L.v_off), dd.as<float>(), out.as<float>(), lse.as<float>(),
                          test::at<float>(dq, L.q_off), test::at<float>(dq, L.k_off),
                          test::at<float>(dq, L.v_off), s.B, s.T, s.H, s.KVH, s.D, L.ldq, L.ldkv);
    Buffer bx = g.upload(x), bw = g.upload(w), bg = g.upload(gx), dx = g.upload(std::vector<float>(x.size(), 0.f)),
           dw = g.upload(std::vector<float>(C, 0.f)), r = g.dev->alloc(N * 4, "rstd"),
           o = g.dev->alloc(x.size() * 4, "o"), emb = g.upload(std::vector<float>(size_t(V) * C, 0.f)),
           bt = g.upload(tok), sums = g.dev->alloc(16, "sums");
    g.ops().rmsnorm_fwd(*g.s, o.as<float>(), r.as<float>(), bx.as<float>(), bw.as<float>(), N, C, 1e-5f);
    g.ops().rmsnorm_bwd(*g.s, dx.as<float>(), dw.as<float>(), bg.as<float>(), bx.as<float>(), bw.as<float>(),
                        r.as<float>(), N, C);
    g.ops().embedding_bwd(*g.s, emb.as<float>(), bg.as<float>(), bt.as<int32_t>(), N, C, V);
    g.ops().sum_squares(*g.s, sums.as<double>(), grads.as<float>(), L.size);
    g.ops().sum(*g.s, sums.as<double>() + 1, dx.as<float>(), x.size());
    std::vector<float> all = g.download<float>(grads, L.size);
    for (const Buffer* b : {&dx, &emb}) {
      const auto v = g.download<float>(*b, b == &dx ? x.size() : size_t(V) * C);
      all.insert(all.end(), v.begin(), v.end());
    }
    const auto vdw = g.download<float>(dw, C);
    all.insert(all.end(), vdw.begin(), vdw.end());
    const auto vs = g.download<float>(sums, 4);
    all.insert(all.end(), vs.begin(), vs.end());
    return all;
  };
  const auto first = run();
  for (int i = 0; i < 3; ++i) {
    const auto again = run();
    ASSERT_EQ(first.size(), again.size());
    for (size_t j = 0; j < first.size(); ++j)
      ASSERT_EQ(std::bit_cast<uint32_t>(first[j]), std::bit_cast<uint32_t>(again[j])) << "element " << j << " run " << i;
  }
}

}  // namespace
}  // namespace strata
