// Every schedule terminates and is exact: the grid of zero.prefetch 0–3 × offload.prefetch 0–3 ×
// the tier of params (device | host | nvme) × grads (device | host) × optimizer (device | host |
// nvme) × train.grad_accum 1 and 3 × activation checkpointing off and on — on one rank (run
// plainly) and on N ranks (under mpirun) — finishes, and its losses and final weights are
// bit-identical to the all-device run with the same grad_accum, rank count and embedding tying
// (each point's tying alternates with zero.prefetch + offload.prefetch, and a third of the prefetch
// pairs keep units gathered from forward to backward — zero.reshard_after_forward = false — so
// every kind of slot pool is walked; the vocabulary is large enough that slots are sized per
// unit kind).
//
// The default suite runs a fixed-seed sample of the grid (plus the points that once hung);
// STRATA_SCHEDULE_GRID=full (the `slow` CTest entries) runs all of it. Every point runs under a
// Deadline: a hang ends the job with the point's settings instead of stalling CI. Nothing here
// times anything.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <tuple>

#include "core/error.h"
#include "comm/comm_registry.h"
#include "engine/trainer.h"
#include "tests/support/deadline.h"

using namespace strata;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

struct Point {
  int zero_prefetch = 1, nvme_prefetch = 2;
  Tier params = Tier::device, grads = Tier::device, optimizer = Tier::device;
  int grad_accum = 1;
  bool checkpointing = false;
  bool tied() const { return (zero_prefetch + nvme_prefetch) % 2 == 1; }
  // A third of the prefetch pairs keep units gathered from forward to backward.
  bool reshard() const { return (zero_prefetch * 4 + nvme_prefetch) % 3 != 0; }
};

const char* tier(Tier t) { return t == Tier::device ? "device" : t == Tier::host ? "host" : "nvme"; }

std::string describe(const Point& p) {
  return str("zero.prefetch=", p.zero_prefetch, " offload.prefetch=", p.nvme_prefetch,
             " params=", tier(p.params), " grads=", tier(p.grads), " optimizer=", tier(p.optimizer),
             " grad_accum=", p.grad_accum, " checkpointing=", p.checkpointing ? "on" : "off",
             " tied=", p.tied() ? "yes" : "no", " reshard_after_forward=", p.reshard() ? "true" : "false",
             " ranks=", world().size());
}

std::vector<Point> full_grid() {
  std::vector<Point> grid;
  for (int zp = 0; zp <= 3; ++zp)
    for (int np = 0; np <= 3; ++np)
      for (Tier params : {Tier::device, Tier::host, Tier::nvme})
        for (Tier grads : {Tier::device, Tier::host})
          for (Tier optimizer : {Tier::device, Tier::host, Tier::nvme})
            for (int accum : {1, 3})
              for (bool ckpt : {false, true})
                grid.push_back(Point{zp, np, params, grads, optimizer, accum, ckpt});
  return grid;
}

// The fixed-seed sample of the default suite, plus the two settings that hung on main before
// the gather protocol was written down (an NVMe read waited for before it was issued).
std::vector<Point> sample(size_t n) {
  std::vector<Point> grid = full_grid(), out;
  std::mt19937 rng(20261201);
  std::shuffle(grid.begin(), grid.end(), rng);
  out.assign(grid.begin(), grid.begin() + long(n));
  out.push_back(Point{1, 0, Tier::nvme, Tier::device, Tier::nvme, 1, false});
  out.push_back(Point{2, 1, Tier::nvme, Tier::device, Tier::nvme, 1, false});
  return out;
}

Config config_of(const Point& p, const std::string& nvme) {
  Config c;
  c.model.dim = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.ffn_dim = 48;
  c.model.max_seq_len = 16;
  // A vocabulary of 1024 makes the embedding and the head (32K elements) four times a block
  // (8K): the slots are sized per unit kind (one shared by embedding and head, the rest for
  // blocks; two end slots when a window spans the model), so every point walks those classes.
  c.model.vocab_size = 1024;
  c.model.tie_embeddings = p.tied();
  c.data.seq_len = 8;
  c.data.micro_batch = 2;
  c.train.steps = 2;
  c.train.warmup_steps = 1;
  c.train.grad_accum = p.grad_accum;
  c.eval.batches = 0;
  c.log.every = 1000;
  c.zero.prefetch = p.zero_prefetch;
  c.zero.activation_checkpointing = p.checkpointing;
  c.zero.reshard_after_forward = p.reshard();
  c.offload.prefetch = p.nvme_prefetch;
  c.offload.params = p.params;
  c.offload.grads = p.grads;
  c.offload.optimizer = p.optimizer;
  c.offload.optimizer_chunk = 16 << 10;  // several chunks per shard: the NVMe pipeline runs
  if (p.params == Tier::nvme || p.optimizer == Tier::nvme) c.offload.nvme_path = {nvme};
  return c;
}

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
};

Result run(const Config& c) {
  TrainerOptions opt;
  opt.progress = false;
  Trainer t(c, world(), opt);
  Result r;
  r.losses = t.train().losses;
  for (const auto& n : t.parameter_names()) r.weights.push_back(t.parameter(n));
  return r;
}

void walk(const std::vector<Point>& points) {
  const std::string nvme = std::string(STRATA_TEST_WORK_DIR) + "/grid_nvme_r" + std::to_string(world().rank());
  std::filesystem::create_directories(nvme);
  std::map<std::tuple<int, bool>, Result> refs;  // (grad_accum, tied) → all-device run
  int failures = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    const std::string what = describe(p);
    SCOPED_TRACE(what);
    if (std::getenv("STRATA_TEST_VERBOSE") && world().rank() == 0)
      std::fprintf(stderr, "[%zu/%zu] %s\n", i + 1, points.size(), what.c_str());
    auto key = std::make_tuple(p.grad_accum, p.tied());
    if (!refs.count(key)) {
      Point all;  // everything on the device, default prefetch depths, no checkpointing
      all.grad_accum = p.grad_accum;
      all.zero_prefetch = p.tied() ? 1 : 0;
      all.nvme_prefetch = p.tied() ? 0 : 2;
      test::Deadline d(120, "the all-device reference " + describe(all));
      refs[key] = run(config_of(all, nvme));
    }
    const Result& ref = refs[key];
    Result r;
    {
      test::Deadline d(120, "grid point " + what);
      r = run(config_of(p, nvme));
    }
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_TRUE(r.weights == ref.weights) << "final weights differ from the all-device run";
    if (r.losses != ref.losses || r.weights != ref.weights) ++failures;
    ASSERT_LE(failures, 5) << "stopping after 5 failing points";
  }
}

}  // namespace

TEST(ScheduleGrid, EveryPointTerminatesAndIsBitIdenticalToAllDevice) {
  const char* mode = std::getenv("STRATA_SCHEDULE_GRID");
  const bool full = mode && std::string(mode) == "full";
  const std::vector<Point> points = full ? full_grid() : sample(world().size() > 1 ? 32 : 64);
  if (world().rank() == 0)
    std::fprintf(stderr, "schedule grid: %zu points (%s) on %d rank(s)\n", points.size(),
                 full ? "the whole grid" : "fixed-seed sample", world().size());
  walk(points);
}
