// bf16 / f16 conversions: round to nearest even, special values, exhaustive round trips.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"

using namespace strata;

namespace {
// Reference bf16 rounding written independently: pick the nearer of the two neighbouring bf16
// values, ties to the one with an even last bit, computed in double.
uint16_t ref_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation (towards zero in magnitude)
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double d = f, dl = bf16_bits_to_f32(lo);
  double dh = ((hi & 0x7f80) == 0x7f80) ? std::copysign(std::ldexp(1.0, 128), d) : bf16_bits_to_f32(hi);
  double el = std::fabs(d - dl), eh = std::fabs(dh - d);
  if (el < eh) return lo;
  if (eh < el) return hi;
  return (lo & 1) ? hi : lo;
}
}  // namespace

TEST(BF16, RoundsToNearestEvenOnEveryExponent) {
  // Every exponent, mantissas around the rounding point (tie, just below, just above).
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t e = 0; e < 255; ++e)
      for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
        for (uint32_t m7 : {0u, 1u, 0x7eu, 0x7fu}) {
          uint32_t u = sign << 31 | e << 23 | m7 << 16 | low;
          float f = std::bit_cast<float>(u);
          ASSERT_EQ(f32_to_bf16_bits(f), ref_bf16(f)) << std::hex << u;
        }
}

TEST(BF16, SpecialValues) {
  EXPECT_EQ(f32_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  uint16_t nan = f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(nan)));
  // A signalling NaN whose payload lives only in the low bits must stay a NaN.
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));
  // Ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 → even (1.0).
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3.0f / 256), 0x3f82);
}

TEST(BF16, EveryBf16RoundTripsExactly) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = bf16_bits_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16_bits(f), b);
  }
}

TEST(F16, EveryHalfRoundTripsAndMatchesHardwareRounding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_bits_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16_bits(f), h) << std::hex << h;
  }
  // Values between halves round to nearest even, compared with _Float16 (IEEE in GCC).
  for (uint32_t u = 0x30000000u; u < 0x48000000u; u += 0x1357u) {
    float f = std::bit_cast<float>(u);
    _Float16 hw = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &hw, 2);
    ASSERT_EQ(f32_to_f16_bits(f), hb) << std::hex << u;
    ASSERT_EQ(f32_to_f16_bits(-f), hb | 0x8000) << std::hex << u;
  }
}

TEST(DType, ParseAndNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(dtype_name(DType::f16), "f16");
  EXPECT_THROW(parse_dtype("int8"), Error);
}
