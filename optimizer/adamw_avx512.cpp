// optimizer/adamw_avx512.cpp — AdamW on AVX-512 (F, BW, VL, DQ): adamw_definition on 16 lanes,
// the tail of a range with masked loads and stores. Compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx2 -mfma -ffp-contract=off; entered only through kAdamWKernelsAvx512
// after adamw.cpp has checked the CPU (see the rule in adamw_isa.h). Does not use AVX512_BF16:
// its VCVTNEPS2BF16 flushes subnormals, so the bf16 rounding is done with integer ops instead.
// GCC 12's AVX-512 headers start some intrinsics from a self-initialized undefined vector and
// trip -Wmaybe-uninitialized once inlined (GCC PR 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "optimizer/adamw_def.h"
#include "optimizer/adamw_isa.h"

namespace strata {
namespace {

constexpr size_t kLanes = 16;

struct Avx512Ops {
  using V = __m512;
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
};

// f32 → bf16 bits, bit-equal to core/dtype.h's f32_to_bf16_bits: add 0x7fff plus the lowest
// kept bit and drop 16 bits (round to nearest, ties to even; overflow rounds to ±inf); a NaN
// keeps its sign and top payload with the quiet bit (0x40) set.
__m256i f32_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i bias =
      _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i bits = _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(bits);
}

__m512 bf16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// One vector of loads and stores at an element pointer. kTail: only the lanes of mask k are
// read (the others hold `fill`) and written.
template <bool kTail>
__m512 load_f32(const float* p, __mmask16 k, __m512 fill) {
  if constexpr (kTail)
    return _mm512_mask_loadu_ps(fill, k, p);
  else
    return _mm512_loadu_ps(p);
}
template <bool kTail>
__m512 load_bf16(const uint16_t* p, __mmask16 k, __m512 fill) {
  if constexpr (kTail)
    return _mm512_mask_blend_ps(k, fill, bf16_to_f32(_mm256_maskz_loadu_epi16(k, p)));
  else
    return bf16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
template <bool kTail>
void store_f32(float* p, __mmask16 k, __m512 x) {
  if constexpr (kTail)
    _mm512_mask_storeu_ps(p, k, x);
  else
    _mm512_storeu_ps(p, x);
}
template <bool kTail>
void store_bf16(uint16_t* p, __mmask16 k, __m256i x) {
  if constexpr (kTail)
    _mm256_mask_storeu_epi16(p, k, x);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
}

// The store of a full vector of the bf16 copy: non-temporal when `nt` (see
// kAdamWNonTemporalElems; the caller checked the 32-byte alignment and fences at the end).
void store_copy(uint16_t* p, __m256i x, bool nt) {
  if (nt)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), x);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
}

bool use_nontemporal(size_t n, const uint16_t* out) {
  return out && n >= kAdamWNonTemporalElems && reinterpret_cast<uintptr_t>(out) % 32 == 0;
}

__mmask16 tail_mask(size_t count) { return static_cast<__mmask16>((1u << count) - 1u); }

template <bool kGradBf16, bool kStateBf16, bool kCopyBf16>
struct UpdateKernel {
  template <bool kTail>
  static void lanes(const AdamWLaneConsts<__m512>& c, const AdamWTensors& t, size_t i, __mmask16 k,
                    bool nt) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512 one = _mm512_set1_ps(1.0f);  // v of unused tail lanes: their d stays > 0
    __m512 g, m, v;
    if constexpr (kGradBf16)
      g = load_bf16<kTail>(t.grad_bf16 + i, k, zero);
    else
      g = load_f32<kTail>(t.grad + i, k, zero);
    __m512 p = load_f32<kTail>(t.param + i, k, zero);
    if constexpr (kStateBf16) {
      m = load_bf16<kTail>(t.m_bf16 + i, k, zero);
      v = load_bf16<kTail>(t.v_bf16 + i, k, one);
    } else {
      m = load_f32<kTail>(t.m + i, k, zero);
      v = load_f32<kTail>(t.v + i, k, one);
    }
    adamw_definition<Avx512Ops>(c, g, p, m, v);
    store_f32<kTail>(t.param + i, k, p);
    if constexpr (kStateBf16) {
      store_bf16<kTail>(t.m_bf16 + i, k, f32_to_bf16(m));
      store_bf16<kTail>(t.v_bf16 + i, k, f32_to_bf16(v));
    } else {
      store_f32<kTail>(t.m + i, k, m);
      store_f32<kTail>(t.v + i, k, v);
    }
    if constexpr (kCopyBf16) {
      if constexpr (kTail)
        store_bf16<true>(t.param_bf16 + i, k, f32_to_bf16(p));
      else
        store_copy(t.param_bf16 + i, f32_to_bf16(p), nt);
    }
  }

  static void run(const AdamWStepConsts& sc, const AdamWTensors& tensors, size_t begin,
                  size_t end) {
    const AdamWTensors t = tensors;  // a local copy: the stores cannot alias its pointers
    const AdamWLaneConsts<__m512> c = adamw_broadcast<Avx512Ops>(sc);
    const bool nt = kCopyBf16 && use_nontemporal(t.n, t.param_bf16);
    size_t i = begin;
    for (; i + kLanes <= end; i += kLanes) lanes<false>(c, t, i, 0, nt);
    if (i < end) lanes<true>(c, t, i, tail_mask(end - i), false);
    if (nt) _mm_sfence();  // order the streaming stores before the task's completion
  }
};

void update(const AdamWStepConsts& c, const AdamWTensors& t, size_t begin, size_t end) {
  adamw_run_variant<UpdateKernel>(c, t, begin, end);
}

void scale(float* x, float s, size_t begin, size_t end) {
  const __m512 vs = _mm512_set1_ps(s);
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vs));
  if (i < end) {
    const __mmask16 k = tail_mask(end - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vs));
  }
}

void to_bf16(const float* x, uint16_t* out, size_t n, size_t begin, size_t end) {
  const bool nt = use_nontemporal(n, out);
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    store_copy(out + i, f32_to_bf16(_mm512_loadu_ps(x + i)), nt);
  if (i < end) {
    const __mmask16 k = tail_mask(end - i);
    store_bf16<true>(out + i, k, f32_to_bf16(_mm512_maskz_loadu_ps(k, x + i)));
  }
  if (nt) _mm_sfence();
}

template <bool kTail>
void stream_lanes(const AdamWTensors& t, size_t i, __mmask16 k, bool nt) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512i g = _mm512_castps_si512(load_f32<kTail>(t.grad + i, k, zero));
  const __m512i p = _mm512_xor_si512(_mm512_castps_si512(load_f32<kTail>(t.param + i, k, zero)), g);
  const __m512i m = _mm512_xor_si512(_mm512_castps_si512(load_f32<kTail>(t.m + i, k, zero)), g);
  const __m512i v = _mm512_xor_si512(_mm512_castps_si512(load_f32<kTail>(t.v + i, k, zero)), g);
  store_f32<kTail>(t.param + i, k, _mm512_castsi512_ps(p));
  store_f32<kTail>(t.m + i, k, _mm512_castsi512_ps(m));
  store_f32<kTail>(t.v + i, k, _mm512_castsi512_ps(v));
  if (t.param_bf16) {
    const __m256i high = _mm512_cvtepi32_epi16(_mm512_srli_epi32(p, 16));
    if constexpr (kTail)
      store_bf16<true>(t.param_bf16 + i, k, high);
    else
      store_copy(t.param_bf16 + i, high, nt);
  }
}

void stream(const AdamWTensors& tensors, size_t begin, size_t end) {
  const AdamWTensors t = tensors;  // a local copy: the stores cannot alias its pointers
  const bool nt = use_nontemporal(t.n, t.param_bf16);  // the same stores as the step's
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes) stream_lanes<false>(t, i, 0, nt);
  if (i < end) stream_lanes<true>(t, i, tail_mask(end - i), false);
  if (nt) _mm_sfence();
}

}  // namespace

constinit const AdamWKernels kAdamWKernelsAvx512 = {true, &update, &scale, &to_bf16, &stream};

}  // namespace strata
