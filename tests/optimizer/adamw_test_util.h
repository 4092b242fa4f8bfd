// tests/optimizer/adamw_test_util.h — what the AdamW tests share (the CPU paths' and the CUDA
// kernel's): the dtype variants, shards of seeded awkward values, and bitwise comparison that
// names the first differing element.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "optimizer/adamw.h"

namespace strata::test {

// Which operands are bf16: the gradient, m and v, and whether the step writes a bf16 copy.
struct AdamWVariant {
  bool grad_bf16 = false;
  bool state_bf16 = false;
  bool copy_bf16 = false;
  std::string name() const {
    return str(grad_bf16 ? "grad_bf16" : "grad_f32", state_bf16 ? "+state_bf16" : "+state_f32",
               copy_bf16 ? "+copy_bf16" : "");
  }
};

inline std::vector<AdamWVariant> all_adamw_variants() {
  std::vector<AdamWVariant> out;
  for (int i = 0; i < 8; ++i) out.push_back({bool(i & 4), bool(i & 2), bool(i & 1)});
  return out;
}

// Values a training run meets, plus the awkward ones: zeros, subnormals, huge and tiny
// magnitudes, gradients whose scaled square underflows. No NaN: x86 may return either NaN
// operand's payload, so NaN bits are not part of the definition (NaN stays NaN).
inline float adamw_draw(std::mt19937& rng, float typical) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  switch (pick(rng)) {
    case 0:
      return 0.0f;
    case 1:
      return -0.0f;
    case 2:
      return 1e-40f * u(rng);  // subnormal
    case 3:
      return 1e20f * u(rng);
    case 4:
      return 1e-20f * u(rng);
    case 5:
      return typical * std::ldexp(u(rng), -30);
    default:
      return typical * u(rng) * std::exp2(4.0f * u(rng));
  }
}

// The AdamW operands of a variant, from n-element arrays (host or device memory).
inline AdamWTensors adamw_tensors(float* p, const float* g, const uint16_t* gb, float* m,
                                  float* v, uint16_t* mb, uint16_t* vb, uint16_t* pb, size_t n,
                                  const AdamWVariant& variant) {
  AdamWTensors t;
  t.n = n;
  t.param = p;
  if (variant.grad_bf16) t.grad_bf16 = gb;
  else t.grad = g;
  if (variant.state_bf16) {
    t.m_bf16 = mb;
    t.v_bf16 = vb;
  } else {
    t.m = m;
    t.v = v;
  }
  if (variant.copy_bf16) t.param_bf16 = pb;
  return t;
}

// One shard's host arrays in every dtype, starting `offset` elements into their allocation
// (offset 1 makes every pointer 4- or 2-byte aligned only, so the vector paths run on unaligned
// data).
struct AdamWShard {
  size_t n = 0, offset = 0;
  AdamWVariant variant;
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> gb, mb, vb, pb;

  AdamWTensors tensors(const AdamWVariant& as) {
    const size_t o = offset;
    return adamw_tensors(p.data() + o, g.data() + o, gb.data() + o, m.data() + o, v.data() + o,
                         mb.data() + o, vb.data() + o, pb.data() + o, n, as);
  }
  AdamWTensors tensors() { return tensors(variant); }
};

// Seeded values for every array (the bf16 ones rounded from the f32 ones; the copy 0xdead).
inline AdamWShard make_adamw_shard(size_t n, size_t offset, AdamWVariant variant, uint32_t seed) {
  AdamWShard s;
  s.n = n;
  s.offset = offset;
  s.variant = variant;
  const size_t total = n + offset;
  for (auto* a : {&s.p, &s.g, &s.m, &s.v}) a->resize(total);
  for (auto* a : {&s.gb, &s.mb, &s.vb}) a->resize(total);
  s.pb.assign(total, 0xdead);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < total; ++i) {
    s.p[i] = adamw_draw(rng, 1.0f);
    s.g[i] = adamw_draw(rng, 1e-2f);
    s.m[i] = adamw_draw(rng, 1e-3f);
    s.v[i] = std::fabs(adamw_draw(rng, 1e-6f));
    s.gb[i] = f32_to_bf16_bits(s.g[i]);
    s.mb[i] = f32_to_bf16_bits(s.m[i]);
    s.vb[i] = f32_to_bf16_bits(s.v[i]);
  }
  return s;
}

// Bitwise equality of two arrays; on a mismatch, the count and the first index with both values
// (labelled `want_is` and `got_is`).
template <class T>
::testing::AssertionResult same_bits(const char* what, const std::vector<T>& want,
                                     const std::vector<T>& got, const char* want_is = "reference",
                                     const char* got_is = "got") {
  if (want.size() != got.size())
    return ::testing::AssertionFailure()
           << what << ": sizes " << want.size() << " vs " << got.size();
  if (std::memcmp(want.data(), got.data(), want.size() * sizeof(T)) == 0)
    return ::testing::AssertionSuccess();
  size_t first = want.size(), count = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0) {
      if (first == want.size()) first = i;
      ++count;
    }
  }
  auto show = [](T x) {
    char buf[64];
    if constexpr (sizeof(T) == 4)
      std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", double(x), std::bit_cast<uint32_t>(x));
    else
      std::snprintf(buf, sizeof buf, "0x%04x", unsigned{x});
    return std::string(buf);
  };
  return ::testing::AssertionFailure()
         << what << ": " << count << " of " << want.size() << " elements differ; first at "
         << first << ": " << want_is << " " << show(want[first]) << ", " << got_is << " " << show(got[first]);
}

// Every array of two shards bit for bit.
inline ::testing::AssertionResult same_shard(const AdamWShard& want, const AdamWShard& got,
                                             const char* want_is = "reference",
                                             const char* got_is = "got") {
  for (auto r : {same_bits("param", want.p, got.p, want_is, got_is),
                 same_bits("m", want.m, got.m, want_is, got_is),
                 same_bits("v", want.v, got.v, want_is, got_is),
                 same_bits("m_bf16", want.mb, got.mb, want_is, got_is),
                 same_bits("v_bf16", want.vb, got.vb, want_is, got_is),
                 same_bits("param_bf16", want.pb, got.pb, want_is, got_is)})
    if (!r) return r;
  return ::testing::AssertionSuccess();
}

}  // namespace strata::test
