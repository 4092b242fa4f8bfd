// tests/optimizer/test_adamw.cpp — AdamW: every ISA path bit-identical to the scalar reference
// (sizes that hit the vector tails, several steps, weight decay on and off, every dtype variant,
// unaligned pointers), the definition against the formula in double precision, the bf16 copy
// against round-to-nearest-even, the fused gradient scale against scaling first, the ISA
// choice and STRATA_ISA, and the argument checks.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "optimizer/adamw.h"
#include "optimizer/adamw_def.h"
#include "optimizer/adamw_isa.h"
#include "tests/optimizer/adamw_test_util.h"

namespace strata {
namespace {

constexpr size_t kSizes[] = {1, 7, 15, 16, 17, 31, 33, 4097, (size_t{1} << 20) + 3};

using Variant = test::AdamWVariant;
using Shard = test::AdamWShard;
using test::adamw_draw;
using test::all_adamw_variants;
using test::make_adamw_shard;
using test::same_bits;
using test::same_shard;

AdamWHyper hyper_with(float weight_decay) {
  AdamWHyper h;
  h.lr = 3e-3f;
  h.weight_decay = weight_decay;
  return h;
}

std::vector<AdamIsa> vector_isas() { return {AdamIsa::avx2, AdamIsa::avx512}; }

std::string isa_param_name(const ::testing::TestParamInfo<AdamIsa>& info) {
  return std::string(adam_isa_name(info.param));
}

// ---------------------------------------------------------------------------------------------
// Every vector path against the scalar reference, bit for bit.

class AdamWPath : public ::testing::TestWithParam<AdamIsa> {
 protected:
  void SetUp() override {
    if (!adamw_isa_available(GetParam()))
      GTEST_SKIP() << adam_isa_name(GetParam())
                   << " is not available here (CPU: " << cpu_features().describe() << ")";
  }
};

TEST_P(AdamWPath, BitIdenticalToScalarReference) {
  const AdamIsa isa = GetParam();
  for (const size_t n : kSizes) {
    const bool big = n > 100000;
    for (const size_t offset : big ? std::vector<size_t>{0} : std::vector<size_t>{0, 1}) {
      const Shard initial = make_adamw_shard(n, offset, {}, uint32_t(n * 131 + offset));
      for (const Variant& variant : all_adamw_variants()) {
        for (const float wd : {0.0f, 0.1f}) {
          SCOPED_TRACE(str(adam_isa_name(isa), " n=", n, " ", variant.name(), " wd=", wd,
                           " offset=", offset));
          Shard ref = initial, got = initial;
          ref.variant = got.variant = variant;
          const AdamWHyper h = hyper_with(wd);
          // Steps 1, 2, 3 then a late step, with scales that round (0.37) and that do not (1).
          const int64_t steps[] = {1, 2, 3, 1000};
          const float scales[] = {1.0f, 0.37f, 1.0f, 2.5f};
          for (int k = 0; k < 4; ++k) {
            {
              tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
              adamw_update_isa(AdamIsa::scalar, h, steps[k], scales[k], ref.tensors());
            }
            adamw_update_isa(isa, h, steps[k], scales[k], got.tensors());
            ASSERT_TRUE(same_shard(ref, got)) << "after step " << steps[k];
          }
        }
      }
    }
  }
}

// The fused scale: grad_scale inside the step equals scaling the gradient first (in the test,
// and with the separate scaling pass) and stepping with grad_scale = 1.
TEST_P(AdamWPath, FusedScaleEqualsScalingFirst) {
  const AdamIsa isa = GetParam();
  for (const bool grad_bf16 : {false, true}) {
    const size_t n = 4097 + 3 * 64 * 1024;  // several oneTBB pieces and a tail
    const Variant fused_variant{grad_bf16, false, true};
    Shard fused = make_adamw_shard(n, 0, fused_variant, 7);
    Shard first = make_adamw_shard(n, 0, {false, false, true}, 7);
    Shard pass = make_adamw_shard(n, 0, {false, false, true}, 7);
    const AdamWHyper h = hyper_with(0.1f);
    for (int64_t step = 1; step <= 3; ++step) {
      const float scale = step == 2 ? 1.0f / 3.0f : 0.7f;
      // fresh gradients each step, as in training
      std::mt19937 rng(static_cast<uint32_t>(100 + step));
      for (size_t i = 0; i < n; ++i) {
        const float g = adamw_draw(rng, 1e-2f);
        fused.g[i] = g;
        fused.gb[i] = f32_to_bf16_bits(g);
        const float unscaled = grad_bf16 ? bf16_bits_to_f32(fused.gb[i]) : g;
        first.g[i] = unscaled * scale;  // scaling first, one multiply
        pass.g[i] = unscaled;
      }
      adamw_update_isa(isa, h, step, scale, fused.tensors());
      adamw_update_isa(isa, h, step, 1.0f, first.tensors());
      scale_inplace_isa(isa, pass.g.data(), n, scale);
      ASSERT_TRUE(same_bits("scaled grad", first.g, pass.g));
      adamw_update_isa(isa, h, step, 1.0f, pass.tensors());
      for (const Shard* other : {&first, &pass}) {
        ASSERT_TRUE(same_bits("param", fused.p, other->p)) << "grad_bf16=" << grad_bf16;
        ASSERT_TRUE(same_bits("m", fused.m, other->m));
        ASSERT_TRUE(same_bits("v", fused.v, other->v));
        ASSERT_TRUE(same_bits("param_bf16", fused.pb, other->pb));
      }
    }
  }
}

// The bf16 copy written in the pass equals core/dtype.h's round-to-nearest-even of the f32
// result, element by element.
TEST_P(AdamWPath, Bf16CopyIsRoundToNearestEvenOfResult) {
  const AdamIsa isa = GetParam();
  Shard s = make_adamw_shard(100003, 0, {false, false, true}, 11);
  for (int64_t step = 1; step <= 3; ++step) {
    adamw_update_isa(isa, hyper_with(0.1f), step, 1.0f, s.tensors());
    for (size_t i = 0; i < s.n; ++i)
      ASSERT_EQ(s.pb[i], f32_to_bf16_bits(s.p[i])) << "i=" << i << " p=" << s.p[i];
  }
}

// Ties, near-ties, overflow to inf, subnormals, signed zeros, inf and NaN through the fused
// copy: with lr = 0, m = v = g = 0 the step leaves each parameter as it is (θ·1, then
// θ + (−0)·0), so the copy must be exactly RNE of the input bits.
TEST_P(AdamWPath, Bf16CopyRoundingCases) {
  const AdamIsa isa = GetParam();
  const uint32_t special[] = {
      0x3f808000u, 0x3f818000u,  // ties: to even below, to even above
      0x3f807fffu, 0x3f808001u, 0x3f80ffffu, 0x3f800001u,
      0x7f7fffffu, 0xff7fffffu,                            // largest finite: rounds to ±inf
      0x7f7f7fffu,                                         // stays finite
      0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu,  // subnormals (ties included)
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,  // ±0, ±inf
      0x7fc12345u, 0xffc00001u, 0x7f812345u,               // quiet NaNs, a signalling NaN
  };
  const size_t n = 3 * std::size(special) + 5;  // a vector body and a tail on every path
  Shard s = make_adamw_shard(n, 0, {false, false, true}, 3);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = std::bit_cast<float>(special[i % std::size(special)]);
    s.g[i] = s.m[i] = s.v[i] = 0.0f;
  }
  const std::vector<float> before = s.p;
  AdamWHyper h;
  h.lr = 0.0f;
  adamw_update_isa(isa, h, 1, 1.0f, s.tensors());
  for (size_t i = 0; i < n; ++i) {
    const uint32_t in = std::bit_cast<uint32_t>(before[i]);
    if (!std::isnan(before[i])) {
      EXPECT_EQ(std::bit_cast<uint32_t>(s.p[i]), in) << std::hex << in;
    }
    EXPECT_EQ(s.pb[i], f32_to_bf16_bits(s.p[i])) << std::hex << "input 0x" << in;
  }
}

// The separate copy pass (the benchmark's unfused baseline) on a sweep of bit patterns: every
// sign/exponent/top-mantissa half with low halves around the rounding point.
TEST_P(AdamWPath, Bf16ConversionPassMatchesCore) {
  const AdamIsa isa = GetParam();
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1234u};
  std::vector<float> x;
  for (uint32_t high = 0; high < 0x10000u; ++high)
    for (uint32_t low : lows) x.push_back(std::bit_cast<float>(high << 16 | low));
  x.push_back(1.0f);  // length not a multiple of the vector width
  std::vector<uint16_t> out(x.size(), 0);
  convert_f32_to_bf16_isa(isa, x.data(), out.data(), x.size());
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = f32_to_bf16_bits(x[i]);
  EXPECT_TRUE(same_bits("bf16", want, out));
}

// Calls of at least kAdamWNonTemporalElems write the bf16 copy with streaming stores when the
// destination is aligned: the bits must not change, aligned or not, in the step, the copy pass
// and the streaming bound's store layout.
TEST_P(AdamWPath, Bf16CopyWithStreamingStores) {
  const AdamIsa isa = GetParam();
  const size_t n = kAdamWNonTemporalElems + 37;
  for (const size_t misalign : {size_t{0}, size_t{1}}) {
    SCOPED_TRACE(str("bf16 destination misaligned by ", misalign, " elements"));
    Shard ref = make_adamw_shard(n, 0, {false, false, true}, 21), got = ref;
    auto place = [&](std::vector<uint16_t>& storage) {  // 64-byte aligned, then misaligned
      storage.assign(n + 64, 0);
      uint16_t* at = storage.data();
      while (reinterpret_cast<uintptr_t>(at) % 64 != 0) ++at;
      return at + misalign;
    };
    std::vector<uint16_t> storage, pass;
    uint16_t* out = place(storage);
    AdamWTensors t = got.tensors();
    t.param_bf16 = out;
    for (int64_t step = 1; step <= 2; ++step) {
      adamw_update_isa(AdamIsa::scalar, hyper_with(0.1f), step, 0.37f, ref.tensors());
      adamw_update_isa(isa, hyper_with(0.1f), step, 0.37f, t);
      ASSERT_TRUE(same_bits("param", ref.p, got.p));
      ASSERT_EQ(std::memcmp(ref.pb.data(), out, n * sizeof(uint16_t)), 0) << "fused bf16 copy";
      uint16_t* pass_out = place(pass);
      convert_f32_to_bf16_isa(isa, got.p.data(), pass_out, n);
      ASSERT_EQ(std::memcmp(ref.pb.data(), pass_out, n * sizeof(uint16_t)), 0) << "copy pass";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, AdamWPath, ::testing::ValuesIn(vector_isas()), isa_param_name);

// The scalar path itself obeys the fused-scale and copy properties (it is the reference, so
// the parameterized tests above cover it only as the oracle).
TEST(AdamWScalar, FusedScaleAndCopy) {
  const size_t n = 5003;
  Shard fused = make_adamw_shard(n, 0, {false, false, true}, 5);
  Shard first = make_adamw_shard(n, 0, {false, false, true}, 5);
  for (size_t i = 0; i < n; ++i) first.g[i] = fused.g[i] * 0.37f;
  adamw_update_isa(AdamIsa::scalar, hyper_with(0.1f), 4, 0.37f, fused.tensors());
  adamw_update_isa(AdamIsa::scalar, hyper_with(0.1f), 4, 1.0f, first.tensors());
  EXPECT_TRUE(same_bits("param", fused.p, first.p));
  EXPECT_TRUE(same_bits("m", fused.m, first.m));
  EXPECT_TRUE(same_bits("v", fused.v, first.v));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(fused.pb[i], f32_to_bf16_bits(fused.p[i]));
}

// The checker is able to fail: one ulp in one element is reported.
TEST(AdamWCompare, ReportsOneUlp) {
  std::vector<float> a(33, 1.0f), b = a;
  b[32] = std::nextafter(1.0f, 2.0f);
  EXPECT_FALSE(same_bits("x", a, b));
  EXPECT_TRUE(same_bits("x", a, a));
}

// ---------------------------------------------------------------------------------------------
// The definition against torch.optim.AdamW's formula evaluated in double precision.
//
// Tolerance, from a forward error analysis of adamw_def.h with u = 2^-24 (each of its lines
// rounds once, |relative error| ≤ u; the constants are rounded once from double):
//   m:  terms fl(β1·m), fl(1−β1), g = fl(grad·scale), the fma    → |Δm| ≤ 4u·(β1|m| + (1−β1)|g|)
//   v:  fl(β2·v), fl(1−β2), g twice, fl((1−β2)·g), the fma        → |Δv| ≤ 6u·(β2·v + (1−β2)·g²)
//   d = √v̂+ε: v's 6u halves under √, plus √, r and fma roundings → |Δd| ≤ 6u·d
//   θ: decay and its multiply 2u·|θ·decay|; the update U = s·m/d: s, the division and the
//      final fma 3u·|U|, plus s·|Δm|/d and |U|·|Δd|/d; the final fma u·|θ'|.
// The test allows twice each coefficient (second-order terms, and room so that a correct
// rounding change is not a failure), plus 64 smallest subnormals of absolute slack for results
// that underflow. A wrong formula (bias correction, eps inside the root, coupled decay) misses
// by many orders of magnitude more.
TEST(AdamWDefinition, MatchesFormulaInDouble) {
  const double u = std::ldexp(1.0, -24);
  const double tiny = 64 * std::ldexp(1.0, -149);
  struct Case {
    AdamWHyper h;
    int64_t step;
    float scale;
  };
  std::vector<Case> cases;
  for (const float wd : {0.0f, 0.01f, 0.3f})
    for (const int64_t step : {int64_t{1}, int64_t{2}, int64_t{10}, int64_t{1000}, int64_t{100000}})
      for (const float scale : {1.0f, 0.37f, 1024.0f}) {
        AdamWHyper h = hyper_with(wd);
        cases.push_back({h, step, scale});
      }
  AdamWHyper other;
  other.lr = 0.5f;
  other.beta1 = 0.5f;
  other.beta2 = 0.75f;
  other.eps = 1e-3f;
  other.weight_decay = 0.5f;
  cases.push_back({other, 3, 1.0f});

  const size_t n = 20000;
  for (const Case& c : cases) {
    SCOPED_TRACE(
        str("wd=", c.h.weight_decay, " step=", c.step, " scale=", c.scale, " lr=", c.h.lr));
    Shard s = make_adamw_shard(n, 0, {false, false, false}, static_cast<uint32_t>(c.step));
    // Moderate values for this check (the bitwise tests cover the extremes).
    std::mt19937 rng(static_cast<uint32_t>(c.step * 7));
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      s.p[i] = unit(rng);
      s.g[i] = unit(rng) * std::exp2(-12.0f * std::fabs(unit(rng))) / c.scale;
      s.m[i] = unit(rng) * 1e-3f;
      s.v[i] = std::fabs(unit(rng)) * 1e-6f * std::exp2(-12.0f * std::fabs(unit(rng)));
      if (i % 97 == 0) s.g[i] = 0.0f;
      if (i % 101 == 0) s.v[i] = s.m[i] = 0.0f;
    }
    const Shard before = s;
    adamw_update_isa(AdamIsa::scalar, c.h, c.step, c.scale, s.tensors());

    const double lr = c.h.lr, b1 = c.h.beta1, b2 = c.h.beta2, eps = c.h.eps, wd = c.h.weight_decay;
    const double bc1 = 1.0 - std::pow(b1, double(c.step)), bc2 = 1.0 - std::pow(b2, double(c.step));
    for (size_t i = 0; i < n; ++i) {
      const double g = double(before.g[i]) * double(c.scale);
      const double p0 = before.p[i], m0 = before.m[i], v0 = before.v[i];
      const double p_decayed = p0 - lr * wd * p0;    // θ − γλθ
      const double m1 = b1 * m0 + (1 - b1) * g;      // m
      const double v1 = b2 * v0 + (1 - b2) * g * g;  // v
      const double m_hat = m1 / bc1, v_hat = v1 / bc2;
      const double d = std::sqrt(v_hat) + eps;
      const double update = lr * m_hat / d;
      const double p1 = p_decayed - update;  // θ − γ·m̂/(√v̂ + ε)

      const double tol_m = 2 * 4 * u * (b1 * std::fabs(m0) + (1 - b1) * std::fabs(g)) + tiny;
      const double tol_v = 2 * 6 * u * (b2 * v0 + (1 - b2) * g * g) + tiny;
      const double step_size = lr / bc1;
      const double tol_p =
          2 * (2 * u * std::fabs(p_decayed) + 3 * u * std::fabs(update) +
               step_size * (4 * u * (b1 * std::fabs(m0) + (1 - b1) * std::fabs(g))) / d +
               6 * u * std::fabs(update) + u * std::fabs(p1)) +
          tiny;
      ASSERT_LE(std::fabs(double(s.m[i]) - m1), tol_m) << "m at " << i << " g=" << g;
      ASSERT_LE(std::fabs(double(s.v[i]) - v1), tol_v) << "v at " << i << " g=" << g;
      ASSERT_LE(std::fabs(double(s.p[i]) - p1), tol_p)
          << "param at " << i << ": got " << s.p[i] << ", formula " << p1 << " (p0 " << p0 << ", g "
          << g << ", m " << m1 << ", v " << v1 << ")";
    }
  }
}

// The per-step constants: weight decay 0 gives decay exactly 1 (θ·1 is exact), and the bias
// corrections follow 1 − β^t.
TEST(AdamWDefinition, StepConstants) {
  AdamWHyper h;
  h.lr = 1e-3f;
  const AdamWStepConsts c1 = adamw_step_constants(h, 1, 1.0f);
  EXPECT_EQ(c1.decay, 1.0f);
  EXPECT_EQ(c1.neg_step_size, static_cast<float>(-(double(h.lr) / (1.0 - double(h.beta1)))));
  EXPECT_EQ(c1.rsqrt_bias2, static_cast<float>(1.0 / std::sqrt(1.0 - double(h.beta2))));
  EXPECT_EQ(c1.one_minus_beta1, static_cast<float>(1.0 - double(h.beta1)));
  const AdamWStepConsts late = adamw_step_constants(h, int64_t{1} << 40, 1.0f);
  EXPECT_EQ(late.neg_step_size, -h.lr);  // β^t underflows: no correction left
  EXPECT_EQ(late.rsqrt_bias2, 1.0f);
  h.weight_decay = 0.1f;
  EXPECT_EQ(adamw_step_constants(h, 1, 1.0f).decay, static_cast<float>(1.0 - 1e-3f * double(0.1f)));
}

// bf16 state: all paths agree (covered above); here, the state written is RNE of the f32 moments
// the definition produced from the widened bf16 inputs, so the option is exactly "f32 math,
// bf16 storage".
TEST(AdamWBf16State, StoresRoundedMoments) {
  const size_t n = 4097;
  Shard b = make_adamw_shard(n, 0, {false, true, false}, 9);
  Shard f = make_adamw_shard(n, 0, {false, false, false}, 9);
  for (size_t i = 0; i < n; ++i) {
    f.m[i] = bf16_bits_to_f32(b.mb[i]);
    f.v[i] = bf16_bits_to_f32(b.vb[i]);
  }
  adamw_update_isa(AdamIsa::scalar, hyper_with(0.1f), 2, 1.0f, b.tensors());
  adamw_update_isa(AdamIsa::scalar, hyper_with(0.1f), 2, 1.0f, f.tensors());
  EXPECT_TRUE(same_bits("param", f.p, b.p));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(b.mb[i], f32_to_bf16_bits(f.m[i])) << i;
    ASSERT_EQ(b.vb[i], f32_to_bf16_bits(f.v[i])) << i;
  }
}

// ---------------------------------------------------------------------------------------------
// ISA choice.

CpuFeatures cpu_with(bool avx2, bool avx512) {
  CpuFeatures f;
  f.sse42 = true;
  f.avx = f.avx2 = f.fma = avx2;
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = avx512;
  return f;
}

TEST(AdamWIsaSelection, AutoPicksWidestTheCpuRuns) {
  EXPECT_EQ(adamw_choose_isa("", cpu_with(false, false)), AdamIsa::scalar);
  EXPECT_EQ(adamw_choose_isa("auto", cpu_with(true, false)), AdamIsa::avx2);
  EXPECT_EQ(adamw_choose_isa("", cpu_with(true, true)), AdamIsa::avx512);
  CpuFeatures partial = cpu_with(true, true);
  partial.avx512bw = false;  // AVX-512F without BW (e.g. Knights Landing): not our avx512
  EXPECT_EQ(adamw_choose_isa("", partial), AdamIsa::avx2);
  CpuFeatures no_fma = cpu_with(true, false);
  no_fma.fma = false;
  EXPECT_EQ(adamw_choose_isa("", no_fma), AdamIsa::scalar);
}

TEST(AdamWIsaSelection, ForcedIsaWinsWhenTheCpuRunsIt) {
  EXPECT_EQ(adamw_choose_isa("scalar", cpu_with(true, true)), AdamIsa::scalar);
  EXPECT_EQ(adamw_choose_isa("avx2", cpu_with(true, true)), AdamIsa::avx2);
  EXPECT_EQ(adamw_choose_isa("avx512", cpu_with(true, true)), AdamIsa::avx512);
}

TEST(AdamWIsaSelection, ForcedIsaTheCpuLacksIsAnError) {
  try {
    adamw_choose_isa("avx512", cpu_with(true, false));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("avx2"), std::string::npos) << e.what();  // the hint
  }
  EXPECT_THROW(adamw_choose_isa("avx2", cpu_with(false, false)), Error);
  EXPECT_THROW(adamw_choose_isa("sse9", cpu_with(true, true)), Error);
  EXPECT_THROW(parse_adam_isa("AVX2"), Error);
}

// Run under CTest as test_adamw_forced_<isa> with STRATA_ISA set: the process's active path is
// the forced one when this CPU runs it, and an Error when it does not.
TEST(AdamWIsaSelection, ActiveIsaFollowsStrataIsa) {
  const char* env = std::getenv("STRATA_ISA");
  const std::string forced = env ? env : "";
  if (forced.empty() || forced == "auto") {
    EXPECT_EQ(adamw_active_isa(), adamw_choose_isa("", cpu_features()));
    return;
  }
  const AdamIsa want = parse_adam_isa(forced);
  if (!adamw_isa_available(want)) {
    EXPECT_THROW(adamw_active_isa(), Error);
    EXPECT_THROW(adamw_update(AdamWHyper{}, 1, 1.0f, AdamWTensors{}), Error);
    return;
  }
  // adamw_update runs adamw_update_isa(adamw_active_isa(), ...). Its output cannot show which
  // path ran (every path is bit-identical to the scalar one: AdamWPath), so the active ISA is
  // what is checked.
  EXPECT_EQ(adamw_active_isa(), want);
}

// ---------------------------------------------------------------------------------------------
// Argument checks.

TEST(AdamWErrors, RejectsBadCalls) {
  Shard s = make_adamw_shard(17, 0, {}, 1);
  const AdamWHyper h;
  EXPECT_THROW(adamw_update(h, 0, 1.0f, s.tensors()), Error);  // steps are 1-based
  EXPECT_THROW(adamw_update(h, 1, NAN, s.tensors()), Error);
  EXPECT_THROW(adamw_update(h, 1, INFINITY, s.tensors()), Error);
  AdamWHyper bad = h;
  bad.beta1 = 1.0f;
  EXPECT_THROW(adamw_update(bad, 1, 1.0f, s.tensors()), Error);
  bad = h;
  bad.lr = -1e-3f;
  EXPECT_THROW(adamw_update(bad, 1, 1.0f, s.tensors()), Error);
  bad = h;
  bad.eps = NAN;
  EXPECT_THROW(adamw_update(bad, 1, 1.0f, s.tensors()), Error);

  AdamWTensors t = s.tensors();
  t.grad_bf16 = s.gb.data();  // both gradients
  EXPECT_THROW(adamw_update(h, 1, 1.0f, t), Error);
  t = s.tensors();
  t.grad = nullptr;  // none
  EXPECT_THROW(adamw_update(h, 1, 1.0f, t), Error);
  t = s.tensors();
  t.m_bf16 = s.mb.data();  // mixed state
  EXPECT_THROW(adamw_update(h, 1, 1.0f, t), Error);
  t = s.tensors();
  t.param = nullptr;
  EXPECT_THROW(adamw_update(h, 1, 1.0f, t), Error);

  AdamWTensors empty;  // n = 0: nothing to do, no pointers needed
  EXPECT_NO_THROW(adamw_update(h, 1, 1.0f, empty));
}

}  // namespace
}  // namespace strata
