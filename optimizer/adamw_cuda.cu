// optimizer/adamw_cuda.cu — AdamW on the GPU for optimizer states that live in device memory.
//
// Follows optimizer/adamw_def.h step by step — (1) to (6), each one correctly rounded IEEE
// binary32 operation written as an explicit intrinsic (__fmul_rn, __fmaf_rn, __fsqrt_rn,
// __fdiv_rn) — and the file is compiled with -fmad=false, so nothing else is fused; denormals
// are kept (no -ftz). With the per-step constants computed on the host by adamw_step_constants,
// every element gets the bits the scalar, AVX2 and AVX-512 paths give. The bf16 conversions are
// core/dtype.h's (kernels/cuda/bf16.cuh). One thread per element in a grid-stride loop; the
// dtype variant is a template, as in the CPU kernels.
// Not here: validation and the step constants (adamw_stream.cpp), multi-tensor launches.
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/bf16.cuh"
#include "optimizer/adamw_cuda.h"

namespace strata {
namespace {

constexpr int kThreads = 256;

template <bool kGradBf16, bool kStateBf16, bool kCopyBf16>
__global__ void adamw_kernel(AdamWStepConsts c, AdamWTensors t) {
  using cuda::bf16_bits_to_f32;
  using cuda::f32_to_bf16_bits;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < t.n;
       i += size_t(gridDim.x) * blockDim.x) {
    float g = kGradBf16 ? bf16_bits_to_f32(t.grad_bf16[i]) : t.grad[i];
    float m = kStateBf16 ? bf16_bits_to_f32(t.m_bf16[i]) : t.m[i];
    float v = kStateBf16 ? bf16_bits_to_f32(t.v_bf16[i]) : t.v[i];
    float p = t.param[i];
    g = __fmul_rn(g, c.grad_scale);                                               // (1)
    p = __fmul_rn(p, c.decay);                                                    // (2)
    m = __fmaf_rn(c.one_minus_beta1, g, __fmul_rn(c.beta1, m));                   // (3)
    v = __fmaf_rn(__fmul_rn(c.one_minus_beta2, g), g, __fmul_rn(c.beta2, v));     // (4)
    const float denom = __fmaf_rn(__fsqrt_rn(v), c.rsqrt_bias2, c.eps);           // (5)
    p = __fmaf_rn(c.neg_step_size, __fdiv_rn(m, denom), p);                       // (6)
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

template <bool kGradBf16, bool kStateBf16, bool kCopyBf16>
void launch(cudaStream_t s, const AdamWStepConsts& c, const AdamWTensors& t) {
  const size_t blocks = (t.n + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(blocks > 65536 ? 65536 : blocks);
  adamw_kernel<kGradBf16, kStateBf16, kCopyBf16><<<grid, kThreads, 0, s>>>(c, t);
}

}  // namespace

bool adamw_cuda_built() { return true; }

void adamw_cuda_launch(void* cuda_stream, const AdamWStepConsts& c, const AdamWTensors& t) {
  cudaStream_t s = static_cast<cudaStream_t>(cuda_stream);
  const int variant = (t.grad_bf16 ? 4 : 0) | (t.m_bf16 ? 2 : 0) | (t.param_bf16 ? 1 : 0);
  switch (variant) {
    case 0: launch<false, false, false>(s, c, t); break;
    case 1: launch<false, false, true>(s, c, t); break;
    case 2: launch<false, true, false>(s, c, t); break;
    case 3: launch<false, true, true>(s, c, t); break;
    case 4: launch<true, false, false>(s, c, t); break;
    case 5: launch<true, false, true>(s, c, t); break;
    case 6: launch<true, true, false>(s, c, t); break;
    default: launch<true, true, true>(s, c, t); break;
  }
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata
