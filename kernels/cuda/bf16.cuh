// kernels/cuda/bf16.cuh — bf16 ⇄ f32 on the device, bit for bit as core/dtype.h does it on the
// host (round to nearest, ties to even; NaN stays a quiet NaN). Included by *.cu files only.
#pragma once

#include <cstdint>

namespace strata::cuda {

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

}  // namespace strata::cuda
