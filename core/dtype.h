// core/dtype.h — element types (f32, bf16, f16) and exact conversions between them.
//
// bf16 and f16 are stored as raw 16-bit patterns; conversion from f32 rounds to nearest, ties to
// even, and keeps NaN a (quiet) NaN. These are the only conversions strata uses, so every path
// (reference, SIMD, CUDA) can be held bit-exact against them. No arithmetic on bf16 is offered.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

enum class DType : uint8_t { f32, bf16, f16 };

constexpr size_t dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }
std::string_view dtype_name(DType t);       // "f32", "bf16", "f16"
DType parse_dtype(std::string_view name);   // accepts f32/float32/fp32, bf16/bfloat16, f16/fp16/float16

struct bf16 {
  uint16_t bits = 0;
};

// f32 → bf16, round to nearest even. NaN stays NaN (quiet bit forced), ±inf stays ±inf, values
// that round past the largest finite bf16 become ±inf (as IEEE rounding requires).
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }
inline bf16 to_bf16(float f) { return bf16{f32_to_bf16_bits(f)}; }
inline float to_f32(bf16 b) { return bf16_bits_to_f32(b.bits); }

// IEEE half precision, for reading f16 checkpoints (and writing them, round to nearest even).
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_f16_bits(float f);

// Bulk conversions (scalar; the fast vectorized casts live in kernels/).
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);
void convert_from_f32(DType dst_type, const float* src, void* dst, size_t n);

}  // namespace strata
