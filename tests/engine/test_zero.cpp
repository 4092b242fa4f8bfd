// ZeRO-3 across ranks: N data-parallel ranks (this binary under mpirun -np N; plainly it is one
// rank) reproduce the 1-rank run with the same global batch, whatever the prefetch depth or
// activation checkpointing, and each rank holds 1/N of the model state plus a bounded gathered
// working set.
//
// Tolerance of the N-rank vs 1-rank comparison: the runs see the same windows and the same
// initial weights, but the gradient is summed in a different order (N-way reduce-scatter of
// per-rank sums vs accumulation over N micro-batches on one rank), which changes it by a few f32
// ulps (~1e-7 relative). AdamW's update m/(sqrt(v)+eps) is scale-free, so these relative
// differences carry into the weights at about the same order per step; over 10 steps they stay
// below 1e-5 — the bound asserted for the losses and for each weight tensor's relative L2
// difference (see expect_close for the per-element bound). Prefetch depth and checkpointing
// change no operation at all: bit-equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/comm.h"
#include "engine/comm_registry.h"
#include "engine/model.h"
#include "engine/trainer.h"

using namespace strata;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

Config base() {
  Config c;
  c.model.dim = 48;  // embedding 256 x 48 = 12288 elements: pads for dp = 3 (shards of 2048·k)
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.ffn_dim = 80;
  c.model.max_seq_len = 64;
  c.data.path = "builtin:words";
  c.data.seq_len = 16;
  c.data.micro_batch = 2;
  c.train.steps = 10;
  c.train.lr = 5e-3f;
  c.train.warmup_steps = 2;
  c.eval.batches = 0;
  c.log.every = 1000;
  return c;
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> weights;
  ZeroMemory memory;
};

RunResult train(const Config& c, Communicator& comm) {
  TrainerOptions opt;
  opt.progress = false;
  Trainer t(c, comm, opt);
  RunResult r;
  r.losses = t.train().losses;
  for (const auto& n : t.parameter_names()) r.weights[n] = t.parameter(n);
  r.memory = t.state_memory();
  return r;
}

// The same global batches on one rank: N micro-batches per step instead of N ranks.
RunResult train_one_rank(Config c, int ranks) {
  c.train.grad_accum *= ranks;
  auto solo = make_solo_communicator();
  return train(c, *solo);
}

// Per tensor: the relative L2 difference ‖a − b‖ / ‖b‖ must be ≤ rtol, and no element may
// differ by more than 10·rtol of the tensor's largest magnitude (AdamW normalizes each element's
// update by its own gradient history, so an element whose gradient is near zero turns a
// rounding-level gradient difference into a larger relative step; the norm bound is the one
// that says the runs train the same model).
void expect_close(const RunResult& a, const RunResult& b, double rtol, const char* what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  double worst_loss = 0;
  for (size_t i = 0; i < a.losses.size(); ++i)
    worst_loss = std::max(worst_loss, std::fabs(a.losses[i] - b.losses[i]) / std::fabs(b.losses[i]));
  EXPECT_LE(worst_loss, rtol) << what << ": losses";
  double worst_l2 = 0, worst_max = 0;
  std::string worst_name;
  for (const auto& [name, w] : b.weights) {
    const auto& v = a.weights.at(name);
    double scale = 0, err = 0, d2 = 0, n2 = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      scale = std::max(scale, double(std::fabs(w[i])));
      err = std::max(err, double(std::fabs(v[i] - w[i])));
      d2 += (double(v[i]) - w[i]) * (double(v[i]) - w[i]);
      n2 += double(w[i]) * w[i];
    }
    double l2 = std::sqrt(d2 / n2);
    EXPECT_LE(l2, rtol) << what << ": " << name << " relative L2 difference";
    EXPECT_LE(err, 10 * rtol * scale) << what << ": " << name << " largest element difference";
    if (l2 > worst_l2) {
      worst_l2 = l2;
      worst_name = name;
    }
    worst_max = std::max(worst_max, err / scale);
  }
  if (world().rank() == 0)
    std::printf("[%s] %d ranks vs 1: max loss diff %.3g (relative); weights: worst relative L2 %.3g "
                "(%s), worst element %.3g of its tensor's scale\n",
                what, world().size(), worst_loss, worst_l2, worst_name.c_str(), worst_max);
}

void expect_equal(const RunResult& a, const RunResult& b, const char* what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  for (const auto& [name, w] : b.weights) EXPECT_EQ(a.weights.at(name), w) << what << ": " << name;
}

}  // namespace

TEST(Zero3, ReproducesTheOneRankRun) {
  Config c = base();
  expect_close(train(c, world()), train_one_rank(c, world().size()), 1e-5, "f32");
}

TEST(Zero3, ReproducesTheOneRankRunWithTiedEmbeddingsAndAccumulation) {
  Config c = base();
  c.model.tie_embeddings = true;
  c.train.grad_accum = 2;
  expect_close(train(c, world()), train_one_rank(c, world().size()), 1e-5, "tied, accum 2");
}

TEST(Zero3, Bf16ComputeCopyTracksTheOneRankRun) {
  // bf16 copies are rounded from master weights that differ in the last f32 bits, so a rounding
  // may flip: the bound is bf16's precision (2^-8) rather than f32's.
  Config c = base();
  c.train.precision = Precision::bf16;
  expect_close(train(c, world()), train_one_rank(c, world().size()), 4e-3, "bf16");
}

TEST(Zero3, PrefetchDepthChangesNoNumber) {
  Config c = base();
  c.zero.prefetch = 0;
  RunResult p0 = train(c, world());
  c.zero.prefetch = 1;
  RunResult p1 = train(c, world());
  c.zero.prefetch = 3;
  RunResult p3 = train(c, world());
  expect_equal(p1, p0, "prefetch 1 vs 0");
  expect_equal(p3, p0, "prefetch 3 vs 0");
}

TEST(Zero3, ActivationCheckpointingChangesNoNumber) {
  Config c = base();
  RunResult off = train(c, world());
  c.zero.activation_checkpointing = true;
  expect_equal(train(c, world()), off, "checkpointing");
}

TEST(Zero3, EachRankHoldsItsShareOfTheState) {
  Config c = base();
  c.model.dim = 128;  // big enough that padding is small against the shards
  c.model.ffn_dim = 256;
  c.train.steps = 1;
  for (int prefetch : {0, 2}) {
    c.zero.prefetch = prefetch;
    RunResult n = train(c, world());
    RunResult one = train_one_rank(c, 1);
    const double ranks = world().size();
    // The 1-rank run gathers nothing (its shards are the full units): all of its state is
    // shards. N ranks: shards of 1/N (plus padding to 2048·N elements per unit) and the slots.
    uint64_t bound = uint64_t(double(one.memory.shard_bytes) / ranks) + n.memory.gathered_bytes;
    EXPECT_LE(n.memory.shard_bytes + n.memory.gathered_bytes, bound + 5 * 4 * 2048 * 4 /*units' padding*/)
        << "prefetch " << prefetch;
    if (world().size() > 1) {
      // The working set is prefetch + 1 parameter slots and 2 gradient slots (3 when
      // prefetching) of the largest unit, and one shard for the reduce-scatter result.
      const uint64_t units = uint64_t(prefetch + 1 + 2 + (prefetch > 0 ? 1 : 0));
      LlamaModel model(c.model, world().size());
      uint64_t largest = 0;
      for (const auto& u : model.units()) largest = std::max<uint64_t>(largest, u.layout.padded_numel());
      EXPECT_EQ(n.memory.gathered_bytes, units * largest * 4);
    }
    if (world().rank() == 0)
      std::printf("[memory] prefetch %d: 1 rank %llu bytes of state; %d ranks %llu shards + %llu gathered per rank\n",
                  prefetch, (unsigned long long)one.memory.shard_bytes, world().size(),
                  (unsigned long long)n.memory.shard_bytes, (unsigned long long)n.memory.gathered_bytes);
  }
}

TEST(Zero3, WeightsWrittenByNRanksLoadAnywhere) {
  Config c = base();
  c.train.steps = 3;
  std::string dir = std::string(STRATA_TEST_WORK_DIR) + "/zero_out_" + std::to_string(world().size());
  if (world().rank() == 0) std::filesystem::create_directories(dir);
  TrainerOptions opt;
  opt.progress = false;
  c.eval.batches = 2;
  double eval_n;
  {
    Trainer t(c, world(), opt);
    t.train();
    eval_n = t.evaluate();
    t.save(dir);  // gathers unit by unit; rank 0 writes
  }
  opt.init_from = dir;
  auto solo = make_solo_communicator();
  Trainer back(c, *solo, opt);  // every rank reads the whole model alone
  EXPECT_NEAR(back.evaluate(), eval_n, 1e-6 * eval_n);
  Trainer back_n(c, world(), opt);  // and N ranks read their own slices
  EXPECT_EQ(back_n.evaluate(), eval_n);
}
