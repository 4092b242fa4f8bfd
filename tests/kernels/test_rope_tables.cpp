// The rotary tables (kernels/rope_tables.h) against the formulas of transformers'
// modeling_rope_utils.py evaluated independently in double: each rope type's inverse frequencies
// (and, for llama3, which band every frequency falls in), the float32 angle of the tables, and
// the argument checks. Bit-for-bit agreement with transformers itself is checked by the engine's
// golden test (tests/engine/test_rope_golden.cpp) against frequencies transformers computed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/rope_tables.h"

namespace strata {
namespace {

// One unit in the last place of a float near x.
double ulp(double x) { return std::ldexp(1.0, std::ilogb(x) - 23); }

// transformers' float32 exponent 2i/D, then 1 / theta^e in double.
double exact_default(float theta, int D, int i) {
  const float e = float(2 * i) / float(D);
  return 1.0 / std::pow(double(theta), double(e));
}

TEST(RopeTables, DefaultIsOneOverThetaPower) {
  for (int D : {2, 8, 16, 34, 64, 128})
    for (float theta : {10000.0f, 500000.0f, 77.0f}) {
      RopeParams p;
      p.theta = theta;
      const std::vector<float> inv = rope_inv_freq(p, D);
      ASSERT_EQ(inv.size(), size_t(D / 2));
      EXPECT_EQ(inv[0], 1.0f);
      for (int i = 0; i < D / 2; ++i) {
        // Two f32 roundings (the power, then its reciprocal): within 2 ulp of the exact value.
        const double want = exact_default(theta, D, i);
        EXPECT_LE(std::fabs(inv[size_t(i)] - want), 2 * ulp(want))
            << "D=" << D << " theta=" << theta << " i=" << i;
        if (i > 0) {
          EXPECT_LT(inv[size_t(i)], inv[size_t(i) - 1]);
        }
      }
    }
}

TEST(RopeTables, LinearDividesEveryFrequencyByTheFactor) {
  RopeParams plain, linear;
  linear.type = RopeType::linear;
  linear.factor = 3.3;  // not a power of two: the f32 division must round as torch's does
  const std::vector<float> a = rope_inv_freq(plain, 64), b = rope_inv_freq(linear, 64);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], a[i] / float(3.3)) << i;
}

// Llama 3.1's own settings: theta 500000, factor 8, low 1, high 4, original context 8192. For
// head dim 128 its 64 frequencies fall in all three bands: wavelength below 8192 / 4 unchanged,
// above 8192 / 1 divided by 8, between them interpolated.
TEST(RopeTables, Llama3ScalesTheLowFrequenciesAndInterpolatesTheMiddle) {
  RopeParams plain, llama3;
  plain.theta = llama3.theta = 500000.0f;
  llama3.type = RopeType::llama3;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_position = 8192;
  const int D = 128;
  const std::vector<float> base = rope_inv_freq(plain, D), got = rope_inv_freq(llama3, D);
  int high = 0, low = 0, medium = 0;
  for (int i = 0; i < D / 2; ++i) {
    const double f = base[size_t(i)], wavelen = 2 * M_PI / f;
    const double g = got[size_t(i)];
    if (wavelen < 8192.0 / 4 * (1 - 1e-6)) {
      ++high;
      EXPECT_EQ(g, f) << "high-frequency band, i=" << i;
    } else if (wavelen > 8192.0 * (1 + 1e-6)) {
      ++low;
      EXPECT_EQ(got[size_t(i)], base[size_t(i)] / 8.0f) << "low-frequency band, i=" << i;
    } else {
      ++medium;
      const double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      const double want = (1 - s) * f / 8 + s * f;
      // ~8 f32 operations on values of this size: within 8 ulp of the double formula.
      EXPECT_LE(std::fabs(g - want), 8 * ulp(want)) << "medium band, i=" << i;
      EXPECT_LT(g, f);
      EXPECT_GT(g, f / 8);
    }
  }
  EXPECT_EQ(high, 29);
  EXPECT_EQ(medium, 6);
  EXPECT_EQ(low, 29);
}

TEST(RopeTables, TablesHoldCosAndSinOfTransformersFloat32Angle) {
  RopeParams p;
  const std::vector<float> inv = rope_inv_freq(p, 64);
  const int T = 6000;
  const RopeTables t = rope_tables(inv, T);
  ASSERT_EQ(t.T, T);
  ASSERT_EQ(t.half, 32);
  ASSERT_EQ(t.cos.size(), size_t(T) * 32);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(t.cos[size_t(i)], 1.0f);
    EXPECT_EQ(t.sin[size_t(i)], 0.0f);
  }
  // At large positions the f32 product t · inv_freq differs from the double one by up to
  // ~t · 2^-24 radians; transformers rotates by the f32 angle, and so must the tables.
  int decisive = 0;
  for (int pos : {4097, 5001, 5999})
    for (int i = 0; i < 32; ++i) {
      const size_t k = size_t(pos) * 32 + size_t(i);
      const double f32_angle = double(float(pos) * inv[size_t(i)]);
      const double f64_angle = double(pos) * double(inv[size_t(i)]);
      EXPECT_EQ(t.cos[k], float(std::cos(f32_angle))) << pos << " " << i;
      EXPECT_EQ(t.sin[k], float(std::sin(f32_angle))) << pos << " " << i;
      EXPECT_NEAR(double(t.cos[k]) * t.cos[k] + double(t.sin[k]) * t.sin[k], 1.0, 2.5e-7);
      if (float(std::cos(f64_angle)) != t.cos[k]) ++decisive;
    }
  EXPECT_GT(decisive, 10) << "these positions must tell the f32 angle from the f64 one";
}

TEST(RopeTables, BadParametersAreErrors) {
  RopeParams p;
  EXPECT_THROW(rope_inv_freq(p, 7), Error);
  EXPECT_THROW(rope_inv_freq(p, 0), Error);
  p.theta = 0;
  EXPECT_THROW(rope_inv_freq(p, 8), Error);
  RopeParams linear;
  linear.type = RopeType::linear;
  linear.factor = 0;
  EXPECT_THROW(rope_inv_freq(linear, 8), Error);
  RopeParams llama3;
  llama3.type = RopeType::llama3;
  llama3.factor = 8;
  llama3.low_freq_factor = 4;
  llama3.high_freq_factor = 4;
  EXPECT_THROW(rope_inv_freq(llama3, 8), Error);
  llama3.high_freq_factor = 5;
  llama3.original_max_position = 0;
  EXPECT_THROW(rope_inv_freq(llama3, 8), Error);
  EXPECT_THROW(rope_tables({1.0f}, -1), Error);
  EXPECT_STREQ(rope_type_name(RopeType::plain), "default");
  EXPECT_STREQ(rope_type_name(RopeType::linear), "linear");
  EXPECT_STREQ(rope_type_name(RopeType::llama3), "llama3");
}

}  // namespace
}  // namespace strata
