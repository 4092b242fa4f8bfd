// adamw_update_on_stream: the CUDA kernel bit-identical to the CPU scalar reference — sizes 1, 7,
// 4097 and 1M+3, several steps (step 1's extreme bias corrections included), weight decay on and
// off, a fused gradient scale, every dtype variant (bf16 gradient, bf16 moments, the bf16 copy),
// unaligned pointers — and the same entry point on a CPU stream (a host task running
// adamw_update; runs everywhere, no GPU needed). The CUDA tests skip without a CUDA device.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/device.h"
#include "optimizer/adamw.h"
#include "tests/gpu/gpu_test_util.h"

namespace strata {
namespace {

using test::Gpu;

struct Variant {
  bool grad_bf16, state_bf16, copy_bf16;
  std::string name() const {
    return str(grad_bf16 ? "grad_bf16" : "grad_f32", state_bf16 ? "+state_bf16" : "+state_f32",
               copy_bf16 ? "+copy_bf16" : "");
  }
};

std::vector<Variant> all_variants() {
  std::vector<Variant> out;
  for (int i = 0; i < 8; ++i) out.push_back({bool(i & 4), bool(i & 2), bool(i & 1)});
  return out;
}

// Values a run meets plus awkward ones (zeros, subnormals, huge and tiny magnitudes, gradients
// whose scaled square underflows). No NaN: NaN payloads are not part of the definition.
float draw(std::mt19937& rng, float typical) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  switch (std::uniform_int_distribution<int>(0, 63)(rng)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 1e-40f * u(rng);
    case 3: return 1e20f * u(rng);
    case 4: return 1e-20f * u(rng);
    case 5: return typical * std::ldexp(u(rng), -30);
    default: return typical * u(rng) * std::exp2(4.0f * u(rng));
  }
}

// One shard's host arrays, `offset` elements into each allocation.
struct Shard {
  size_t n = 0, offset = 0;
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> gb, mb, vb, pb;
};

Shard make_shard(size_t n, size_t offset, uint32_t seed) {
  Shard s;
  s.n = n;
  s.offset = offset;
  const size_t total = n + offset;
  s.p.resize(total), s.g.resize(total), s.m.resize(total), s.v.resize(total);
  s.gb.resize(total), s.mb.resize(total), s.vb.resize(total);
  s.pb.assign(total, 0xdead);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < total; ++i) {
    s.p[i] = draw(rng, 1.0f);
    s.g[i] = draw(rng, 1e-2f);
    s.m[i] = draw(rng, 1e-3f);
    s.v[i] = std::fabs(draw(rng, 1e-6f));
    s.gb[i] = f32_to_bf16_bits(s.g[i]);
    s.mb[i] = f32_to_bf16_bits(s.m[i]);
    s.vb[i] = f32_to_bf16_bits(s.v[i]);
  }
  return s;
}

AdamWTensors tensors_of(float* p, const float* g, const uint16_t* gb, float* m, float* v, uint16_t* mb,
                        uint16_t* vb, uint16_t* pb, size_t n, const Variant& var) {
  AdamWTensors t;
  t.n = n;
  t.param = p;
  if (var.grad_bf16) t.grad_bf16 = gb;
  else t.grad = g;
  if (var.state_bf16) {
    t.m_bf16 = mb;
    t.v_bf16 = vb;
  } else {
    t.m = m;
    t.v = v;
  }
  if (var.copy_bf16) t.param_bf16 = pb;
  return t;
}

AdamWTensors host_tensors(Shard& s, const Variant& var) {
  const size_t o = s.offset;
  return tensors_of(s.p.data() + o, s.g.data() + o, s.gb.data() + o, s.m.data() + o, s.v.data() + o,
                    s.mb.data() + o, s.vb.data() + o, s.pb.data() + o, s.n, var);
}

// The shard's arrays in device memory, same offsets.
struct DeviceShard {
  Buffer p, g, m, v, gb, mb, vb, pb;
  DeviceShard(Gpu& gpu, const Shard& s)
      : p(gpu.upload(s.p)), g(gpu.upload(s.g)), m(gpu.upload(s.m)), v(gpu.upload(s.v)),
        gb(gpu.upload(s.gb)), mb(gpu.upload(s.mb)), vb(gpu.upload(s.vb)), pb(gpu.upload(s.pb)) {}
  AdamWTensors tensors(const Shard& s, const Variant& var) const {
    const size_t o = s.offset;
    return tensors_of(p.as<float>() + o, g.as<float>() + o, gb.as<uint16_t>() + o, m.as<float>() + o,
                      v.as<float>() + o, mb.as<uint16_t>() + o, vb.as<uint16_t>() + o,
                      pb.as<uint16_t>() + o, s.n, var);
  }
  Shard download(Gpu& gpu, const Shard& like) const {
    Shard s = like;
    const size_t total = like.n + like.offset;
    s.p = gpu.download<float>(p, total);
    s.m = gpu.download<float>(m, total);
    s.v = gpu.download<float>(v, total);
    s.mb = gpu.download<uint16_t>(mb, total);
    s.vb = gpu.download<uint16_t>(vb, total);
    s.pb = gpu.download<uint16_t>(pb, total);
    return s;
  }
};

template <class T>
::testing::AssertionResult same_bits(const char* what, const std::vector<T>& want, const std::vector<T>& got) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << what << ": sizes " << want.size() << " vs " << got.size();
  size_t first = want.size(), count = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0) {
      if (first == want.size()) first = i;
      ++count;
    }
  if (count == 0) return ::testing::AssertionSuccess();
  auto show = [](T x) {
    char buf[64];
    if constexpr (sizeof(T) == 4) std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", double(x), std::bit_cast<uint32_t>(x));
    else std::snprintf(buf, sizeof buf, "0x%04x", unsigned{x});
    return std::string(buf);
  };
  return ::testing::AssertionFailure() << what << ": " << count << " of " << want.size()
                                       << " elements differ; first at " << first << ": CPU "
                                       << show(want[first]) << ", CUDA " << show(got[first]);
}

::testing::AssertionResult same_shard(const Shard& want, const Shard& got) {
  for (auto r : {same_bits("param", want.p, got.p), same_bits("m", want.m, got.m), same_bits("v", want.v, got.v),
                 same_bits("m_bf16", want.mb, got.mb), same_bits("v_bf16", want.vb, got.vb),
                 same_bits("param_bf16", want.pb, got.pb)})
    if (!r) return r;
  return ::testing::AssertionSuccess();
}

AdamWHyper hyper_with(float weight_decay) {
  AdamWHyper h;
  h.lr = 3e-3f;
  h.beta2 = 0.95f;
  h.weight_decay = weight_decay;
  return h;
}

TEST(CudaAdamW, BitIdenticalToTheScalarReference) {
  STRATA_REQUIRE_CUDA();
  Gpu gpu;
  for (const size_t n : {size_t(1), size_t(7), size_t(4097), (size_t(1) << 20) + 3}) {
    const bool big = n > 100000;
    for (const size_t offset : big ? std::vector<size_t>{0} : std::vector<size_t>{0, 1}) {
      const Shard initial = make_shard(n, offset, uint32_t(n * 131 + offset));
      for (const Variant& var : all_variants())
        for (const float wd : big ? std::vector<float>{0.1f} : std::vector<float>{0.0f, 0.1f})
          for (const float scale : {1.0f, 0.37f}) {
            SCOPED_TRACE(str("n=", n, " offset=", offset, " ", var.name(), " wd=", wd, " grad_scale=", scale));
            Shard want = initial;
            DeviceShard dev(gpu, initial);
            const AdamWHyper h = hyper_with(wd);
            for (int64_t step = 1; step <= 3; ++step) {
              adamw_update_isa(AdamIsa::scalar, h, step, scale, host_tensors(want, var));
              adamw_update_on_stream(*gpu.s, h, step, scale, dev.tensors(initial, var));
            }
            ASSERT_TRUE(same_shard(want, dev.download(gpu, initial)));
          }
    }
  }
}

TEST(CudaAdamW, FusedScaleEqualsScalingFirst) {
  // Step (1) of the definition is the one multiply a separate scaling pass would do.
  STRATA_REQUIRE_CUDA();
  Gpu gpu;
  const size_t n = 4097;
  const Variant var{false, false, true};
  Shard initial = make_shard(n, 0, 5);
  Shard prescaled = initial;
  for (float& g : prescaled.g) g = g * 0.37f;
  DeviceShard fused(gpu, initial), first(gpu, prescaled);
  const AdamWHyper h = hyper_with(0.1f);
  adamw_update_on_stream(*gpu.s, h, 4, 0.37f, fused.tensors(initial, var));
  adamw_update_on_stream(*gpu.s, h, 4, 1.0f, first.tensors(prescaled, var));
  ASSERT_TRUE(same_shard(first.download(gpu, prescaled), fused.download(gpu, initial)));
}

TEST(CudaAdamW, ArgumentErrorsThrowAtTheCall) {
  STRATA_REQUIRE_CUDA();
  Gpu gpu;
  Shard s = make_shard(16, 0, 1);
  DeviceShard dev(gpu, s);
  AdamWTensors t = dev.tensors(s, {false, false, false});
  EXPECT_THROW(adamw_update_on_stream(*gpu.s, hyper_with(0), 0, 1.0f, t), Error);  // step 0
  EXPECT_THROW(adamw_update_on_stream(*gpu.s, hyper_with(0), 1, NAN, t), Error);
  t.grad_bf16 = dev.gb.as<uint16_t>();  // both gradients
  EXPECT_THROW(adamw_update_on_stream(*gpu.s, hyper_with(0), 1, 1.0f, t), Error);
  gpu.s->synchronize();
}

// ---- the CPU stream (no GPU needed) ---------------------------------------------------------

TEST(AdamWOnStream, CpuStreamRunsTheCpuUpdateInStreamOrder) {
  auto cpu = make_device(DeviceKind::cpu);
  auto s = cpu->make_stream("optimizer");
  for (const Variant& var : all_variants()) {
    SCOPED_TRACE(var.name());
    const Shard initial = make_shard(4097, 1, 9);
    Shard want = initial, got = initial;
    const AdamWHyper h = hyper_with(0.1f);
    adamw_update_isa(AdamIsa::scalar, h, 2, 0.5f, host_tensors(want, var));
    bool before = false;
    s->host_task("before", [&] { before = true; });
    adamw_update_on_stream(*s, h, 2, 0.5f, host_tensors(got, var), AdamIsa::scalar);
    s->synchronize();
    EXPECT_TRUE(before);
    ASSERT_TRUE(same_shard(want, got));
  }
  Shard bad = make_shard(8, 0, 2);
  AdamWTensors t = host_tensors(bad, {false, false, false});
  t.m = nullptr;  // inconsistent state
  EXPECT_THROW(adamw_update_on_stream(*s, hyper_with(0), 1, 1.0f, t), Error);
  s->synchronize();
}

}  // namespace
}  // namespace strata
