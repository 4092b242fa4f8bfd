// optimizer/adamw_avx2.cpp — AdamW on AVX2 + FMA: adamw_definition on 8 lanes; the tail of a
// range (fewer than 8 elements) goes through a small stack buffer and the same vector code.
// Compiled with -mavx2 -mfma -ffp-contract=off; entered only through kAdamWKernelsAvx2 after
// adamw.cpp has checked the CPU (see the rule in adamw_isa.h).
#include <immintrin.h>

#include "optimizer/adamw_def.h"
#include "optimizer/adamw_isa.h"

namespace strata {
namespace {

constexpr size_t kLanes = 8;

struct Avx2Ops {
  using V = __m256;
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
};

// f32 → bf16 bits, bit-equal to core/dtype.h's f32_to_bf16_bits (see adamw_avx512.cpp).
__m128i f32_to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i bias =
      _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
  // Each 32-bit lane holds a value ≤ 0xffff, so the unsigned-saturating pack is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}

__m256 load_f32(const float* p) { return _mm256_loadu_ps(p); }
__m256 load_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
void store_f32(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
void store_bf16(uint16_t* p, __m128i x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), x); }

// The store of the bf16 copy: non-temporal when `nt` (see kAdamWNonTemporalElems; the caller
// checked the 16-byte alignment and fences at the end).
void store_copy(uint16_t* p, __m128i x, bool nt) {
  if (nt)
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), x);
  else
    store_bf16(p, x);
}

bool use_nontemporal(size_t n, const uint16_t* out) {
  return out && n >= kAdamWNonTemporalElems && reinterpret_cast<uintptr_t>(out) % 16 == 0;
}

// The last < 8 elements of a range, padded to one vector: zeros, and v = 1 so the padding
// lanes' d stays > 0 (no invalid-operation flag from 0/0 in lanes nobody reads).
struct Tail {
  float param[kLanes] = {}, grad[kLanes] = {}, m[kLanes] = {};
  float v[kLanes] = {1, 1, 1, 1, 1, 1, 1, 1};
  uint16_t grad_bf16[kLanes] = {}, m_bf16[kLanes] = {}, param_bf16[kLanes] = {};
  uint16_t v_bf16[kLanes] = {0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80, 0x3f80};
};

template <bool kGradBf16, bool kStateBf16, bool kCopyBf16>
struct UpdateKernel {
  static void lanes(const AdamWLaneConsts<__m256>& c, const AdamWTensors& t, size_t i, bool nt) {
    __m256 g, m, v;
    if constexpr (kGradBf16)
      g = load_bf16(t.grad_bf16 + i);
    else
      g = load_f32(t.grad + i);
    __m256 p = load_f32(t.param + i);
    if constexpr (kStateBf16) {
      m = load_bf16(t.m_bf16 + i);
      v = load_bf16(t.v_bf16 + i);
    } else {
      m = load_f32(t.m + i);
      v = load_f32(t.v + i);
    }
    adamw_definition<Avx2Ops>(c, g, p, m, v);
    store_f32(t.param + i, p);
    if constexpr (kStateBf16) {
      store_bf16(t.m_bf16 + i, f32_to_bf16(m));
      store_bf16(t.v_bf16 + i, f32_to_bf16(v));
    } else {
      store_f32(t.m + i, m);
      store_f32(t.v + i, v);
    }
    if constexpr (kCopyBf16) store_copy(t.param_bf16 + i, f32_to_bf16(p), nt);
  }

  static void tail(const AdamWLaneConsts<__m256>& c, const AdamWTensors& t, size_t i, size_t n) {
    Tail b;
    AdamWTensors local;
    local.param = b.param;
    for (size_t j = 0; j < n; ++j) b.param[j] = t.param[i + j];
    if constexpr (kGradBf16) {
      local.grad_bf16 = b.grad_bf16;
      for (size_t j = 0; j < n; ++j) b.grad_bf16[j] = t.grad_bf16[i + j];
    } else {
      local.grad = b.grad;
      for (size_t j = 0; j < n; ++j) b.grad[j] = t.grad[i + j];
    }
    if constexpr (kStateBf16) {
      local.m_bf16 = b.m_bf16;
      local.v_bf16 = b.v_bf16;
      for (size_t j = 0; j < n; ++j) b.m_bf16[j] = t.m_bf16[i + j], b.v_bf16[j] = t.v_bf16[i + j];
    } else {
      local.m = b.m;
      local.v = b.v;
      for (size_t j = 0; j < n; ++j) b.m[j] = t.m[i + j], b.v[j] = t.v[i + j];
    }
    if constexpr (kCopyBf16) local.param_bf16 = b.param_bf16;
    lanes(c, local, 0, false);
    for (size_t j = 0; j < n; ++j) t.param[i + j] = b.param[j];
    if constexpr (kStateBf16) {
      for (size_t j = 0; j < n; ++j) t.m_bf16[i + j] = b.m_bf16[j], t.v_bf16[i + j] = b.v_bf16[j];
    } else {
      for (size_t j = 0; j < n; ++j) t.m[i + j] = b.m[j], t.v[i + j] = b.v[j];
    }
    if constexpr (kCopyBf16) {
      for (size_t j = 0; j < n; ++j) t.param_bf16[i + j] = b.param_bf16[j];
    }
  }

  static void run(const AdamWStepConsts& sc, const AdamWTensors& tensors, size_t begin,
                  size_t end) {
    const AdamWTensors t = tensors;  // a local copy: the stores cannot alias its pointers
    const AdamWLaneConsts<__m256> c = adamw_broadcast<Avx2Ops>(sc);
    const bool nt = kCopyBf16 && use_nontemporal(t.n, t.param_bf16);
    size_t i = begin;
    for (; i + kLanes <= end; i += kLanes) lanes(c, t, i, nt);
    if (i < end) tail(c, t, i, end - i);
    if (nt) _mm_sfence();  // order the streaming stores before the task's completion
  }
};

void update(const AdamWStepConsts& c, const AdamWTensors& t, size_t begin, size_t end) {
  adamw_run_variant<UpdateKernel>(c, t, begin, end);
}

void scale(float* x, float s, size_t begin, size_t end) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes) store_f32(x + i, _mm256_mul_ps(load_f32(x + i), vs));
  if (i < end) {
    float b[kLanes] = {};
    for (size_t j = 0; j < end - i; ++j) b[j] = x[i + j];
    store_f32(b, _mm256_mul_ps(load_f32(b), vs));
    for (size_t j = 0; j < end - i; ++j) x[i + j] = b[j];
  }
}

void to_bf16(const float* x, uint16_t* out, size_t n, size_t begin, size_t end) {
  const bool nt = use_nontemporal(n, out);
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes) store_copy(out + i, f32_to_bf16(load_f32(x + i)), nt);
  if (i < end) {
    float b[kLanes] = {};
    uint16_t o[kLanes] = {};
    for (size_t j = 0; j < end - i; ++j) b[j] = x[i + j];
    store_bf16(o, f32_to_bf16(load_f32(b)));
    for (size_t j = 0; j < end - i; ++j) out[i + j] = o[j];
  }
  if (nt) _mm_sfence();
}

void stream_lanes(const AdamWTensors& t, size_t i, bool nt) {
  const __m256i g = _mm256_castps_si256(load_f32(t.grad + i));
  const __m256i p = _mm256_xor_si256(_mm256_castps_si256(load_f32(t.param + i)), g);
  const __m256i m = _mm256_xor_si256(_mm256_castps_si256(load_f32(t.m + i)), g);
  const __m256i v = _mm256_xor_si256(_mm256_castps_si256(load_f32(t.v + i)), g);
  store_f32(t.param + i, _mm256_castsi256_ps(p));
  store_f32(t.m + i, _mm256_castsi256_ps(m));
  store_f32(t.v + i, _mm256_castsi256_ps(v));
  if (t.param_bf16) {
    const __m256i h = _mm256_srli_epi32(p, 16);
    store_copy(t.param_bf16 + i,
               _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)), nt);
  }
}

void stream(const AdamWTensors& tensors, size_t begin, size_t end) {
  const AdamWTensors t = tensors;  // a local copy: the stores cannot alias its pointers
  const bool nt = use_nontemporal(t.n, t.param_bf16);  // the same stores as the step's
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes) stream_lanes(t, i, nt);
  for (; i < end; ++i) {  // the tail: the same xor, lane by lane (its speed is immaterial)
    const __m128i g = _mm_castps_si128(_mm_load_ss(t.grad + i));
    const __m128i p = _mm_xor_si128(_mm_castps_si128(_mm_load_ss(t.param + i)), g);
    _mm_store_ss(t.param + i, _mm_castsi128_ps(p));
    _mm_store_ss(t.m + i,
                 _mm_castsi128_ps(_mm_xor_si128(_mm_castps_si128(_mm_load_ss(t.m + i)), g)));
    _mm_store_ss(t.v + i,
                 _mm_castsi128_ps(_mm_xor_si128(_mm_castps_si128(_mm_load_ss(t.v + i)), g)));
    if (t.param_bf16)
      t.param_bf16[i] = static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_srli_epi32(p, 16)));
  }
  if (nt) _mm_sfence();
}

}  // namespace

constinit const AdamWKernels kAdamWKernelsAvx2 = {true, &update, &scale, &to_bf16, &stream};

}  // namespace strata
