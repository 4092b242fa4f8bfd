// Tensor parallelism (Megatron layout) combined with ZeRO-3. Under mpirun -np N, every layout
// that N ranks can form (tp 2; tp 4 and dp 2 x tp 2; tp 8 with replicated kv heads) reproduces
// the 1-rank run with the same global batch on a GQA model with an untied head; tp 2 with the
// optimizer on NVMe is bit-identical to tp 2 all-device; the tp communication bytes of a step
// equal the layout's formula. Run plainly (one rank) it checks the slicing itself: every
// element of every tensor belongs to exactly one primary slice, and the slices of all tp ranks
// put together give the 1-rank initialization.
//
// Tolerance (kTpTol = 2e-5; AdamW eps in base() says why it is 1e-6): the tp run computes the
// same sums split over ranks and added by an all-reduce (row-parallel outputs, column-parallel
// input gradients), and the loss from per-rank log-sum-exps combined in double, so activations
// and gradients differ from the 1-rank run by f32 summation-order rounding (~1e-7 relative);
// AdamW carries that into the weights at about the same order per step. Over these 10 steps the
// worst weight's relative L2 was 2-4e-6 in Release builds, and 1.09e-5 (tp 4, the embedding) in
// the AddressSanitizer build on an AVX2-only CPU, whose kernels and FMA contractions sum in other
// orders — hence twice test_zero's 1e-5. A layout bug moves weights by orders of magnitude more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "comm/comm.h"
#include "core/error.h"
#include "comm/comm_registry.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/tensor_parallel.h"
#include "engine/trainer.h"
#include "tests/engine/mesh_reference.h"

using namespace strata;
using namespace strata::testing;

namespace {

constexpr double kTpTol = 2e-5;  // see the file's header

// Runs `c` with parallel.tp = tp on this world (dp = world / tp) against the 1-rank run.
void expect_layout_reproduces(Config c, int tp, const std::string& what) {
  c.parallel.tp = tp;
  const int dp = world().size() / tp;
  RunResult got = train(c, world());
  expect_close(got, train_one_rank(c, dp), kTpTol, what);
}

bool world_is(int n) { return world().size() == n; }

}  // namespace

// ---- one rank: the slicing -------------------------------------------------------------------

TEST(TensorParallelLayout, SlicesTileEveryTensorOnceAndInitializeAsOneRank) {
  for (auto [heads, kv, tp] : {std::tuple{8, 2, 2}, {8, 2, 4}, {8, 4, 8}, {8, 8, 4}}) {
    Config c = base();
    c.model.n_heads = heads;
    c.model.n_kv_heads = kv;
    c.model.vocab_size = 259;  // not a multiple of tp: uneven vocabulary parts
    LlamaModel one(c.model);
    for (int u = 0; u < one.num_units(); ++u) {
      const FlatLayout& L1 = one.unit(u).layout;
      std::vector<float> init1(L1.numel());
      one.init_values(u, 7, 0, L1.numel(), init1.data());
      std::vector<std::vector<float>> assembled(L1.views().size());
      std::vector<std::vector<int>> primary_hits(L1.views().size());
      for (size_t i = 0; i < L1.views().size(); ++i) {
        assembled[i].assign(L1.views()[i].numel, NAN);
        primary_hits[i].assign(L1.views()[i].numel, 0);
      }
      for (int r = 0; r < tp; ++r) {
        LlamaModel part(c.model, 1, tp, r);
        const FlatLayout& L = part.unit(u).layout;
        std::vector<float> init(L.numel());
        part.init_values(u, 7, 0, L.numel(), init.data());
        ASSERT_EQ(L.views().size(), L1.views().size());
        for (size_t i = 0; i < L.views().size(); ++i) {
          const ParamView& v = L.views()[i];
          ASSERT_EQ(v.global_shape, L1.views()[i].shape) << v.name;
          place_slice(v, init.data() + v.offset, assembled[i].data());
          if (v.primary)
            for (size_t k = 0; k < v.numel; ++k) ++primary_hits[i][v.global_index(k)];
        }
      }
      for (size_t i = 0; i < L1.views().size(); ++i) {
        const ParamView& v = L1.views()[i];
        const std::vector<float> expect(init1.begin() + long(v.offset),
                                        init1.begin() + long(v.offset + v.numel));
        EXPECT_EQ(assembled[i], expect) << v.name << " tp " << tp << " kv " << kv;
        EXPECT_TRUE(std::all_of(primary_hits[i].begin(), primary_hits[i].end(),
                                [](int h) { return h == 1; }))
            << v.name << ": every element must have exactly one primary copy (tp " << tp << ")";
      }
    }
  }
}

TEST(TensorParallelLayout, RefusesModelsThatDoNotSplit) {
  Config c = base();
  c.parallel.tp = 3;  // 8 heads
  EXPECT_THROW(validate(c), Error);
  c.model.n_heads = 6;
  c.model.n_kv_heads = 4;  // 3 neither divides 4 nor is a multiple of it
  c.model.ffn_dim = 96;
  EXPECT_THROW(validate(c), Error);
  EXPECT_THROW(tp_shard(c.model, 3, 0), Error);
}

// ---- under mpirun ----------------------------------------------------------------------------

TEST(TensorParallel, Tp2ReproducesOneRank) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  expect_layout_reproduces(base(), 2, "tp 2");
}

TEST(TensorParallel, Tp2TiedAccumulationCheckpointingAndChunkedLoss) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  Config c = base();
  c.model.tie_embeddings = true;
  c.train.grad_accum = 2;
  c.zero.activation_checkpointing = true;
  c.model.loss_chunk = 12;  // 32 tokens in chunks of 12, 12, 8: logits recomputed in backward
  c.offload.params = Tier::host;
  expect_layout_reproduces(c, 2, "tp 2, tied, accum 2, checkpointing, loss chunks of 12");
}

TEST(TensorParallel, Tp2Bf16ReproducesOneRank) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  Config c = base();
  c.train.precision = Precision::bf16;
  c.parallel.tp = 2;
  // bf16 compute copies: a summation-order difference may flip a rounding of a weight to bf16
  // (2^-8 relative), as in test_zero's kRanksTolBf16.
  expect_close(train(c, world()), train_one_rank(c, 1), 4e-3, "tp 2, bf16");
}

// --init-from reads each rank's slices of a Hugging Face checkpoint written by one rank, and
// --out writes whole tensors again: the tp 2 run from the 1-rank run's export trains like the
// 1-rank run from it, and its own export holds the same tensors as that run's weights.
TEST(TensorParallel, Tp2InitFromAndOutUseWholeTensors) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  namespace fs = std::filesystem;
  const std::string root = std::string(STRATA_TEST_WORK_DIR) + "/tp_io";
  const std::string start = str(root, "/start_r", world().rank());  // the same model on each rank
  const std::string out = root + "/tp2_out";
  fs::remove_all(start);
  fs::create_directories(start);
  Config c = base();
  c.train.steps = 3;
  {
    auto solo = make_solo_communicator();
    TrainerOptions opt;
    opt.progress = false;
    Trainer t(c, *solo, opt);
    t.train();
    t.save(start);
  }
  const RunResult one = train(c, *make_solo_communicator(), start);
  Config tp = c;
  tp.parallel.tp = 2;
  if (world().rank() == 0) fs::remove_all(out);
  const RunResult two = train(tp, world(), start, out);
  expect_close(two, one, kTpTol, "tp 2 from a 1-rank export");
  SafetensorsReader reader(out);
  for (const auto& [name, w] : one.weights) {
    std::vector<float> got(w.size());
    ASSERT_EQ(reader.info(name).numel(), int64_t(w.size())) << name;
    reader.read_f32(name, got.data());
    EXPECT_EQ(got, two.weights.at(name)) << name << ": --out writes the assembled tensor";
  }
}

TEST(TensorParallel, Tp2OptimizerOnNvmeIsBitIdentical) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  Config c = base();
  c.parallel.tp = 2;
  const RunResult device = train(c, world());
  const std::string dir = std::string(STRATA_TEST_WORK_DIR) + "/tp_nvme_r" + std::to_string(world().rank());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  c.offload.optimizer = Tier::nvme;
  c.offload.params = Tier::nvme;
  c.offload.nvme_path = {dir};
  const RunResult nvme = train(c, world());
  EXPECT_EQ(nvme.losses, device.losses);
  EXPECT_EQ(nvme.grad_norms, device.grad_norms);
  for (const auto& [name, w] : device.weights) EXPECT_EQ(nvme.weights.at(name), w) << name;
}

// Per micro-batch and rank: the embedding's all-reduce, 2 per block in forward and 2 in backward
// (+2 recomputed with activation checkpointing), the loss parts' all-gather (tp × N × 2 floats
// received), d(lnf)'s all-reduce; replicated kv heads add their k and v gradients' all-reduce.
TEST(TensorParallel, CommunicationBytesFollowTheLayout) {
  if (!world_is(2) && !world_is(4)) GTEST_SKIP() << "needs mpirun -np 2 or 4";
  for (bool ckpt : {false, true}) {
    Config c = base();
    const int tp = world().size();
    c.parallel.tp = tp;
    c.train.steps = 2;
    c.train.grad_accum = 2;
    c.zero.activation_checkpointing = ckpt;
    const RunResult r = train(c, world());
    const uint64_t N = uint64_t(c.data.micro_batch) * c.data.seq_len, C = c.model.dim;
    const uint64_t L = uint64_t(c.model.n_layers), act = N * C * 4;
    const TpShard t = tp_shard(c.model, tp, world().rank());
    const uint64_t kv = t.kv_replicas > 1 ? 2ull * t.kv_heads * c.model.head_dim() * C * 4 : 0;
    const uint64_t per_micro = act                        // embedding
                               + L * (ckpt ? 6 : 4) * act  // blocks
                               + uint64_t(tp) * N * 2 * 4  // loss parts
                               + act                       // d(lnf)
                               + L * kv;                   // replicated kv gradients
    ASSERT_EQ(r.tp_bytes.size(), size_t(c.train.steps));
    for (uint64_t b : r.tp_bytes) EXPECT_EQ(b, per_micro * uint64_t(c.train.grad_accum)) << "ckpt " << ckpt;
  }
}

TEST(TensorParallel, Tp2SequenceParallelReproducesOneRank) {
  if (!world_is(2)) GTEST_SKIP() << "needs mpirun -np 2";
  Config c = base();
  c.parallel.sequence_parallel = true;
  expect_layout_reproduces(c, 2, "tp 2, sequence parallel");
  c.model.tie_embeddings = true;
  c.zero.activation_checkpointing = true;
  c.train.grad_accum = 2;
  expect_layout_reproduces(c, 2, "tp 2, sequence parallel, tied, checkpointing, accum 2");
}

// Sequence parallelism: the all-reduces become reduce-scatters (embedding, attention and MLP
// outputs, d(lnf) and the column-parallel input gradients) and all-gathers (norm outputs before
// the column-parallel linears, the gradient before the row-parallel ones, the final norm and
// the embedding's gradient), each counted at the (N, C) buffer it fills or reads; backward
// gathers the norm outputs again for the weight gradients (+2 per block), and the norm weights'
// gradients are summed over the tp group.
TEST(TensorParallel, SequenceParallelCommunicationBytesFollowTheLayout) {
  if (!world_is(2) && !world_is(4)) GTEST_SKIP() << "needs mpirun -np 2 or 4";
  for (bool ckpt : {false, true}) {
    Config c = base();
    const int tp = world().size();
    c.parallel.tp = tp;
    c.parallel.sequence_parallel = true;
    c.train.steps = 2;
    c.zero.activation_checkpointing = ckpt;
    const RunResult r = train(c, world());
    const uint64_t N = uint64_t(c.data.micro_batch) * c.data.seq_len, C = c.model.dim;
    const uint64_t L = uint64_t(c.model.n_layers), act = N * C * 4;
    const TpShard t = tp_shard(c.model, tp, world().rank());
    const uint64_t kv = t.kv_replicas > 1 ? 2ull * t.kv_heads * c.model.head_dim() * C * 4 : 0;
    const uint64_t per_micro = 4 * act                            // embedding, head: 2 + 2
                               + L * (ckpt ? 14 : 10) * act        // blocks: 4 fwd, 6 bwd
                               + uint64_t(tp) * N * 2 * 4          // loss parts
                               + (2 * L + 1) * C * 4               // norm weight gradients
                               + L * kv;
    ASSERT_EQ(r.tp_bytes.size(), size_t(c.train.steps));
    for (uint64_t b : r.tp_bytes) EXPECT_EQ(b, per_micro) << "ckpt " << ckpt;
  }
}

TEST(TensorParallel, Tp4AndDp2Tp2ReproduceOneRank) {
  if (!world_is(4)) GTEST_SKIP() << "needs mpirun -np 4";
  expect_layout_reproduces(base(), 4, "tp 4 (kv heads replicated on 2 ranks)");
  expect_layout_reproduces(base(), 2, "dp 2 x tp 2");
  Config c = base();
  c.parallel.sequence_parallel = true;
  expect_layout_reproduces(c, 4, "tp 4, sequence parallel");
  expect_layout_reproduces(c, 2, "dp 2 x tp 2, sequence parallel");
}

TEST(TensorParallel, Tp8WithReplicatedKvHeadsReproducesOneRank) {
  if (!world_is(8)) GTEST_SKIP() << "needs mpirun -np 8";
  Config c = base();
  c.model.n_kv_heads = 4;  // tp 8 > 4 kv heads: each on 2 ranks
  expect_layout_reproduces(c, 8, "tp 8, n_kv_heads 4");
}
