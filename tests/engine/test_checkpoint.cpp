// Checkpoints: bit-exact resume (10 steps straight = 5 steps, save, resume, 5 steps) for every
// placement of params / grads / optimizer (NVMe included), f32 and bf16, with data.shuffle on —
// on one rank run plainly, on two under mpirun; resharding on load (a checkpoint written by 2
// ranks resumes on 4 and on 1 with the same global batch, under mpirun -np 4); what a checkpoint
// holds (manifest, pieces, checksums); a damaged file refused naming both hashes; async and sync
// saves alike; export to Hugging Face safetensors; an I/O error while saving ends the run and
// leaves the previous checkpoint as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/checkpoint.h"
#include "comm/comm_registry.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "kernels/device.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

// Every rank of `comm` reaches this point before any goes on.
void sync(Communicator& comm) {
  if (comm.size() == 1) return;
  static auto dev = make_device(DeviceKind::cpu);
  static auto stream = dev->make_stream("test-sync");
  comm.barrier(*stream);
  stream->synchronize();
}

// A fresh folder shared by the ranks of `comm` (rank 0 clears it).
std::string shared_dir(const std::string& name, Communicator& comm) {
  const std::string d = std::string(STRATA_TEST_WORK_DIR) + "/ckpt_" + name + "_n" + std::to_string(comm.size());
  sync(comm);
  if (comm.rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  sync(comm);
  return d;
}

std::string rank_dir(const std::string& name) {
  const std::string d = std::string(STRATA_TEST_WORK_DIR) + "/ckpt_nvme_" + name + "_r" + std::to_string(world().rank());
  fs::create_directories(d);
  return d;
}

Config base(Precision p = Precision::fp32) {
  Config c;
  c.model.dim = 48;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.ffn_dim = 80;
  c.model.max_seq_len = 32;
  c.data.seq_len = 16;
  c.data.micro_batch = 2;
  c.data.shuffle = true;
  c.train.steps = 10;
  c.train.grad_accum = 2;
  c.train.precision = p;
  c.train.warmup_steps = 2;
  c.train.lr = 3e-3f;
  c.eval.batches = 0;
  c.log.every = 1000;
  c.offload.optimizer_chunk = 16 << 10;
  return c;
}

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
};

Result run(const Config& c, Communicator& comm, TrainerOptions opt = {}) {
  opt.progress = false;
  Trainer t(c, comm, opt);
  Result r;
  r.losses = t.train().losses;
  for (const auto& n : t.parameter_names()) r.weights.push_back(t.parameter(n));
  return r;
}

// 10 steps straight against 5 + save + resume + 5.
void expect_bit_exact_resume(Config c, const std::string& name) {
  SCOPED_TRACE(name);
  const Result straight = run(c, world());
  const std::string root = shared_dir(name, world());
  Config first = c;
  first.checkpoint.dir = root;
  first.checkpoint.every = 5;
  TrainerOptions stop;
  stop.stop_after = 5;  // interrupted after step 5; the schedule still spans 10 steps
  const Result a = run(first, world(), stop);
  TrainerOptions opt;
  opt.resume = root;
  Config second = c;
  second.checkpoint.dir = root;
  second.checkpoint.every = 100;
  const Result b = run(second, world(), opt);
  std::vector<double> losses = a.losses;
  losses.insert(losses.end(), b.losses.begin(), b.losses.end());
  EXPECT_EQ(losses, straight.losses);
  EXPECT_TRUE(b.weights == straight.weights) << "final weights differ after resume";
}

}  // namespace

class ResumePlacements : public testing::TestWithParam<Precision> {};

TEST_P(ResumePlacements, EveryPlacementResumesBitExact) {
  const Precision prec = GetParam();
  const std::string nvme = rank_dir(prec == Precision::bf16 ? "bf16" : "f32");
  for (Tier params : {Tier::device, Tier::host, Tier::nvme})
    for (Tier grads : {Tier::device, Tier::host})
      for (Tier optimizer : {Tier::device, Tier::host, Tier::nvme}) {
        Config c = base(prec);
        c.offload.params = params;
        c.offload.grads = grads;
        c.offload.optimizer = optimizer;
        if (params == Tier::nvme || optimizer == Tier::nvme) c.offload.nvme_path = {nvme};
        c.checkpoint.async = (int(params) + int(optimizer)) % 2 == 0;  // both kinds of save
        expect_bit_exact_resume(c, str(prec == Precision::bf16 ? "bf16" : "f32", "_p", int(params), "g",
                                       int(grads), "o", int(optimizer)));
        if (HasFailure()) return;
      }
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, ResumePlacements, testing::Values(Precision::fp32, Precision::bf16),
                         [](const auto& info) { return info.param == Precision::bf16 ? "bf16" : "f32"; });

TEST(Checkpoint, ManifestListsEveryTensorFileAndChecksum) {
  Config c = base();
  c.train.steps = 4;
  c.checkpoint.dir = shared_dir("manifest", world());
  c.checkpoint.every = 2;
  c.checkpoint.keep = 1;
  run(c, world());
  if (world().rank() != 0) return;
  // keep = 1: only step_4 is left; `latest` names it.
  auto all = complete_checkpoints(c.checkpoint.dir);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].first, 4);
  std::ifstream latest(c.checkpoint.dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_4");
  const std::string dir = resolve_checkpoint(c.checkpoint.dir);
  const CheckpointManifest m = read_manifest(dir);
  EXPECT_EQ(m.step, 4);
  EXPECT_EQ(m.world, world().size());
  EXPECT_EQ(m.files.size(), size_t(world().size()));
  EXPECT_EQ(m.windows_consumed, uint64_t(4) * 2 * 2 * uint64_t(world().size()));
  EXPECT_EQ(m.tensors.size(), 3u + 2u * 9u);  // embed, final norm, lm_head + 9 per block
  verify_checkpoint_files(dir, m, 0, 1);
  // Each file is exactly what its blocks need, and its hash is the file's.
  for (const auto& f : m.files) {
    EXPECT_EQ(fs::file_size(dir + "/" + f.name), f.bytes);
    EXPECT_EQ(checkpoint_file_hash(dir + "/" + f.name), f.xxh64);
  }
}

TEST(Checkpoint, ADamagedFileIsRefusedNamingBothHashes) {
  Config c = base();
  c.train.steps = 2;
  c.checkpoint.dir = shared_dir("damaged", world());
  c.checkpoint.every = 2;
  run(c, world());
  const std::string dir = c.checkpoint.dir + "/step_2";
  if (world().rank() == 0) {
    std::fstream f(dir + "/rank_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4097);
    char b = 0;
    f.read(&b, 1);
    b ^= 0x10;
    f.seekp(4097);
    f.write(&b, 1);
  }
  sync(world());
  const CheckpointManifest m = read_manifest(dir);
  try {
    verify_checkpoint_files(dir, m, 0, 1);
    FAIL() << "a flipped byte was not detected";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank_00000.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find(hash_hex(m.files[0].xxh64)), std::string::npos) << msg;
    EXPECT_NE(msg.find("is damaged"), std::string::npos) << msg;
  }
  // The manifest is covered too (manifest.xxh64).
  sync(world());  // every rank has read the manifest above
  if (world().rank() == 0) {
    std::fstream f(dir + "/manifest.json", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.write(" ", 1);
  }
  sync(world());
  EXPECT_THROW(read_manifest(dir), Error);
}

TEST(Checkpoint, ExportWritesTheWeightsAsSafetensors) {
  if (world().size() > 1) GTEST_SKIP() << "export runs in one process";
  Config c = base();
  c.train.steps = 3;
  c.checkpoint.dir = shared_dir("export", world());
  TrainerOptions opt;
  opt.progress = false;
  Trainer t(c, world(), opt);
  t.train();
  const std::string dir = resolve_checkpoint(c.checkpoint.dir);
  const CheckpointManifest m = read_manifest(dir);
  const std::string out = c.checkpoint.dir + "/hf";
  export_checkpoint(dir, m, c.model, out, DType::f32);
  SafetensorsReader reader(out);
  for (const auto& name : t.parameter_names()) {
    const std::vector<float> want = t.parameter(name);
    std::vector<float> got(want.size());
    reader.read_f32(name, got.data(), 0, int64_t(got.size()));
    EXPECT_EQ(got, want) << name;
  }
}

TEST(Checkpoint, AnIoErrorWhileSavingEndsTheRunAndKeepsThePreviousCheckpoint) {
  if (world().size() > 1) GTEST_SKIP() << "one process: the error would end every rank";
  Config c = base();
  c.train.steps = 4;
  c.checkpoint.dir = shared_dir("eio", world());
  c.checkpoint.every = 2;
  TrainerOptions opt;
  FaultRule rule;
  rule.fault = Fault::no_space;
  rule.op = int(IoOp::write);
  // Every block of this small model fits one 8 MiB chunk: a save is one write per block (3 per
  // unit), so skipping one save's writes fails the first write of the second save.
  rule.skip = 3 * (c.model.n_layers + 2);
  rule.times = 1;
  opt.checkpoint_io_faults = {rule};
  try {
    run(c, world(), opt);
    FAIL() << "the injected ENOSPC was not reported";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  }
  auto all = complete_checkpoints(c.checkpoint.dir);
  ASSERT_EQ(all.size(), 1u) << "only the save before the error is complete";
  EXPECT_EQ(all[0].first, 2);
  const CheckpointManifest m = read_manifest(all[0].second);
  verify_checkpoint_files(all[0].second, m, 0, 1);
  EXPECT_FALSE(fs::exists(c.checkpoint.dir + "/step_4"));
}

// Resharding: under mpirun -np 4, ranks 0 and 1 write a checkpoint as a 2-rank job; all four
// resume from it (dp 4), and rank 0 alone resumes it (dp 1) — each with the same global batch —
// and each matches the uninterrupted 2-rank run within 1e-5 relative.
TEST(Checkpoint, ACheckpointOfTwoRanksResumesOnFourAndOnOne) {
  if (world().size() != 4) GTEST_SKIP() << "needs mpirun -np 4";
  Config c = base();
  c.train.grad_accum = 2;  // global batch B · 2 · 2 = 8 windows a step
  auto pair = world().split(world().rank() / 2, world().rank());
  pair->set_name("pair");
  const std::string root = shared_dir("reshard", world());
  std::vector<double> straight;
  if (world().rank() < 2) {
    straight = run(c, *pair).losses;
    Config first = c;
    first.checkpoint.dir = root;
    first.checkpoint.every = 5;
    TrainerOptions stop;
    stop.stop_after = 5;
    run(first, *pair, stop);
  }
  sync(world());
  auto check = [&](const std::vector<double>& resumed, const char* what) {
    if (world().rank() != 0) return;
    ASSERT_EQ(resumed.size(), 5u) << what;
    double worst = 0;
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_NEAR(resumed[i], straight[5 + i], 1e-5 * std::abs(straight[5 + i])) << what << " step " << 6 + i;
      worst = std::max(worst, std::abs(resumed[i] - straight[5 + i]) / std::abs(straight[5 + i]));
    }
    std::printf("resharded %s: worst relative loss difference over steps 6-10: %.2e\n", what, worst);
  };
  TrainerOptions opt;
  opt.resume = root;
  Config four = c;
  four.train.grad_accum = 1;  // 4 ranks × 1
  check(run(four, world(), opt).losses, "on 4 ranks");
  sync(world());
  if (world().rank() == 0) {
    Config one = c;
    one.train.grad_accum = 4;  // 1 rank × 4
    auto solo = make_solo_communicator();
    check(run(one, *solo, opt).losses, "on 1 rank");
  }
  sync(world());
}
