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
#include "tests/optimizer/adamw_test_util.h"

namespace strata {
namespace {

using test::Gpu;
using Variant = test::AdamWVariant;
using Shard = test::AdamWShard;
using test::adamw_tensors;
using test::all_adamw_variants;
using test::make_adamw_shard;

// The shard's arrays in device memory, same offsets.
struct DeviceShard {
  Buffer p, g, m, v, gb, mb, vb, pb;
  DeviceShard(Gpu& gpu, const Shard& s)
      : p(gpu.upload(s.p)), g(gpu.upload(s.g)), m(gpu.upload(s.m)), v(gpu.upload(s.v)),
        gb(gpu.upload(s.gb)), mb(gpu.upload(s.mb)), vb(gpu.upload(s.vb)), pb(gpu.upload(s.pb)) {}
  AdamWTensors tensors(const Shard& s, const Variant& var) const {
    const size_t o = s.offset;
    return adamw_tensors(p.as<float>() + o, g.as<float>() + o, gb.as<uint16_t>() + o,
                         m.as<float>() + o, v.as<float>() + o, mb.as<uint16_t>() + o,
                         vb.as<uint16_t>() + o, pb.as<uint16_t>() + o, s.n, var);
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

// The CPU reference against what the CUDA kernel computed, bit for bit.
::testing::AssertionResult same_as_cpu(const Shard& want, const Shard& got) {
  return test::same_shard(want, got, "CPU", "CUDA");
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
      const Shard initial = make_adamw_shard(n, offset, {}, uint32_t(n * 131 + offset));
      for (const Variant& var : all_adamw_variants())
        for (const float wd : big ? std::vector<float>{0.1f} : std::vector<float>{0.0f, 0.1f})
          for (const float scale : {1.0f, 0.37f}) {
            SCOPED_TRACE(str("n=", n, " offset=", offset, " ", var.name(), " wd=", wd, " grad_scale=", scale));
            Shard want = initial;
            DeviceShard dev(gpu, initial);
            const AdamWHyper h = hyper_with(wd);
            for (int64_t step = 1; step <= 3; ++step) {
              adamw_update_isa(AdamIsa::scalar, h, step, scale, want.tensors(var));
              adamw_update_on_stream(*gpu.s, h, step, scale, dev.tensors(initial, var));
            }
            ASSERT_TRUE(same_as_cpu(want, dev.download(gpu, initial)));
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
  Shard initial = make_adamw_shard(n, 0, {}, 5);
  Shard prescaled = initial;
  for (float& g : prescaled.g) g = g * 0.37f;
  DeviceShard fused(gpu, initial), first(gpu, prescaled);
  const AdamWHyper h = hyper_with(0.1f);
  adamw_update_on_stream(*gpu.s, h, 4, 0.37f, fused.tensors(initial, var));
  adamw_update_on_stream(*gpu.s, h, 4, 1.0f, first.tensors(prescaled, var));
  ASSERT_TRUE(test::same_shard(first.download(gpu, prescaled), fused.download(gpu, initial),
                               "scaled first", "fused"));
}

TEST(CudaAdamW, ArgumentErrorsThrowAtTheCall) {
  STRATA_REQUIRE_CUDA();
  Gpu gpu;
  Shard s = make_adamw_shard(16, 0, {}, 1);
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
  for (const Variant& var : all_adamw_variants()) {
    SCOPED_TRACE(var.name());
    const Shard initial = make_adamw_shard(4097, 1, {}, 9);
    Shard want = initial, got = initial;
    const AdamWHyper h = hyper_with(0.1f);
    adamw_update_isa(AdamIsa::scalar, h, 2, 0.5f, want.tensors(var));
    bool before = false;
    s->host_task("before", [&] { before = true; });
    adamw_update_on_stream(*s, h, 2, 0.5f, got.tensors(var), AdamIsa::scalar);
    s->synchronize();
    EXPECT_TRUE(before);
    ASSERT_TRUE(test::same_shard(want, got, "direct", "on the stream"));
  }
  Shard bad = make_adamw_shard(8, 0, {}, 2);
  AdamWTensors t = bad.tensors({false, false, false});
  t.m = nullptr;  // inconsistent state
  EXPECT_THROW(adamw_update_on_stream(*s, hyper_with(0), 1, 1.0f, t), Error);
  s->synchronize();
}

}  // namespace
}  // namespace strata
