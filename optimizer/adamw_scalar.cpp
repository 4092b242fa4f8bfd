// optimizer/adamw_scalar.cpp — the scalar reference: adamw_definition on one float at a time,
// with the bf16 conversions of core/dtype.h. Compiled for the baseline x86-64 (or any) target,
// with -ffp-contract=off, so it is the oracle the vector paths are tested against; it stays.
// Not fast and not meant to be: it is what "correct" means.
#include <bit>
#include <cmath>

#include "core/dtype.h"
#include "optimizer/adamw_def.h"
#include "optimizer/adamw_isa.h"

namespace strata {
namespace {

struct ScalarOps {
  using V = float;
  static float set1(float x) { return x; }
  static float mul(float a, float b) { return a * b; }
  static float fma(float a, float b, float c) { return std::fma(a, b, c); }
  static float sqrt(float a) { return std::sqrt(a); }
  static float div(float a, float b) { return a / b; }
};

template <bool kGradBf16, bool kStateBf16, bool kCopyBf16>
struct UpdateKernel {
  static void run(const AdamWStepConsts& sc, const AdamWTensors& t, size_t begin, size_t end) {
    const AdamWLaneConsts<float> c = adamw_broadcast<ScalarOps>(sc);
    for (size_t i = begin; i < end; ++i) {
      float g, m, v;
      if constexpr (kGradBf16)
        g = bf16_bits_to_f32(t.grad_bf16[i]);
      else
        g = t.grad[i];
      if constexpr (kStateBf16) {
        m = bf16_bits_to_f32(t.m_bf16[i]);
        v = bf16_bits_to_f32(t.v_bf16[i]);
      } else {
        m = t.m[i];
        v = t.v[i];
      }
      float p = t.param[i];
      adamw_definition<ScalarOps>(c, g, p, m, v);
      t.param[i] = p;
      if constexpr (kStateBf16) {
        t.m_bf16[i] = f32_to_bf16_bits(m);
        t.v_bf16[i] = f32_to_bf16_bits(v);
      } else {
        t.m[i] = m;
        t.v[i] = v;
      }
      if constexpr (kCopyBf16) t.param_bf16[i] = f32_to_bf16_bits(p);
    }
  }
};

void update(const AdamWStepConsts& c, const AdamWTensors& t, size_t begin, size_t end) {
  adamw_run_variant<UpdateKernel>(c, t, begin, end);
}

void scale(float* x, float s, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) x[i] = x[i] * s;
}

void to_bf16(const float* x, uint16_t* out, size_t /*n*/, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) out[i] = f32_to_bf16_bits(x[i]);
}

void stream(const AdamWTensors& t, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const uint32_t g = std::bit_cast<uint32_t>(t.grad[i]);
    const uint32_t p = std::bit_cast<uint32_t>(t.param[i]) ^ g;
    t.param[i] = std::bit_cast<float>(p);
    t.m[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(t.m[i]) ^ g);
    t.v[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(t.v[i]) ^ g);
    if (t.param_bf16) t.param_bf16[i] = static_cast<uint16_t>(p >> 16);
  }
}

}  // namespace

constinit const AdamWKernels kAdamWKernelsScalar = {true, &update, &scale, &to_bf16, &stream};

}  // namespace strata
