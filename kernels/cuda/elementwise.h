// kernels/cuda/elementwise.h — launchers of the elementwise CUDA ops (elementwise.cu): add,
// scale and the f32 ⇄ bf16 casts. Bit-exact with the CPU paths (one IEEE operation per element;
// the cast rounds to nearest even exactly as core/dtype.h does).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

class CudaStream;

void launch_add(CudaStream& s, float* out, const float* a, const float* b, size_t n);
void launch_scale(CudaStream& s, float* x, float alpha, size_t n);
void launch_cast_f32_to_bf16(CudaStream& s, uint16_t* out, const float* in, size_t n);
void launch_cast_bf16_to_f32(CudaStream& s, float* out, const uint16_t* in, size_t n);
void launch_round_to_bf16(CudaStream& s, float* out, const float* in, size_t n);

}  // namespace strata::cuda
