// core/dtype.cpp — names, parsing and the f16 conversions (bf16 is inline in the header).
#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

namespace strata {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "F32") return DType::f32;
  if (n == "bf16" || n == "bfloat16" || n == "BF16") return DType::bf16;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "F16") return DType::f16;
  fail("core::parse_dtype", str("unknown dtype '", n, "'"), "use one of: f32, bf16, f16");
}

float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        man <<= 1;
        ++e;
      } while ((man & 0x400u) == 0);
      out = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u);
  } else {
    out = sign | (exp + (127 - 15)) << 23 | man << 13;
  }
  return std::bit_cast<float>(out);
}

uint16_t f32_to_f16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;           // rounds to inf (>= 65520)
  if (abs < 0x38800000u) {                                 // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                    // < 2^-25: rounds to zero
    uint32_t exp = abs >> 23;
    uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;                            // 14 + (113 - exp) - 1 ... see below
    // value = man * 2^(exp-150); f16 subnormal unit = 2^-24 → q = man >> (126 - exp)
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);          // round to nearest even at bit 13
  return sign | static_cast<uint16_t>((r - 0x38000000u) >> 13);
}

void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16_bits(src[i]);
}

void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(src[i]);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * 4); return;
    case DType::bf16: convert_bf16_to_f32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::f16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_bits_to_f32(s[i]);
      return;
    }
  }
}

void convert_from_f32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * 4); return;
    case DType::bf16: convert_f32_to_bf16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16_bits(src[i]);
      return;
    }
  }
}

}  // namespace strata
