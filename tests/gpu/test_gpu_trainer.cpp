// The trainer on the CUDA device (train.device = cuda): 5 AdamW steps against the same run on
// the CPU device, bf16 tensor-core GEMMs against f32 ones, the GEMM rate its MFU is measured
// against, and every offload placement on CUDA bit-identical to all-device on CUDA. Written
// against engine/trainer.h and bench/rate_probe.h; each test skips without a GPU. First run on
// an H200 on 2026-12-04 (bench/results/h200-2026-12-04.md).
//
// Tolerances (as tests/engine/test_golden.cpp against PyTorch): both devices compute in f32 but
// reduce in different orders (cuBLASLt vs OpenBLAS blocking, attention tiling), so the losses of
// 5 steps agree to 2e-5 of the first loss and weights after them to 2e-3 absolute (Adam moves a
// weight with a tiny gradient by up to ~lr when the gradient's rounding differs).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/gemm_bench.h"
#include "bench/rate_probe.h"
#include "core/error.h"
#include "comm/comm.h"
#include "engine/model.h"
#include "engine/trainer.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/support/tiny_config.h"

using namespace strata;

namespace {

Config tiny(const std::string& device) {
  Config c = test::tiny_config({.dim = 64, .ffn_dim = 96, .max_seq_len = 64}, 32, 4);
  c.train.steps = 5;
  c.train.lr = 1e-2f;
  c.train.warmup_steps = 0;
  c.train.device = device;
  return c;
}

const char* kNames[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.1.mlp.down_proj.weight", "model.layers.1.input_layernorm.weight",
                        "model.norm.weight", "lm_head.weight"};

struct TrainRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;  // kNames after training
};

TrainRun run(const Config& c) {
  auto world = make_solo_communicator();
  TrainerOptions opt;
  opt.progress = false;
  Trainer t(c, *world, opt);
  TrainRun r;
  r.losses = t.train().losses;
  for (const char* name : kNames) r.weights.push_back(t.parameter(name));
  return r;
}

TEST(CudaTrainer, FiveStepsMatchTheCpuDevice) {
  STRATA_REQUIRE_CUDA();
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    Config gpu = tiny("cuda"), cpu = tiny("cpu");
    apply_override(gpu, std::string("train.precision=") + precision);
    apply_override(cpu, std::string("train.precision=") + precision);
    apply_override(gpu, "train.matmul_precision=f32");  // the CPU device multiplies in f32
    const TrainRun g = run(gpu), c = run(cpu);
    ASSERT_EQ(g.losses.size(), 5u);
    ASSERT_EQ(c.losses.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(g.losses[i], c.losses[i], 2e-5 * c.losses[0]) << "step " << i + 1;
    for (size_t k = 0; k < std::size(kNames); ++k) {
      ASSERT_EQ(g.weights[k].size(), c.weights[k].size()) << kNames[k];
      double worst = 0;
      for (size_t i = 0; i < g.weights[k].size(); ++i)
        worst = std::max(worst, std::fabs(double(g.weights[k][i]) - c.weights[k][i]));
      EXPECT_LE(worst, 2e-3) << kNames[k];
    }
  }
}

// bf16 precision multiplies bf16-rounded operands on the tensor cores (matmul_precision auto):
// other numbers than the f32 GEMMs give, within bf16's rounding of them, and the same numbers on
// every run. Bound: bf16 keeps 8 significant bits (relative rounding 2^-9 per operand), so the
// loss of a 5-step run may move by a few parts in a thousand; 1e-2 of the first loss allows
// several times that and still fails on a wrong product (a transposed or unrounded operand
// moves the loss by tenths).
TEST(CudaTrainer, Bf16MatmulsStayWithinBf16RoundingOfF32Matmuls) {
  STRATA_REQUIRE_CUDA();
  Config fast = tiny("cuda");
  apply_override(fast, "train.precision=bf16");
  Config exact = fast;
  apply_override(exact, "train.matmul_precision=f32");
  const TrainRun f = run(fast), e = run(exact), again = run(fast);
  ASSERT_EQ(f.losses.size(), 5u);
  ASSERT_EQ(e.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(f.losses[i], e.losses[i], 1e-2 * e.losses[0]) << "step " << i + 1;
  EXPECT_NE(f.losses, e.losses) << "bf16 GEMMs gave the f32 GEMMs' losses bit for bit: not taken?";
  EXPECT_LT(f.losses.back(), f.losses.front());
  EXPECT_EQ(f.losses, again.losses);
  EXPECT_EQ(f.weights, again.weights);
}

// log.peak_flops = 0 on CUDA: MFU is measured against the GPU's GEMM (f32 on the CUDA cores, or
// bf16 operands on the tensor cores), not the CPU's. Any GPU this runs on multiplies f32 faster
// than its host's cores, and its tensor cores faster than its CUDA cores.
TEST(CudaTrainer, MfuIsMeasuredAgainstTheGpusGemm) {
  STRATA_REQUIRE_CUDA();
  Config f32 = tiny("cuda");
  Config bf16 = f32;
  apply_override(bf16, "train.precision=bf16");
  const double cpu = measure_gemm_flops(0.2);
  const double gpu_f32 = measure_linear_flops(f32, 0.2), gpu_bf16 = measure_linear_flops(bf16, 0.2);
  EXPECT_GT(gpu_f32, cpu) << "the f32 rate is the CPU's?";
  EXPECT_GT(gpu_bf16, 1.5 * gpu_f32) << "bf16 operands did not reach the tensor cores?";
}

TEST(CudaTrainer, TrainingOnCudaIsDeterministic) {
  STRATA_REQUIRE_CUDA();
  const TrainRun a = run(tiny("cuda")), b = run(tiny("cuda"));
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.weights, b.weights);
}

// Every placement against all-device, at train.grad_accum micro-batches a step.
void every_placement_matches_all_device(int accum) {
  Config all = tiny("cuda");
  all.train.grad_accum = accum;
  const TrainRun all_device = run(all);
  const std::string dir =
      (std::filesystem::temp_directory_path() / "strata_test_gpu_trainer_nvme").string();
  std::filesystem::create_directories(dir);
  uint64_t keep = 0;
  {
    const LlamaModel whole(all.model, 1);  // named: unit() refers into it
    for (int u = 0; u < 3; ++u) keep += whole.unit(u).layout.shard_numel() * 12 / (u == 2 ? 2 : 1);
  }
  struct Placement {
    const char *params, *grads, *optimizer;
    uint64_t read_ahead = 0, host_bytes = 0;
  };
  for (const Placement p :
       {Placement{"device", "device", "host"}, Placement{"device", "host", "host"},
        Placement{"host", "host", "host"}, Placement{"host", "device", "host"},
        Placement{"device", "host", "nvme"}, Placement{"nvme", "host", "nvme"},
        Placement{"host", "host", "nvme"}, Placement{"nvme", "host", "host"},
        Placement{"device", "host", "nvme", uint64_t(1) << 30},
        Placement{"nvme", "host", "nvme", 0, keep}}) {
    SCOPED_TRACE(str("params=", p.params, " grads=", p.grads, " optimizer=", p.optimizer,
                     " read_ahead=", p.read_ahead, " host_bytes=", p.host_bytes));
    Config c = all;
    apply_override(c, str("offload.params=", p.params));
    apply_override(c, str("offload.grads=", p.grads));
    apply_override(c, str("offload.optimizer=", p.optimizer));
    c.offload.optimizer_read_ahead = p.read_ahead;
    c.offload.optimizer_host_bytes = p.host_bytes;
    c.offload.nvme_path = {dir};
    const TrainRun r = run(c);
    EXPECT_EQ(r.losses, all_device.losses);
    EXPECT_EQ(r.weights, all_device.weights);
  }
  std::filesystem::remove_all(dir);
}

TEST(CudaTrainer, EveryPlacementIsBitIdenticalToAllDevice) {
  // Offload never changes numbers: the CPU and CUDA AdamW follow one IEEE sequence, and the
  // GPU kernels are deterministic. The NVMe placements go through io_uring and the CPU AdamW's
  // chunk pipeline; with a read-ahead budget, and with the first two units' states kept in host
  // memory (offload.optimizer_host_bytes: room for two and a half units, whole units only).
  // With one micro-batch a step and with two: gradients in host memory take the first
  // micro-batch's reduction as a copy and add the later ones'.
  STRATA_REQUIRE_CUDA();
  for (const int accum : {1, 2}) {
    SCOPED_TRACE(str("grad_accum=", accum));
    every_placement_matches_all_device(accum);
  }
}

// The device's AdamW cannot write a compute copy that lives in host memory (the GPU does not
// address it): that placement is refused with the fix, before anything runs.
TEST(CudaTrainer, ParamsOffTheDeviceWithTheOptimizerOnItAreRefused) {
  STRATA_REQUIRE_CUDA();
  Config c = tiny("cuda");
  apply_override(c, "offload.params=host");
  apply_override(c, "offload.optimizer=device");
  try {
    run(c);
    FAIL() << "params on host with the optimizer on the device ran";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("offload.params = host with offload.optimizer = device"), std::string::npos)
        << m;
    EXPECT_NE(m.find("offload.optimizer = host or nvme"), std::string::npos) << m;
  }
}

}  // namespace
