// Pipeline stages (parallel.pp) over ZeRO-3, tensor parallelism and offload. Run plainly (one
// rank) it checks the partition, the 1F1B and GPipe schedules, the plan's activation memory and
// that bad layouts are refused before anything is allocated. Under mpirun -np 2: pp 2 under
// 1F1B and GPipe (and with the units kept gathered for the step) reproduces the 1-rank run with
// the same global batch; its --out export and a checkpoint resume. Under -np 4: pp 4,
// pp 2 x dp 2 and pp 2 x tp 2 reproduce it, and pp 2 x dp 2 with parameters on the host and
// the optimizer on NVMe is bit-identical to pp 2 x dp 2 all-device.
//
// Tolerance (1e-5, as test_tensor_parallel.cpp, whose base() this shares): a stage computes the
// same operations on the same values as the 1-rank run; what differs is where sums are split —
// the gradient norm adds every stage's part (and the tp and dp parts), the last stage's loss
// parts are computed without the whole-logits shortcut when it holds several micro-batches — so
// losses and weights differ by f32 summation-order rounding only.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <numeric>

#include "core/error.h"
#include "engine/model.h"
#include "engine/pipeline.h"
#include "engine/plan.h"
#include "engine/safetensors.h"
#include "tests/engine/mesh_reference.h"

using namespace strata;
using namespace strata::testing;

namespace {

bool world_is(int n) { return world().size() == n; }

Config pipe_base() {
  Config c = base();
  c.model.n_layers = 4;  // pp 4 gets a unit or more each
  c.train.grad_accum = 4;
  return c;
}

// Runs `c` on this world against the 1-rank run with the same global batch.
void expect_reproduces(Config c, const std::string& what) {
  const int dp = world().size() / (c.parallel.tp * c.parallel.pp);
  RunResult got = train(c, world());
  expect_close(got, train_one_rank(c, dp), kTol, what);
}

std::string error_of(const Config& c) {
  try {
    validate(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- one rank: partition, schedules, plan, refusals --------------------------------------------

TEST(PipelinePartition, StagesTileTheUnitsWithEmbeddingFirstAndHeadLast) {
  for (int layers : {1, 4, 7, 30}) {
    for (int pp = 1; pp <= std::min(layers + 2, 8); ++pp) {
      Config c = pipe_base();
      c.model.n_layers = layers;
      c.parallel.pp = pp;
      const auto st = pipeline_partition(c);
      ASSERT_EQ(int(st.size()), pp);
      EXPECT_EQ(st.front().begin, 0);
      EXPECT_EQ(st.back().end, layers + 2);
      for (size_t s = 0; s < st.size(); ++s) {
        EXPECT_GE(st[s].size(), 1) << "stage " << s << " of " << pp;
        if (s > 0) {
          EXPECT_EQ(st[s].begin, st[s - 1].end);
        }
      }
    }
  }
}

TEST(PipelinePartition, BalancedSplitMinimizesTheLargestStage) {
  Config c = pipe_base();
  c.model.n_layers = 6;
  const int U = c.model.n_layers + 2;
  std::vector<double> cost;
  for (int u = 0; u < U; ++u) cost.push_back(unit_cost(c.model, u, c.data.micro_batch, c.data.seq_len));
  auto worst = [&](const std::vector<StageUnits>& st) {
    double w = 0;
    for (const auto& s : st)
      w = std::max(w, std::accumulate(cost.begin() + s.begin, cost.begin() + s.end, 0.0));
    return w;
  };
  for (int pp = 2; pp <= 4; ++pp) {
    c.parallel.pp = pp;
    const double got = worst(pipeline_partition(c));
    // Every contiguous split into pp non-empty stages (cut points) is no better.
    std::vector<int> cuts(size_t(pp - 1));
    std::function<void(int, int)> all = [&](int k, int from) {
      if (k == pp - 1) {
        std::vector<StageUnits> st;
        int b = 0;
        for (int x : cuts) {
          st.push_back({b, x});
          b = x;
        }
        st.push_back({b, U});
        EXPECT_LE(got, worst(st) * (1 + 1e-9)) << "pp " << pp;
        return;
      }
      for (int x = from; x <= U - (pp - 1 - k); ++x) {
        cuts[size_t(k)] = x;
        all(k + 1, x + 1);
      }
    };
    all(0, 1);
  }
}

TEST(PipelinePartition, PpLayersPlaceTheBlocks) {
  Config c = pipe_base();
  c.parallel.pp = 3;
  c.parallel.pp_layers = {0, 3, 1};
  validate(c);
  const auto st = pipeline_partition(c);
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].begin, 0);  // the embedding alone
  EXPECT_EQ(st[0].end, 1);
  EXPECT_EQ(st[1].end, 4);    // blocks 0-2
  EXPECT_EQ(st[2].end, 6);    // block 3 + head
  const LlamaModel mid(c.model, 1, 1, 0, st[1]);
  EXPECT_EQ(mid.num_units(), 3);
  EXPECT_EQ(mid.first_layer(), 0);
  EXPECT_EQ(mid.layers_here(), 3);
  EXPECT_FALSE(mid.has_embedding());
  EXPECT_FALSE(mid.has_head());
  EXPECT_EQ(mid.unit(0).name, "block.0");
  EXPECT_EQ(mid.all_units().size(), 6u);
  EXPECT_EQ(mid.num_params(), LlamaModel(c.model).num_params()) << "num_params counts the whole model";
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostPpMinusStageMicroBatches) {
  EXPECT_EQ(schedule_text(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 0, 4)),
            "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(schedule_text(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 1, 4)),
            "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(schedule_text(pipeline_schedule(PipelineSchedule::gpipe, 2, 0, 3)), "F0 F1 F2 B0 B1 B2");
  for (int pp : {2, 3, 4, 8})
    for (int m : {pp, pp + 1, 2 * pp, 16})
      for (int s = 0; s < pp; ++s) {
        const auto f1b1 = pipeline_schedule(PipelineSchedule::one_f_one_b, pp, s, m);
        const auto gpipe = pipeline_schedule(PipelineSchedule::gpipe, pp, s, m);
        EXPECT_EQ(max_in_flight(f1b1), std::min(pp - s, m)) << pp << " " << s << " " << m;
        EXPECT_EQ(max_in_flight(gpipe), m);
        for (const auto* ops : {&f1b1, &gpipe}) {
          ASSERT_EQ(int(ops->size()), 2 * m);
          std::vector<int> fwd, bwd;
          for (const PipeOp& op : *ops) {
            if (op.forward) {
              fwd.push_back(op.micro);
            } else {
              EXPECT_TRUE(std::find(fwd.begin(), fwd.end(), op.micro) != fwd.end()) << "B before F";
              bwd.push_back(op.micro);
            }
          }
          std::vector<int> order(static_cast<size_t>(m));
          std::iota(order.begin(), order.end(), 0);
          EXPECT_EQ(fwd, order);
          EXPECT_EQ(bwd, order) << "backwards in forward order (gradients accumulate as on one rank)";
        }
      }
}

// The first stage's activation memory under 1F1B is pp micro-batches' worth, under GPipe all m.
TEST(PipelinePlan, FirstStageActivationsFollowTheSchedule) {
  Config c = pipe_base();
  c.parallel.pp = 2;
  c.train.grad_accum = 8;
  PlanMachine machine;
  machine.device_capacity = 64ull << 30;
  machine.host_memory = 64ull << 30;
  auto acts = [&](PipelineSchedule s) {
    c.parallel.pp_schedule = s;
    const MemoryPlan p = plan_memory(c, 1, machine, 0);
    EXPECT_EQ(p.micro_batches_held, s == PipelineSchedule::gpipe ? 8 : 2);
    for (const auto& r : p.rows)
      if (r.what.rfind("activations", 0) == 0) return r.bytes;
    ADD_FAILURE() << "no activations row";
    return uint64_t(0);
  };
  const uint64_t f1b1 = acts(PipelineSchedule::one_f_one_b), gpipe = acts(PipelineSchedule::gpipe);
  std::printf("first stage activations at m = 8: 1f1b %llu bytes, gpipe %llu bytes (%.2f)\n",
              (unsigned long long)f1b1, (unsigned long long)gpipe, double(f1b1) / double(gpipe));
  EXPECT_LT(f1b1 * 3, gpipe);
  // The runner allocates what the plan counts.
  const auto st = pipeline_partition(c);
  const LlamaModel stage0(c.model, 1, 1, 0, st[0]);
  auto device = make_device(DeviceKind::cpu);
  const uint64_t before = device->memory().used_bytes;
  {
    ModelRunner runner(stage0, *device, c.data.micro_batch, c.data.seq_len, false, 8, {}, 2);
    const uint64_t used = device->memory().used_bytes - before;
    const uint64_t planned = activation_bytes(stage0, c.data.micro_batch, c.data.seq_len, false, false, 2);
    EXPECT_LE(used, planned);
    EXPECT_GE(used + 8192, planned);
  }
}

TEST(PipelineConfig, BadLayoutsAreRefusedNamingTheKeys) {
  Config c = pipe_base();
  c.parallel.pp = 7;  // 4 blocks + 2 = 6 units
  EXPECT_NE(error_of(c).find("parallel.pp"), std::string::npos) << error_of(c);
  c.parallel.pp = 2;
  c.parallel.pp_layers = {1, 2};
  EXPECT_NE(error_of(c).find("model.n_layers"), std::string::npos) << error_of(c);
  EXPECT_NE(error_of(c).find("parallel.pp_layers"), std::string::npos);
  c.parallel.pp_layers = {4};
  EXPECT_NE(error_of(c).find("parallel.pp_layers"), std::string::npos) << error_of(c);
  c.parallel.pp = 3;
  c.parallel.pp_layers = {2, 0, 2};
  EXPECT_NE(error_of(c).find("stage 1"), std::string::npos) << error_of(c);
  c.parallel.pp_layers = {};
  c.train.grad_accum = 2;  // 1f1b needs 3
  EXPECT_NE(error_of(c).find("train.grad_accum"), std::string::npos) << error_of(c);
  c.parallel.pp_schedule = PipelineSchedule::gpipe;
  EXPECT_EQ(error_of(c), "");
  c.model.tie_embeddings = true;
  EXPECT_NE(error_of(c).find("model.tie_embeddings"), std::string::npos) << error_of(c);
  // A world that is not a multiple of pp: refused by the mesh, before any allocation.
  Config d = pipe_base();
  d.parallel.pp = 2;
  auto solo = make_solo_communicator();
  TrainerOptions opt;
  opt.progress = false;
  try {
    Trainer t(d, *solo, opt);
    ADD_FAILURE() << "pp 2 on one rank was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pp"), std::string::npos) << e.what();
  }
}

TEST(PipelineConfig, PpLayersParseFromTomlAndSet) {
  Config c = pipe_base();
  c.parallel.pp = 2;
  apply_override(c, "parallel.pp_layers=1,3");
  EXPECT_EQ(c.parallel.pp_layers, (std::vector<int>{1, 3}));
  apply_override(c, "parallel.pp_layers=[3, 1]");
  EXPECT_EQ(c.parallel.pp_layers, (std::vector<int>{3, 1}));
  EXPECT_THROW(apply_override(c, "parallel.pp_layers=1,x"), Error);
  EXPECT_NE(config_to_toml(c).find("pp_layers = [3, 1]"), std::string::npos);
}

// ---- under mpirun ----------------------------------------------------------------------------

TEST(Pipeline, Pp2ReproducesOneRankUnderBothSchedules) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  Config c = pipe_base();
  c.parallel.pp = 2;
  expect_reproduces(c, "pp 2, 1f1b");
  c.parallel.pp_schedule = PipelineSchedule::gpipe;
  expect_reproduces(c, "pp 2, gpipe");
  c.parallel.pp_schedule = PipelineSchedule::one_f_one_b;
  c.parallel.pp_layers = {3, 1};
  c.zero.activation_checkpointing = true;
  c.train.grad_accum = 5;
  expect_reproduces(c, "pp 2, layers 3 + 1, checkpointing, 5 micro-batches");
}

// Gathers per step: each forward and each backward of each micro-batch gathers the stage's
// units, unless zero.reshard_after_forward = false keeps them gathered for the step (once).
// (Parameters on the host: with dp = 1 and parameters on the device compute reads the shard
// itself and nothing is gathered.)
TEST(Pipeline, Pp2GathersPerStep) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  Config c = pipe_base();
  c.parallel.pp = 2;
  c.offload.params = Tier::host;
  c.train.steps = 3;
  const auto st = pipeline_partition(c);
  const uint64_t units = uint64_t(st[size_t(world().rank())].size());
  const RunResult reshard = train(c, world());
  ASSERT_EQ(reshard.gathers.size(), 3u);
  for (uint64_t g : reshard.gathers) EXPECT_EQ(g, 2 * 4 * units);
  c.zero.reshard_after_forward = false;
  c.train.steps = 10;
  const RunResult kept = train(c, world());
  ASSERT_EQ(kept.gathers.size(), 10u);
  for (uint64_t g : kept.gathers) EXPECT_EQ(g, units);
  expect_close(kept, train_one_rank(c, 1), kTol, "pp 2, units gathered once per step");
}

// --out writes one file per stage and an index holding the pp run's weights; pp 2 initialized
// from it trains like one rank initialized from it. A checkpoint of the pp run resumes
// bit-exactly.
TEST(Pipeline, Pp2ExportAndCheckpointResume) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  namespace fs = std::filesystem;
  const std::string root = std::string(STRATA_TEST_WORK_DIR) + "/pp_io";
  const std::string out = root + "/out", ckpt = root + "/ckpt";
  if (world().rank() == 0) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  Config c = pipe_base();
  c.parallel.pp = 2;
  c.train.steps = 6;
  const RunResult whole = train(c, world(), "", out);
  SafetensorsReader reader(out);
  for (const auto& [name, w] : whole.weights) {
    std::vector<float> got(w.size());
    reader.read_f32(name, got.data());
    EXPECT_EQ(got, w) << name;
  }
  // --init-from reads only a stage's tensors (from the sharded export and its index): pp 2
  // from the export trains like one rank from it.
  Config from = c;
  from.train.steps = 3;
  Config one = from;
  one.parallel = ParallelConfig{};
  expect_close(train(from, world(), out), train(one, *make_solo_communicator(), out), kTol,
               "pp 2 from its own export");
  // Interrupted after step 3, resumed to 6: the same losses and weights.
  Config k = c;
  k.checkpoint.dir = ckpt;
  k.checkpoint.every = 3;
  TrainerOptions opt;
  opt.progress = false;
  opt.stop_after = 3;
  std::vector<double> losses;
  {
    Trainer t(k, world(), opt);
    losses = t.train().losses;
  }
  opt.stop_after = 0;
  opt.resume = ckpt;
  Trainer t(k, world(), opt);
  for (double l : t.train().losses) losses.push_back(l);
  EXPECT_EQ(losses, whole.losses);
  for (const auto& [name, w] : whole.weights) EXPECT_EQ(t.parameter(name), w) << name;
  // The pp 2 checkpoint read by one rank (any mesh reads any mesh's pieces): steps 4-6 as the
  // pp 2 run took them.
  Config solo_cfg = k;
  solo_cfg.parallel = ParallelConfig{};
  solo_cfg.checkpoint.dir = str(root, "/ckpt_solo_r", world().rank());
  TrainerOptions solo_opt;
  solo_opt.progress = false;
  solo_opt.resume = ckpt + "/step_3";
  auto solo = make_solo_communicator();
  Trainer alone(solo_cfg, *solo, solo_opt);
  const std::vector<double> rest = alone.train().losses;
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < rest.size(); ++i)
    EXPECT_NEAR(rest[i], whole.losses[3 + i], kTol * whole.losses[3 + i]) << "step " << 4 + i;
}

TEST(Pipeline, Pp4Pp2Dp2AndPp2Tp2ReproduceOneRank) {
  if (!world_is(4)) GTEST_SKIP() << "needs mpirun -np 4";
  Config c = pipe_base();
  c.parallel.pp = 4;
  expect_reproduces(c, "pp 4, 1f1b");
  c.parallel.pp = 2;
  expect_reproduces(c, "pp 2 x dp 2");
  c.parallel.tp = 2;
  expect_reproduces(c, "pp 2 x tp 2");
  c.parallel.sequence_parallel = true;
  c.parallel.pp_schedule = PipelineSchedule::gpipe;
  expect_reproduces(c, "pp 2 x tp 2, sequence parallel, gpipe");
}

TEST(Pipeline, Pp2Dp2OffloadIsBitIdentical) {
  if (!world_is(4)) GTEST_SKIP() << "needs mpirun -np 4";
  Config c = pipe_base();
  c.parallel.pp = 2;
  const RunResult device = train(c, world());
  const std::string dir = std::string(STRATA_TEST_WORK_DIR) + "/pp_nvme_r" + std::to_string(world().rank());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  c.offload.params = Tier::host;
  c.offload.optimizer = Tier::nvme;
  c.offload.nvme_path = {dir};
  const RunResult off = train(c, world());
  EXPECT_EQ(off.losses, device.losses);
  EXPECT_EQ(off.grad_norms, device.grad_norms);
  for (const auto& [name, w] : device.weights) EXPECT_EQ(off.weights.at(name), w) << name;
  // Unclipped: every stage updates its units during its last backward (update_in_backward).
  c.train.grad_clip = 0;
  const RunResult off_unclipped = train(c, world());
  c.offload = Config().offload;
  const RunResult device_unclipped = train(c, world());
  EXPECT_NE(device_unclipped.losses, device.losses) << "clipping must be active in the clipped runs";
  EXPECT_EQ(off_unclipped.losses, device_unclipped.losses);
  EXPECT_EQ(off_unclipped.grad_norms, device_unclipped.grad_norms);
  for (const auto& [name, w] : device_unclipped.weights)
    EXPECT_EQ(off_unclipped.weights.at(name), w) << name << " (unclipped)";
}
