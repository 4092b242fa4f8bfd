// Offload never changes a number: for every combination of placements (params device | host |
// nvme, grads device | host | nvme (beside NVMe states), optimizer device | host | nvme), in f32
// and bf16, with f32 and with
// bf16 AdamW m and v (train.optimizer_state_dtype), on one rank (run
// plainly) or on N ranks (under mpirun), the losses and final weights are bit-identical to the
// all-device run. Also: NVMe over two directories, a pinned budget too small for one unit, a
// device limit only the offloaded placement fits under, and an I/O error in the middle of a step.
// The NVMe tier is real files under the build tree (label nvme).
#include <gtest/gtest.h>

#include <filesystem>
#include <cstdio>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "comm/comm_registry.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_hooks.h"
#include "engine/trainer.h"
#include "engine/zero.h"
#include "kernels/device.h"
#include "optimizer/adamw.h"
#include "tests/engine/test_util.h"
#include "tests/support/tiny_config.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

std::string nvme_dir(const std::string& name) {
  std::string d = std::string(STRATA_TEST_WORK_DIR) + "/nvme_" + name + "_r" + std::to_string(world().rank());
  fs::create_directories(d);
  return d;
}

Config base(Precision p) {
  Config c = test::tiny_config({.dim = 48, .ffn_dim = 80, .max_seq_len = 32}, 16, 2);
  c.train.steps = 3;
  c.train.grad_accum = 2;
  c.train.precision = p;
  c.train.warmup_steps = 1;
  c.offload.optimizer_chunk = 16 << 10;  // several chunks per shard: the pipeline really runs
  c.offload.prefetch = 1;
  return c;
}

// What a run gives: its losses, its final weights and each step's record.
struct Result {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  std::vector<StepRecord> records;
};

// Trains c; opt's own on_step, if any, still sees every record.
Result run(const Config& c, TrainerOptions opt = {}) {
  opt.progress = false;
  auto records = std::make_shared<std::vector<StepRecord>>();
  opt.on_step = [records, also = opt.on_step](const StepRecord& s) {
    records->push_back(s);
    if (also) also(s);
  };
  Trainer t(c, world(), opt);
  Result r;
  r.losses = t.train().losses;
  for (const auto& n : t.parameter_names()) r.weights.push_back(t.parameter(n));
  r.records = *records;
  return r;
}

// An overlapped run trained as its serial order did: the same losses, logged gradient norms and
// final weights.
void expect_serial_order(const Result& overlapped, const Result& serial) {
  EXPECT_EQ(overlapped.losses, serial.losses);
  EXPECT_TRUE(overlapped.weights == serial.weights) << "final weights differ";
  ASSERT_EQ(overlapped.records.size(), serial.records.size());
  for (size_t i = 0; i < serial.records.size(); ++i)
    EXPECT_EQ(overlapped.records[i].grad_norm, serial.records[i].grad_norm) << "step " << i + 1;
}

const char* name(Tier t) { return t == Tier::device ? "device" : t == Tier::host ? "host" : "nvme"; }

// Holds one unit's update, in every step but the last, until the next step has begun (bounded:
// 30 s), and records per step the step that had begun when that update started — the step
// itself when the update runs before the next step, the next one when it runs into it. With
// hold false it only records. Installs its hooks on `hooks`; outlives the run.
struct HoldUpdateUntilNextStep {
  int unit;
  int64_t steps;
  bool hold;
  std::mutex mu;
  std::condition_variable cv;
  int64_t begun = 0, updates = 0;
  std::vector<int64_t> begun_at;

  HoldUpdateUntilNextStep(TestHooks& hooks, int unit_, int64_t steps_, bool hold_)
      : unit(unit_), steps(steps_), hold(hold_) {
    hooks.before_step = [this](int64_t step) {
      std::lock_guard<std::mutex> lock(mu);
      begun = step;
      cv.notify_all();
    };
    hooks.before_unit_update = [this](int u) {
      if (u != unit) return;
      std::unique_lock<std::mutex> lock(mu);
      ++updates;
      if (hold && updates < steps)  // no step follows the last
        cv.wait_for(lock, std::chrono::seconds(30), [&] { return begun > updates; });
      begun_at.push_back(begun);
    };
  }
};

}  // namespace

// The compute precision and the dtype of m and v.
struct Numerics {
  Precision precision;
  DType states;
  std::string name() const {
    return str(precision == Precision::bf16 ? "bf16" : "f32",
               states == DType::bf16 ? "_bf16states" : "");
  }
};

class Placements : public testing::TestWithParam<Numerics> {};

// Three orders of the optimizer off the device: overlapped into the next forward (clipping),
// serial, and unclipped (train.grad_clip = 0: each unit updated during the backward, as soon as
// its gradient is final), each against the all-device run with the same clipping. States on NVMe
// also with offload.optimizer_read_ahead: two or three chunks (part of the first units), and
// more than there is (every chunk); and each of those again with offload.optimizer_host_bytes
// keeping the first two units' states in host memory (room for two and a half: whole units only).
TEST_P(Placements, EveryPlacementIsBitIdenticalToAllDevice) {
  const Numerics num = GetParam();
  Config all = base(num.precision);
  all.train.optimizer_state_dtype = num.states;
  Config all_unclipped = all;
  all_unclipped.train.grad_clip = 0;
  const Result ref = run(all), ref_unclipped = run(all_unclipped);
  ASSERT_NE(ref.losses, ref_unclipped.losses) << "clipping must be active for the comparison to mean anything";
  // Gradients on NVMe take one micro-batch a step: against the all-device run of one.
  Config all1 = all, all1_unclipped = all_unclipped;
  all1.train.grad_accum = all1_unclipped.train.grad_accum = 1;
  const Result ref1 = run(all1), ref1_unclipped = run(all1_unclipped);
  const std::string dir = nvme_dir(num.name());
  uint64_t keep_bytes = 0;  // the first two units' master, m and v, and half the third's
  {
    const LlamaModel whole(all.model, world().size());  // named: units() refers into it
    const uint64_t per = 4 + 2 * dtype_bytes(num.states);
    for (int u = 0; u < 3; ++u)
      keep_bytes += whole.unit(u).layout.shard_numel() * per / (u == 2 ? 2 : 1);
  }
  int combos = 0;
  enum Order { overlapped, serial, unclipped };
  for (Tier params : {Tier::device, Tier::host, Tier::nvme})
    for (Tier grads : {Tier::device, Tier::host, Tier::nvme})
      for (Tier optimizer : {Tier::device, Tier::host, Tier::nvme})
        for (Order order : {overlapped, serial, unclipped})
          for (uint64_t ahead : {uint64_t(0), 7 * all.offload.optimizer_chunk, uint64_t(1) << 30})
          for (uint64_t keep : {uint64_t(0), keep_bytes}) {
            if (order != overlapped && optimizer == Tier::device) continue;  // nothing to overlap
            // Read ahead: states on NVMe, overlapped (the gradients are in host memory whatever
            // offload.grads says, so one of the two suffices). States kept in host memory: on
            // NVMe, the same one of the two.
            if (ahead && (optimizer != Tier::nvme || order == serial || grads == Tier::device))
              continue;
            if (keep && (optimizer != Tier::nvme || grads == Tier::device)) continue;
            // Gradients on NVMe (beside NVMe states only): the compute copy on the device or on
            // NVMe, read ahead by part of the states or not at all.
            const bool nvme_grads = grads == Tier::nvme;
            if (nvme_grads && (optimizer != Tier::nvme || params == Tier::host || (ahead >> 30)))
              continue;
            Config c = order == unclipped ? (nvme_grads ? all1_unclipped : all_unclipped)
                                          : (nvme_grads ? all1 : all);
            c.offload.params = params;
            c.offload.grads = grads;
            c.offload.optimizer = optimizer;
            c.offload.overlap_optimizer = order != serial;
            c.offload.optimizer_read_ahead = ahead;
            c.offload.optimizer_host_bytes = keep;
            if (params == Tier::nvme || optimizer == Tier::nvme) c.offload.nvme_path = {dir};
            std::string what = std::string("params=") + name(params) + " grads=" + name(grads) +
                               " optimizer=" + name(optimizer) +
                               (order == serial ? " serial" : order == unclipped ? " unclipped" : "") +
                               (ahead ? str(" read_ahead=", format_bytes(ahead)) : std::string()) +
                               (keep ? str(" host_bytes=", format_bytes(keep)) : std::string());
            SCOPED_TRACE(what);
            if (std::getenv("STRATA_TEST_VERBOSE")) std::fprintf(stderr, "placement %s\n", what.c_str());
            Result r = run(c);
            const Result& want = order == unclipped ? (nvme_grads ? ref1_unclipped : ref_unclipped)
                                                    : (nvme_grads ? ref1 : ref);
            EXPECT_EQ(r.losses, want.losses) << what;
            EXPECT_TRUE(r.weights == want.weights) << what << ": final weights differ";
            ++combos;
          }
  // + with kept states: 3 params x (overlapped and unclipped with 3 read-aheads, serial)
  // + gradients on NVMe: 2 params x (overlapped and unclipped with 2 read-aheads, serial) x 2 keeps
  EXPECT_EQ(combos, 18 + 12 + 12 + 3 * 2 * 2 + 3 * 7 + 2 * 5 * 2);
}

INSTANTIATE_TEST_SUITE_P(Offload, Placements,
                         testing::Values(Numerics{Precision::fp32, DType::f32}, Numerics{Precision::bf16, DType::f32},
                                         Numerics{Precision::fp32, DType::bf16},
                                         Numerics{Precision::bf16, DType::bf16}),
                         [](const auto& info) { return info.param.name(); });

// With bf16 precision the forward reads the compute copy, which every path (the device's
// AdamW, the CPU AdamW's fused copy over chunks, its NVMe write-back, the initial cast) must
// round from the master to nearest even. The placements above agree with each other bit for
// bit, so a rounding they shared (truncation, say) would pass there and be caught only by a
// tolerance; here the forward of an evaluation after the last step must read exactly
// RNE(master), element by element, on each path.
TEST(Offload, Bf16ComputeCopyIsTheMasterRoundedToNearestEven) {
  struct Case {
    const char* what;
    Tier params, grads, optimizer;
    bool overlap = true, clip = true, bf16_states = false;
    uint64_t ahead = 0, keep = 0;
  };
  const uint64_t chunk = base(Precision::bf16).offload.optimizer_chunk;
  const Case cases[] = {
      {"all on the device", Tier::device, Tier::device, Tier::device},
      {"host memory", Tier::host, Tier::host, Tier::host},
      {"host memory, serial", Tier::host, Tier::host, Tier::host, false},
      {"NVMe, read ahead", Tier::nvme, Tier::host, Tier::nvme, true, true, false, 7 * chunk},
      {"NVMe, unclipped", Tier::nvme, Tier::host, Tier::nvme, true, false},
      {"NVMe states kept, bf16 m and v", Tier::host, Tier::host, Tier::nvme, true, true, true, 0,
       uint64_t(1) << 20},
      // The gathers round the master, read from NVMe or, for the first units, host memory.
      {"NVMe, first units' states kept", Tier::nvme, Tier::host, Tier::nvme, true, true, true,
       7 * chunk, uint64_t(1) << 20},
      {"NVMe, serial", Tier::nvme, Tier::host, Tier::nvme, false},
  };
  uint64_t checked = 0, differ_from_truncation = 0;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    Config c = base(Precision::bf16);
    c.offload.params = k.params;
    c.offload.grads = k.grads;
    c.offload.optimizer = k.optimizer;
    c.offload.overlap_optimizer = k.overlap;
    if (!k.clip) c.train.grad_clip = 0;
    if (k.bf16_states) c.train.optimizer_state_dtype = DType::bf16;
    c.offload.optimizer_read_ahead = k.ahead;
    c.offload.optimizer_host_bytes = k.keep;
    if (k.params == Tier::nvme || k.optimizer == Tier::nvme)
      c.offload.nvme_path = {nvme_dir("rounded_copy")};
    c.eval.batches = 1;
    const LlamaModel model(c.model, world().size());  // named: units() refers into it
    std::map<int, std::vector<float>> read;  // per unit, what the evaluation's forward read
    std::atomic<bool> evaluating = false;
    auto hooks = std::make_shared<TestHooks>();
    hooks->after_forward = [&](int u, std::span<const float> params) {
      if (evaluating) read[u].assign(params.begin(), params.end());
    };
    TrainerOptions opt;
    opt.progress = false;
    opt.test_hooks = hooks;
    Trainer t(c, world(), opt);
    t.train();
    evaluating = true;  // the compute stream has run every training forward: train() returned
    t.evaluate();
    ASSERT_EQ(int(read.size()), model.num_units());
    for (int u = 0; u < model.num_units(); ++u) {
      const FlatLayout& L = model.unit(u).layout;
      ASSERT_EQ(read[u].size(), L.numel());
      for (const ParamView& v : L.views()) {
        const std::vector<float> master = t.parameter(v.name);
        ASSERT_EQ(master.size(), v.numel) << v.name;
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < v.numel; ++i) {
          const uint16_t want = f32_to_bf16_bits(master[i]);
          uint32_t bits;
          std::memcpy(&bits, &read[u][v.offset + i], 4);
          if (bits != uint32_t(want) << 16 && wrong++ == 0) first = i;
          uint32_t m;
          std::memcpy(&m, &master[i], 4);
          differ_from_truncation += want != uint16_t(m >> 16);
        }
        checked += v.numel;
        EXPECT_EQ(wrong, 0u) << v.name << ": " << wrong << " of " << v.numel
                             << " elements are not the master rounded to nearest even (first: "
                             << first << ")";
      }
    }
  }
  // Truncation would differ from these in about half the elements.
  EXPECT_GT(differ_from_truncation, checked / 4) << checked << " elements checked";
}

// eval.every: validation between steps reads only the compute copy, on every tier; the training
// numbers are those of the run without it, and each eval loss is the one a run stopped at that
// step measures (eval.batches odd, so with 2 ranks one rank repeats a batch and drops its loss).
TEST(Offload, ValidationDuringTrainingChangesNoNumber) {
  Config plain = base(Precision::bf16);
  plain.train.steps = 5;
  plain.eval.batches = 3;
  const std::string dir = nvme_dir("eval");
  struct Placement {
    Tier params, grads, optimizer;
    int zero_prefetch, offload_prefetch;
  };
  std::vector<double> first_evals;
  for (Placement p : {Placement{Tier::device, Tier::device, Tier::device, 1, 1},
                      Placement{Tier::nvme, Tier::host, Tier::nvme, 2, 0},
                      Placement{Tier::host, Tier::host, Tier::host, 0, 2}}) {
    Config c = plain;
    c.offload.params = p.params;
    c.offload.grads = p.grads;
    c.offload.optimizer = p.optimizer;
    c.zero.prefetch = p.zero_prefetch;
    c.offload.prefetch = p.offload_prefetch;
    if (p.params == Tier::nvme || p.optimizer == Tier::nvme) c.offload.nvme_path = {dir};
    const std::string what = str("params=", name(p.params), " grads=", name(p.grads),
                                 " optimizer=", name(p.optimizer));
    SCOPED_TRACE(what);
    const Result ref = run(c);

    Config ev = c;
    ev.eval.every = 2;
    std::vector<std::pair<int64_t, double>> evals;
    TrainerOptions opt;
    opt.on_step = [&](const StepRecord& r) {
      if (r.eval_loss >= 0) evals.emplace_back(r.step, r.eval_loss);
    };
    opt.progress = false;
    Trainer t(ev, world(), opt);
    const TrainSummary s = t.train();
    EXPECT_EQ(s.losses, ref.losses) << "validation changed the training losses";
    std::vector<std::vector<float>> weights;
    for (const auto& n : t.parameter_names()) weights.push_back(t.parameter(n));
    EXPECT_TRUE(weights == ref.weights) << "validation changed the final weights";

    ASSERT_EQ(evals.size(), 3u);  // after steps 2, 4 and the last (5)
    EXPECT_EQ(evals[0].first, 2);
    EXPECT_EQ(evals[1].first, 4);
    EXPECT_EQ(evals[2].first, 5);
    EXPECT_EQ(s.eval_loss, evals[2].second) << "the final evaluation is the last step's";
    double best = evals[0].second;
    int64_t best_step = evals[0].first;
    for (auto [step, loss] : evals)
      if (loss < best) best = loss, best_step = step;
    EXPECT_EQ(s.best_eval_loss, best);
    EXPECT_EQ(s.best_eval_step, best_step);

    // The eval losses after steps 2 and 4 are what runs interrupted there measure at their end
    // (the later one: after an evaluation earlier in the run changed nothing).
    for (size_t i : {0, 1}) {
      TrainerOptions stop;
      stop.progress = false;
      stop.stop_after = evals[i].first;
      Trainer st(c, world(), stop);
      EXPECT_EQ(st.train().eval_loss, evals[i].second) << "after step " << evals[i].first;
    }
    first_evals.push_back(evals[0].second);
    EXPECT_TRUE(std::isfinite(evals[0].second) && evals[0].second > 0);
  }
  for (double e : first_evals) EXPECT_EQ(e, first_evals[0]) << "the eval loss depends on the tier";
}

TEST(Offload, NvmeStripedOverTwoDirectories) {
  Config c = base(Precision::bf16);
  const Result ref = run(c);
  c.offload.params = Tier::nvme;
  c.offload.optimizer = Tier::nvme;
  c.offload.nvme_path = {nvme_dir("a"), nvme_dir("b")};
  c.io.stripe_size = 64 << 10;
  c.io.block_size = 16 << 10;
  // While it trains, the process holds a (deleted) swap file in each directory.
  std::vector<int> open_in(c.offload.nvme_path.size(), 0);
  auto hooks = std::make_shared<TestHooks>();
  hooks->before_step = [&](int64_t step) {
    if (step != 2) return;
    for (const auto& fd : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = fs::read_symlink(fd.path(), ec).string();
      for (size_t i = 0; i < open_in.size(); ++i)
        open_in[i] += !ec && target.rfind(c.offload.nvme_path[i] + "/", 0) == 0;
    }
  };
  TrainerOptions opt;
  opt.test_hooks = hooks;
  Result r = run(c, opt);
  EXPECT_EQ(r.losses, ref.losses);
  EXPECT_TRUE(r.weights == ref.weights);
  for (size_t i = 0; i < open_in.size(); ++i)
    EXPECT_GE(open_in[i], 1) << "no swap file open under " << c.offload.nvme_path[i];
  // Nothing is left behind: the swap files are unlinked once open.
  for (const auto& d : c.offload.nvme_path) EXPECT_TRUE(fs::is_empty(d)) << d;
}

TEST(Offload, PinnedBudgetTooSmallForOneUnitFailsAtPlanTime) {
  Config c = base(Precision::fp32);
  c.offload.params = Tier::nvme;
  c.offload.optimizer = Tier::nvme;
  c.offload.nvme_path = {nvme_dir("pinned")};
  c.offload.pinned_mem_limit = 64 << 10;
  try {
    run(c);
    FAIL() << "a 64K pinned budget was accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[train::plan]"), std::string::npos) << m;
    EXPECT_NE(m.find("offload.pinned_mem_limit"), std::string::npos) << m;
    EXPECT_NE(m.find("DOES NOT FIT"), std::string::npos) << m;
  }
}

TEST(Offload, DeviceLimitOnlyTheOffloadedPlacementFits) {
  Config all = base(Precision::fp32);
  Config off = all;
  off.offload.params = Tier::host;
  off.offload.optimizer = Tier::nvme;
  off.offload.nvme_path = {nvme_dir("limit")};
  PlanMachine m;
  m.device_capacity = 64ull << 30;
  m.ranks_here = world().size();
  const int dp = world().size();
  const uint64_t need_all = plan_memory(all, dp, m).device_bytes();
  const uint64_t need_off = plan_memory(off, dp, m).device_bytes();
  ASSERT_LT(need_off, need_all);
  const uint64_t limit = need_off + (need_all - need_off) / 2;
  all.offload.device_mem_limit = off.offload.device_mem_limit = limit;
  EXPECT_ERROR_HAS(run(all), "offload.device_mem_limit");
  Result r = run(off);  // fits, and the device's own cap held every allocation
  EXPECT_EQ(r.losses.size(), 3u);
}

// The plan counts what the engine allocates, row by row: device shards, the gathered working set
// (parameter and gradient slots), host shards, pinned staging pools and NVMe extents — for f32
// and bf16 m and v, on every optimizer tier, with the compute copy in memory and on NVMe.
TEST(Offload, PlanCountsWhatTheEngineAllocates) {
  const std::string dir = nvme_dir("plan");
  for (Precision prec : {Precision::fp32, Precision::bf16})
    for (DType states : {DType::f32, DType::bf16})
      for (Tier optimizer : {Tier::device, Tier::host, Tier::nvme})
      for (Tier grads : {Tier::host, Tier::nvme}) {
        if (grads == Tier::nvme && optimizer != Tier::nvme) continue;
        Config c = base(prec);
        c.train.steps = 1;
        c.train.optimizer_state_dtype = states;
        c.offload.grads = grads;
        if (grads == Tier::nvme) c.train.grad_accum = 1;
        c.offload.optimizer = optimizer;
        c.offload.params = optimizer == Tier::nvme ? Tier::nvme : Tier::host;
        c.offload.nvme_path = {dir};
        // With bf16 m and v, states read ahead too (a pool of its own; ignored off NVMe).
        c.offload.optimizer_read_ahead = states == DType::bf16 ? 5 * c.offload.optimizer_chunk : 0;
        // With bf16 compute and the states on NVMe, the first unit's states in host memory.
        uint64_t shard = 0;
        const LlamaModel whole(c.model, world().size());  // named: units() refers into it
        for (const auto& u : whole.units()) shard += u.layout.shard_numel();
        const uint64_t first = whole.unit(0).layout.shard_numel();
        if (optimizer == Tier::nvme && prec == Precision::bf16)
          c.offload.optimizer_host_bytes = first * (4 + 2 * dtype_bytes(states)) + 4096;
        const uint64_t kept = c.offload.optimizer_host_bytes ? first : 0;
        const std::string what = str(precision_name(prec), " ", dtype_name(states), " m, v; optimizer ",
                                     name(optimizer), ", params ", name(c.offload.params),
                                     c.offload.optimizer_read_ahead ? " read ahead" : "",
                                     kept ? ", the first unit's states in host memory" : "",
                                     grads == Tier::nvme ? ", gradients on NVMe" : "");
        SCOPED_TRACE(what);
        PlanMachine m;
        m.device_capacity = 64ull << 30;
        m.ranks_here = world().size();
        const MemoryPlan plan = plan_memory(c, world().size(), m);
        auto rows = [&](const std::string& tier, std::initializer_list<const char*> prefixes) {
          uint64_t b = 0;
          for (const auto& r : plan.rows)
            for (const char* p : prefixes)
              if (r.tier == tier && r.what.rfind(p, 0) == 0) b += r.bytes;
          return b;
        };
        const char* states_rows[] = {"master weights", "AdamW m and v", "gradients", "compute copy"};
        uint64_t device_states = 0, host_states = 0;
        for (const char* p : states_rows) {
          device_states += rows("device", {p});
          host_states += rows("host", {p}) + rows("pinned", {p});
        }
        TrainerOptions opt;
        opt.progress = false;
        Trainer t(c, world(), opt);
        const ZeroMemory z = t.state_memory();
        EXPECT_EQ(z.shard_bytes, device_states);
        EXPECT_EQ(z.gathered_bytes, rows("device", {"gathered parameters", "full gradients"}));
        EXPECT_EQ(z.host_bytes, host_states);
        // Each staging pool is one slab rounded up to 2 MiB pages (offload/pinned_pool.h), which
        // the plan does not count.
        const uint64_t staging = rows("pinned", {"NVMe"});
        const uint64_t pools = uint64_t(std::count_if(plan.rows.begin(), plan.rows.end(),
                                                      [](const PlanRow& r) { return r.what.rfind("NVMe", 0) == 0; }));
        EXPECT_EQ(z.staging_bytes, staging);
        EXPECT_GE(z.pinned_bytes, staging);
        EXPECT_LE(z.pinned_bytes, staging + pools * ((2u << 20) - 1));
        EXPECT_EQ(z.nvme_bytes, plan.tier_bytes("nvme"));
        // m and v: 8 bytes per shard element in f32, 4 in bf16 (the kept unit's in host memory).
        const uint64_t mv = states == DType::bf16 ? 4 : 8;
        EXPECT_EQ(rows(name(optimizer), {"AdamW m and v"}),
                  (shard - (optimizer == Tier::nvme ? kept : 0)) * mv);
        if (optimizer == Tier::nvme) {
          EXPECT_EQ(rows("host", {"AdamW m and v"}), kept * mv);
          // bf16 (kept only then): the gathers round the master, read from there: pinned.
          EXPECT_EQ(rows("pinned", {"master weights"}), kept * 4);
          // No compute copy on NVMe: the gathers read the master (f32) or round it (bf16).
          EXPECT_EQ(rows("nvme", {"compute copy"}), 0u);
          // Gradients on NVMe but the kept unit's, staged in whole shards on their way.
          EXPECT_EQ(rows("nvme", {"gradients"}), grads == Tier::nvme ? (shard - kept) * 4 : 0);
          EXPECT_EQ(rows("pinned", {"gradients"}), grads == Tier::nvme ? kept * 4 : shard * 4);
          EXPECT_EQ(rows("pinned", {"NVMe gradient staging"}) > 0, grads == Tier::nvme);
        }
        // An f32 master in host memory that is also the compute copy is pinned: the gathers
        // copy from it.
        if (optimizer == Tier::host) {
          const bool is_copy = prec == Precision::fp32;
          EXPECT_EQ(rows("pinned", {"master weights"}), is_copy ? shard * 4 : 0);
          EXPECT_EQ(rows("host", {"master weights"}), is_copy ? 0 : shard * 4);
        }
      }
}

// Under a pinned budget the parameter staging gets what the optimizer's pools leave, in whole
// shards, offload.prefetch + 1 at most and one at least; below that one the plan's check fails
// and the engine refuses to start, naming the key. The compute copies kept for the next forward
// get what is left after that, two shards at most and possibly none. Plan and engine agree at
// every budget.
TEST(Offload, PlanAndEngineShareThePinnedBudget) {
  Config c = base(Precision::bf16);
  c.train.steps = 1;
  c.offload.params = Tier::nvme;
  c.offload.optimizer = Tier::nvme;
  c.offload.prefetch = 2;  // up to three parameter shards
  c.offload.nvme_path = {nvme_dir("pinned_budget")};
  c.offload.optimizer_read_ahead = 3 * c.offload.optimizer_chunk;  // a pool of its own too
  const LlamaModel model(c.model, world().size());
  const PinnedStaging unlimited =
      pinned_staging(model, zero_options(c).placement, 0, c.offload.prefetch);
  ASSERT_EQ(unlimited.param_shards, 3);
  ASSERT_GT(unlimited.ahead_buffers, 0);
  ASSERT_GT(unlimited.chunk_buffers, 0);
  const uint64_t min = unlimited.minimum(), shard = unlimited.param_shard_bytes;
  ASSERT_EQ(unlimited.forward_shards, PinnedStaging::kForwardShards);
  // bf16 with params and optimizer on NVMe: a gather reads the f32 master (4 bytes an element),
  // a kept forward copy is bf16 (2).
  const uint64_t fshard = unlimited.forward_shard_bytes;
  ASSERT_EQ(2 * fshard, shard);
  struct Case {
    uint64_t limit;
    int shards;  // 0: refused
    int forward;
  };
  for (const Case& k : {Case{0, 3, 2}, Case{min + 2 * shard + 3 * fshard, 3, 2},
                        Case{min + 2 * shard + fshard, 3, 1}, Case{min + shard + fshard / 2, 2, 0},
                        Case{min, 1, 0}, Case{min - 1, 0, 0}}) {
    c.offload.pinned_mem_limit = k.limit;
    SCOPED_TRACE(str("offload.pinned_mem_limit = ", k.limit, " (one unit needs ", min, ")"));
    PlanMachine m;
    m.device_capacity = 64ull << 30;
    m.ranks_here = world().size();
    const MemoryPlan plan = plan_memory(c, world().size(), m);
    const PlanCheck* check = nullptr;
    for (const PlanCheck& ch : plan.checks)
      if (ch.limit_name == "offload.pinned_mem_limit") check = &ch;
    if (k.limit) {
      ASSERT_NE(check, nullptr);
      EXPECT_EQ(check->need, min);
      EXPECT_EQ(check->ok(), k.shards > 0);
    } else {
      EXPECT_EQ(check, nullptr) << "no budget, no check";
    }
    TrainerOptions opt;
    opt.progress = false;
    if (k.shards == 0) {
      try {
        Trainer t(c, world(), opt);
        ADD_FAILURE() << "a budget below one unit's staging must be refused";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("offload.pinned_mem_limit"), std::string::npos)
            << e.what();
      }
      continue;
    }
    const std::string row = str("NVMe parameter read-ahead staging (", k.shards, " shards)");
    const std::string fwd_row =
        str("NVMe compute copies kept for the forward (", k.forward, " shards)");
    uint64_t planned = 0, row_bytes = 0, fwd_bytes = 0;
    int pools = 0;
    for (const PlanRow& r : plan.rows) {
      if (r.tier != "pinned" || r.what.rfind("NVMe", 0) != 0) continue;  // the staging pools
      planned += r.bytes;
      ++pools;
      if (r.what == row) row_bytes = r.bytes;
      if (r.what == fwd_row) fwd_bytes = r.bytes;
    }
    EXPECT_EQ(row_bytes, uint64_t(k.shards) * shard) << "no row \"" << row << "\"";
    EXPECT_EQ(fwd_bytes, uint64_t(k.forward) * fshard) << "no row \"" << fwd_row << "\"";
    if (k.limit) {
      EXPECT_LE(planned, k.limit);
    }
    Trainer t(c, world(), opt);
    const ZeroMemory z = t.state_memory();
    EXPECT_EQ(z.param_staging_shards, k.shards);
    EXPECT_EQ(z.forward_shards, k.forward);
    EXPECT_EQ(z.staging_bytes, planned);
    // Each pool is one slab rounded up to 2 MiB pages, which the plan does not count.
    EXPECT_GE(z.pinned_bytes, planned);
    EXPECT_LE(z.pinned_bytes, planned + uint64_t(pools) * ((2u << 20) - 1));
    EXPECT_EQ(pools, k.forward ? 4 : 3);
  }
}

// Slots sized per unit kind: with a vocabulary whose embedding and head are several blocks each,
// the engine's gathered working set is what the plan counts and less than the old pool's
// (param_slots and grad_slots of the largest unit), tied or not, at every prefetch depth, with
// units kept from forward to backward or not — and training is bit-identical to the same run
// with everything on the device.
TEST(Offload, SlotsPerUnitKindShrinkTheWorkingSetAndChangeNoNumber) {
  for (bool tied : {false, true})
    for (int prefetch : {0, 1, 3})
      for (bool reshard : {true, false}) {
        Config c = base(Precision::bf16);  // bf16: parameter slots even on one rank
        c.model.vocab_size = 2048;          // embedding 96K elements, a block 18K
        c.model.tie_embeddings = tied;
        c.zero.prefetch = prefetch;
        c.zero.reshard_after_forward = reshard;
        c.offload.params = Tier::host;
        c.offload.grads = Tier::host;
        const std::string what = str(tied ? "tied" : "untied", ", zero.prefetch ", prefetch,
                                     reshard ? "" : ", reshard_after_forward = false");
        SCOPED_TRACE(what);
        PlanMachine m;
        m.device_capacity = 64ull << 30;
        m.ranks_here = world().size();
        const MemoryPlan plan = plan_memory(c, world().size(), m);
        auto gathered_rows = [](const MemoryPlan& p) {
          uint64_t b = 0;
          for (const auto& r : p.rows)
            if (r.what.rfind("gathered parameters", 0) == 0 || r.what.rfind("full gradients", 0) == 0)
              b += r.bytes;
          return b;
        };
        const uint64_t planned = gathered_rows(plan);
        const Placement pl = zero_options(c).placement;
        const LlamaModel model(c.model, world().size());
        // With several ranks a device that cannot address host memory (CUDA) also stages a bf16
        // shard per parameter slot before the all-gather; the CPU device gathers in place.
        PlanMachine gpu = m;
        gpu.device_is_host_memory = false;
        uint64_t staged = 0;
        if (world().size() > 1)
          for (const SlotClass& cl : param_slot_classes(model, pl))
            staged += uint64_t(cl.slots) * (cl.numel / uint64_t(world().size())) * 2;
        EXPECT_EQ(gathered_rows(plan_memory(c, world().size(), gpu)), planned + staged);
        uint64_t largest = 0;
        for (const auto& u : model.units()) largest = std::max<uint64_t>(largest, u.layout.padded_numel());
        const uint64_t dp = uint64_t(world().size());
        const uint64_t old_pool =
            uint64_t(pl.param_slots(model.num_units())) * (largest * 6 + (dp > 1 ? largest / dp * 2 : 0)) +
            (pl.aliased_grads(int(dp), true) ? 0 : uint64_t(pl.grad_slots()) * largest * 4);
        TrainerOptions opt;
        opt.progress = false;
        Trainer t(c, world(), opt);
        const ZeroMemory z = t.state_memory();
        EXPECT_EQ(z.gathered_bytes, planned);
        EXPECT_LT(z.gathered_bytes, old_pool);
        Result r;
        r.losses = t.train().losses;
        for (const auto& n : t.parameter_names()) r.weights.push_back(t.parameter(n));
        Config all = c;
        all.offload.params = Tier::device;
        all.offload.grads = Tier::device;
        all.zero.prefetch = 1;
        all.zero.reshard_after_forward = true;
        const Result ref = run(all);
        EXPECT_EQ(r.losses, ref.losses);
        EXPECT_TRUE(r.weights == ref.weights) << "final weights differ from the all-device run";
        if (world().rank() == 0 && prefetch == 1 && reshard)
          std::printf("[slots] %s: gathered %llu bytes per rank (one pool of the largest unit: %llu)\n",
                      what.c_str(), (unsigned long long)z.gathered_bytes, (unsigned long long)old_pool);
      }
}

// An update keeps the compute copy it writes to NVMe for the next forward's gather of that unit,
// which then reads nothing back: serially (every unit updated before the forward) exactly the
// first two units' copies each step from the second on, overlapped at least the first unit's.
// Every gathered byte was either read from NVMe or forwarded, and the numbers are those of the
// same run with the compute copy in host memory.
TEST(Offload, UpdatesKeepTheirComputeCopyForTheNextForward) {
  // serial; overlapped and clipped (the forward follows the updates); overlapped and unclipped
  // (the updates run during the backward, the last of them unit 0's)
  for (auto [overlap, clip] : {std::pair{false, 1.0f}, {true, 1.0f}, {true, 0.0f}}) {
    SCOPED_TRACE(str(overlap ? "overlapped" : "serial", " optimizer, grad_clip ", clip));
    Config c = base(Precision::bf16);
    c.train.steps = 3;
    c.train.grad_clip = clip;
    c.offload.params = Tier::nvme;
    c.offload.optimizer = Tier::host;
    c.offload.overlap_optimizer = overlap;
    c.offload.nvme_path = {nvme_dir("forward")};
    const LlamaModel model(c.model, world().size());
    ASSERT_EQ(pinned_staging(model, zero_options(c).placement, c.offload.pinned_mem_limit,
                             c.offload.prefetch)
                  .forward_shards,
              2);
    const uint64_t first = model.unit(0).layout.shard_numel() * 2;  // bf16
    const uint64_t second = model.unit(1).layout.shard_numel() * 2;
    const Result r = run(c);
    ASSERT_EQ(r.records.size(), size_t(c.train.steps));
    uint64_t read = 0, forwarded = 0, gathered = 0;
    for (const StepRecord& rec : r.records) {
      SCOPED_TRACE(str("step ", rec.step));
      if (rec.step == 1) EXPECT_EQ(rec.traffic.forwarded_bytes, 0u);
      else if (overlap) EXPECT_GE(rec.traffic.forwarded_bytes, first);
      else EXPECT_EQ(rec.traffic.forwarded_bytes, first + second);
      read += rec.traffic.nvme_read_bytes;  // the optimizer's states are in host memory
      forwarded += rec.traffic.forwarded_bytes;
      gathered += rec.traffic.h2d_bytes;
    }
    EXPECT_EQ(read + forwarded, gathered);
    Config host = c;
    host.offload.params = Tier::host;
    const Result ref = run(host);
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_TRUE(r.weights == ref.weights) << "final weights differ from the host-memory run";
  }
}

// bf16 with params and optimizer on NVMe: no compute copy is stored or written
// (Placement::param_rounds_master). The swap space holds the states alone; a step writes exactly
// the states of the units not kept in host memory, and reads them, the backward's master of
// every such unit and the forward's of every unit whose update kept no bf16 copy for it; the
// numbers are those of the same run with the compute copy in host memory.
TEST(Offload, Bf16ParamsOnNvmeAreRoundedFromTheMaster) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped optimizer" : "serial optimizer");
    Config c = base(Precision::bf16);
    c.train.steps = 3;
    c.offload.params = Tier::nvme;
    c.offload.optimizer = Tier::nvme;
    c.offload.overlap_optimizer = overlap;
    c.offload.optimizer_read_ahead = overlap ? 7 * c.offload.optimizer_chunk : 0;
    c.offload.nvme_path = {nvme_dir("rounded")};
    const LlamaModel model(c.model, world().size());
    const uint64_t first = model.unit(0).layout.shard_numel();
    c.offload.optimizer_host_bytes = first * 12 + 4096;  // unit 0's states in host memory
    uint64_t elems = 0;  // shard elements whose master is on NVMe
    for (int u = 1; u < model.num_units(); ++u) elems += model.unit(u).layout.shard_numel();
    TrainerOptions quiet;
    quiet.progress = false;
    EXPECT_EQ(Trainer(c, world(), quiet).state_memory().nvme_bytes, elems * 12)
        << "the swap space holds master, m and v alone";
    const Result r = run(c);
    ASSERT_EQ(r.records.size(), size_t(c.train.steps));
    uint64_t forwarded = 0, update_read = 0, written = 0;
    for (const StepRecord& rec : r.records) {
      SCOPED_TRACE(str("step ", rec.step));
      forwarded += rec.traffic.forwarded_bytes;
      if (rec.step == 1) continue;  // it also writes the initial states
      // Each gather of a unit on NVMe (a forward and a backward per micro-batch) reads its
      // master, 4 bytes an element, unless its update kept a bf16 copy (2 bytes an element) for
      // the forward; the rest is the updates'.
      const uint64_t gathers = 2 * uint64_t(c.train.grad_accum);
      const uint64_t gather_read = gathers * elems * 4 - 2 * rec.traffic.forwarded_bytes;
      if (!overlap) {
        EXPECT_EQ(rec.traffic.nvme_write_bytes, elems * 12);
        EXPECT_EQ(rec.traffic.nvme_read_bytes, elems * 12 + gather_read);
        continue;
      }
      ASSERT_GE(rec.traffic.nvme_read_bytes, gather_read);
      update_read += rec.traffic.nvme_read_bytes - gather_read;
      written += rec.traffic.nvme_write_bytes;
    }
    if (overlap) {
      // Overlapped, an update's reads and writes fall in the record of its own step (read
      // ahead during the backward, or begun before the record's end) or of the next one (the
      // next step's prepare waits for the rest), and the last one's may end after the last
      // record: records 2..n hold update 1 but what record 1 took, updates 2..n-1 whole, and
      // part of update n — each update's bytes once.
      const uint64_t n = r.records.size(), update = elems * 12;
      for (const uint64_t bytes : {update_read, written}) {
        EXPECT_GE(bytes, (n - 2) * update);
        EXPECT_LE(bytes, n * update);
      }
    }
    EXPECT_GT(forwarded, 0u) << "no update kept its bf16 copy for the forward";
    Config host = c;
    host.offload.params = Tier::host;
    const Result ref = run(host);
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_TRUE(r.weights == ref.weights) << "final weights differ from the host-memory run";
  }
}

// A compute copy kept for the next forward is its update's: a parameter written since
// (Trainer::set_parameter here; loading weights or a checkpoint writes the same way) replaces it,
// and the forward computes with the new values, as it does with the params in host memory.
TEST(Offload, AWrittenParameterReplacesItsKeptComputeCopy) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped optimizer" : "serial optimizer");
    std::vector<double> losses;
    for (Tier params : {Tier::nvme, Tier::host}) {
      Config c = base(Precision::bf16);
      c.train.steps = 2;
      c.offload.params = params;
      c.offload.optimizer = Tier::host;
      c.offload.overlap_optimizer = overlap;
      c.offload.nvme_path = {nvme_dir("rewrite")};
      TrainerOptions opt;
      opt.progress = false;
      uint64_t forwarded = 0;
      opt.on_step = [&](const StepRecord& r) { forwarded += r.traffic.forwarded_bytes; };
      Trainer t(c, world(), opt);
      t.train();
      if (params == Tier::nvme) {
        ASSERT_GT(forwarded, 0u) << "no update kept its compute copy";
      }
      // After the last step the first units' copies are still kept (no forward took them); the
      // embedding is unit 0's.
      const std::string name = t.parameter_names().front();
      std::vector<float> w = t.parameter(name);
      for (float& x : w) x = 0.5f - x;
      t.set_parameter(name, w);
      const int B = c.data.micro_batch, T = c.data.seq_len;
      std::vector<int32_t> inputs(size_t(B) * T), targets(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = int32_t((7 * i + 3) % size_t(c.model.vocab_size));
        targets[i] = int32_t((5 * i + 1) % size_t(c.model.vocab_size));
      }
      losses.push_back(t.forward_logits(inputs.data(), targets.data(), nullptr));
    }
    EXPECT_EQ(losses[0], losses[1]) << "the forward computed with a compute copy kept from before "
                                       "the parameter was written";
  }
}

// The overlap is real: with offload.overlap_optimizer the step returns while its update is still
// running, and the next step begins before the last unit is updated (the hook holds that update
// until it has, bounded); serially, the update of step k's last unit runs before step k + 1
// begins. The numbers are the same either way.
TEST(Offload, OverlappedUpdateRunsIntoTheNextStep) {
  // One micro-batch too: on one rank the backward then accumulates into the host gradient
  // shard itself, which the previous step's update zeroes (Placement::aliased_grads).
  for (int accum : {2, 1}) {
    Result serial;  // the last step's update shows only in its weights
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(str(overlap ? "overlapped" : "serial", " optimizer, grad_accum ", accum));
      Config c = base(Precision::bf16);
      c.train.grad_accum = accum;
      c.offload.optimizer = Tier::host;
      c.offload.params = Tier::host;
      c.offload.overlap_optimizer = overlap;
      const int last = LlamaModel(c.model, world().size()).num_units() - 1;
      auto hooks = std::make_shared<TestHooks>();
      HoldUpdateUntilNextStep hold(*hooks, last, c.train.steps, overlap);
      TrainerOptions opt;
      opt.test_hooks = hooks;
      const Result r = run(c, opt);
      if (overlap) {
        EXPECT_EQ(hold.begun_at, (std::vector<int64_t>{2, 3, 3}));
        expect_serial_order(r, serial);
      } else {
        EXPECT_EQ(hold.begun_at, (std::vector<int64_t>{1, 2, 3}));
        serial = r;
      }
    }
  }
}

// Without clipping the updates run during the backward: in the step's last backward, once unit
// 0's gradient is reduced, the updates of the last two units have begun (the hook waits for
// that, bounded: with clipping it would wait out its 30 s, since the updates start only after
// the norm). The losses, the logged gradient norms and the weights are those of the serial
// order.
TEST(Offload, UnclippedUpdatesRunDuringTheBackward) {
  // One micro-batch too: on one rank the updates then read the host gradient shard the
  // backward accumulated into (Placement::aliased_grads).
  for (int accum : {2, 1}) {
    Result serial;
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(str(overlap ? "updates in the backward" : "serial optimizer", ", grad_accum ", accum));
      Config c = base(Precision::bf16);
      c.train.grad_accum = accum;
      c.train.grad_clip = 0;
      c.offload.optimizer = Tier::nvme;
      c.offload.params = Tier::host;
      c.offload.nvme_path = {nvme_dir("unclipped")};
      c.offload.overlap_optimizer = overlap;
      const int last = LlamaModel(c.model, world().size()).num_units() - 1;
      ASSERT_GE(last, 2);
      std::mutex mu;
      std::condition_variable cv;
      std::set<int> updating;  // units whose update has begun in the current step
      int reductions_of_0 = 0;
      std::vector<bool> overlapped_at_end;  // per step: the hook saw the updates in the backward
      auto hooks = std::make_shared<TestHooks>();
      hooks->before_step = [&](int64_t) {
        std::lock_guard<std::mutex> lock(mu);
        updating.clear();  // the previous step's (serially, they ran after its backward)
      };
      hooks->before_unit_update = [&](int u) {
        std::lock_guard<std::mutex> lock(mu);
        updating.insert(u);
        cv.notify_all();
      };
      hooks->after_reduce_grad = [&](int u) {
        if (u != 0 || ++reductions_of_0 % c.train.grad_accum != 0) return;  // the step's last backward
        std::unique_lock<std::mutex> lock(mu);
        if (overlap)
          cv.wait_for(lock, std::chrono::seconds(30), [&] { return updating.count(last) && updating.count(last - 1); });
        overlapped_at_end.push_back(updating.count(last) && updating.count(last - 1));
      };
      TrainerOptions opt;
      opt.test_hooks = hooks;
      const Result r = run(c, opt);
      ASSERT_EQ(r.records.size(), size_t(c.train.steps));
      EXPECT_EQ(overlapped_at_end, std::vector<bool>(size_t(c.train.steps), overlap));
      if (!overlap) serial = r;
      else expect_serial_order(r, serial);
    }
  }
}

// Unclipped, a unit the worker has not updated by the end of the backward does not hold the
// next step back: grad_norm() sums that unit's squares itself, the next step begins, and its
// forward waits for that unit's update alone. The hook holds one unit's update until the next
// step has begun (bounded; were the norm or the step to wait for the whole update, it would wait
// out its 30 s and see the old step). The numbers are the serial order's.
TEST(Offload, UnclippedUpdateLateForTheBackwardRunsIntoTheNextForward) {
  Result serial;
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "updates in the backward" : "serial optimizer");
    Config c = base(Precision::fp32);
    c.train.grad_clip = 0;
    c.offload.optimizer = Tier::nvme;
    c.offload.params = Tier::nvme;
    c.offload.nvme_path = {nvme_dir("unclipped_late")};
    c.offload.overlap_optimizer = overlap;
    const int held = LlamaModel(c.model, world().size()).num_units() - 2;  // the last block
    auto hooks = std::make_shared<TestHooks>();
    HoldUpdateUntilNextStep hold(*hooks, held, c.train.steps, overlap);
    TrainerOptions opt;
    opt.test_hooks = hooks;
    const Result r = run(c, opt);
    ASSERT_EQ(r.records.size(), size_t(c.train.steps));
    if (!overlap) {
      EXPECT_EQ(hold.begun_at, (std::vector<int64_t>{1, 2, 3}));
      serial = r;
      continue;
    }
    EXPECT_EQ(hold.begun_at, (std::vector<int64_t>{2, 3, 3}));
    expect_serial_order(r, serial);
  }
}

// Clipped and overlapped, with the compute copy on NVMe read two units ahead: the next step's
// forward computes unit u while the update of unit u+1 (and later) is still running — neither
// the NVMe reads ahead nor the look-ahead gathers (zero.prefetch 1 and 2) wait for it, with one
// rank or several. The hook holds the last block's update until the next step's forward of the
// block before it has run on the compute stream (bounded: were a look-ahead to wait for the held
// update before that forward was enqueued, it would never run and the hook would wait out its
// 20 s). The numbers are the serial order's.
TEST(Offload, NextForwardWaitsOnlyForTheUnitItComputes) {
  for (int zero_prefetch : {1, 2}) {
    Result serial;
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(str("zero.prefetch ", zero_prefetch,
                       overlap ? ", overlapped" : ", serial optimizer"));
      Config c = base(Precision::bf16);
      ASSERT_GT(c.train.grad_clip, 0.0);
      c.offload.optimizer = Tier::nvme;
      c.offload.params = Tier::nvme;
      c.offload.nvme_path = {nvme_dir("forward_waits")};
      c.offload.prefetch = 2;
      c.zero.prefetch = zero_prefetch;
      c.offload.overlap_optimizer = overlap;
      const int held = LlamaModel(c.model, world().size()).num_units() - 2;  // the last block
      ASSERT_GE(held, 2);
      std::mutex mu;
      std::condition_variable cv;
      int64_t begun = 0, updates = 0, computed_before = 0;  // the step that last computed held − 1
      std::vector<bool> in_time;  // per held update but the last: the next step computed held − 1
      auto hooks = std::make_shared<TestHooks>();
      hooks->before_step = [&](int64_t step) {
        std::lock_guard<std::mutex> lock(mu);
        begun = step;
      };
      hooks->after_forward = [&](int u, std::span<const float>) {
        if (u != held - 1) return;
        std::lock_guard<std::mutex> lock(mu);
        computed_before = begun;
        cv.notify_all();
      };
      hooks->before_unit_update = [&](int u) {
        if (u != held || !overlap) return;
        std::unique_lock<std::mutex> lock(mu);
        if (++updates < c.train.steps)  // no step follows the last
          in_time.push_back(
              cv.wait_for(lock, std::chrono::seconds(20),
                          [&] { return computed_before > updates; }));
      };
      TrainerOptions opt;
      opt.test_hooks = hooks;
      const Result r = run(c, opt);
      if (!overlap) {
        serial = r;
        continue;
      }
      EXPECT_EQ(in_time, std::vector<bool>(size_t(c.train.steps - 1), true));
      expect_serial_order(r, serial);
    }
  }
}

// The run's end waits for the last step's overlapped update by joining the step's worker; that
// join is a watched wait like every other (a failed worker drains its I/O ticket by ticket, each
// with a fresh parallel.timeout). The worker holds the last step's update of the head until the
// watchdog's report names the join (bounded: 5 s), then lets it go.
TEST(Offload, TheRunsEndWaitsForTheLastUpdateUnderTheWatchdog) {
  Config c = base(Precision::bf16);
  c.train.steps = 2;
  c.offload.optimizer = Tier::host;
  ASSERT_TRUE(c.offload.overlap_optimizer);
  const int head = LlamaModel(c.model, world().size()).num_units() - 1;
  const std::string want = "the optimizer step's worker finishing its updates";
  int updates = 0;
  std::string report;
  auto hooks = std::make_shared<TestHooks>();
  hooks->before_unit_update = [&](int u) {  // the worker's thread
    if (u != head || ++updates < c.train.steps) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (report.find(want) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      report = watchdog_report_now(0);
    }
  };
  TrainerOptions opt;
  opt.test_hooks = hooks;
  run(c, opt);
  EXPECT_EQ(updates, c.train.steps);
  EXPECT_NE(report.find(want), std::string::npos)
      << "no watched wait while the run's end waited for the last update; the report:\n" << report;
}

// offload.optimizer_read_ahead, clipped: during the step's last backward, before the norm is
// known, the worker reads the states' first chunks ahead — exactly as many whole chunks as the
// budget holds (two here), no more — and the step reports them. The hook at the end of that
// backward waits for them (bounded), then gives a third chunk time to appear. A budget that holds
// no whole chunk is refused, naming the key.
TEST(Offload, ReadAheadFillsItsBudgetBeforeTheNorm) {
  Config c = base(Precision::bf16);
  c.offload.optimizer = Tier::nvme;
  c.offload.params = Tier::host;
  c.offload.nvme_path = {nvme_dir("read_ahead")};
  c.offload.optimizer_read_ahead = 2 * 3 * c.offload.optimizer_chunk + 5;  // 6 buffers and change
  // The first two chunks in forward order (a unit may be shorter than a chunk), 12 bytes each
  // element: f32 master, m, v.
  uint64_t want = 0;
  {
    const LlamaModel model(c.model, world().size());
    const uint64_t chunk = c.offload.optimizer_chunk / 4;
    int chunks = 0;
    for (const auto& u : model.units())
      for (uint64_t lo = 0; lo < u.layout.shard_numel() && chunks < 2; lo += chunk, ++chunks)
        want += std::min<uint64_t>(chunk, u.layout.shard_numel() - lo) * 12;
    ASSERT_EQ(chunks, 2);
  }
  std::mutex mu;
  std::condition_variable cv;
  uint64_t ahead = 0;
  int reductions_of_0 = 0;
  std::vector<uint64_t> at_norm;  // per step: the bytes read ahead when its last backward ended
  auto hooks = std::make_shared<TestHooks>();
  hooks->after_read_ahead = [&](int, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    ahead += bytes;
    cv.notify_all();
  };
  hooks->after_reduce_grad = [&](int u) {
    if (u != 0) return;
    std::unique_lock<std::mutex> lock(mu);
    // The first micro-batch's backward: the previous step's worker has updated every unit (this
    // step's forward waited for each), so all it read ahead is counted; this step's starts later.
    if (++reductions_of_0 % c.train.grad_accum != 0) {
      ahead = 0;
      return;
    }
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return ahead >= want; });
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a third chunk would be read by now
    lock.lock();
    at_norm.push_back(ahead);
  };
  TrainerOptions opt;
  opt.test_hooks = hooks;
  const std::vector<StepRecord> records = run(c, opt).records;
  EXPECT_EQ(at_norm, std::vector<uint64_t>(size_t(c.train.steps), want));
  ASSERT_EQ(records.size(), size_t(c.train.steps));
  for (const StepRecord& r : records)
    EXPECT_GE(r.traffic.read_ahead_bytes, want) << "step " << r.step;

  c.offload.optimizer_read_ahead = 3 * c.offload.optimizer_chunk - 1;
  // (the plan refuses it before the engine would: "holds no whole chunk")
  EXPECT_ERROR_HAS(run(c), "[train::plan]", "a whole chunk of master, m and v", "needs 48K",
                   "offload.optimizer_read_ahead allows");
}

// offload.optimizer_host_bytes: the kept units' states never touch NVMe — each step reads and
// writes exactly the other units' master, m and v (params in host memory: nothing else is on
// NVMe; counted in the serial order, where a step's update is inside its own record) — and
// read-ahead begins at the first unit on NVMe. With every unit kept nothing moves through NVMe,
// a read-ahead budget is then not an error (nothing is left to read ahead), and no pinned
// staging is allocated for the optimizer (params in host memory: none at all).
TEST(Offload, KeptStatesLeaveTheDiskAndReadAheadStartsAfterThem) {
  Config c = base(Precision::bf16);
  c.offload.optimizer = Tier::nvme;
  c.offload.params = Tier::host;
  c.offload.nvme_path = {nvme_dir("kept")};
  c.offload.optimizer_read_ahead = 3 * c.offload.optimizer_chunk;  // one chunk
  const LlamaModel model(c.model, world().size());
  uint64_t all = 0, first_two = 0;
  for (int u = 0; u < model.num_units(); ++u) {
    all += model.unit(u).layout.shard_numel() * 12;  // f32 master, m, v
    if (u < 2) first_two += model.unit(u).layout.shard_numel() * 12;
  }
  c.offload.optimizer_host_bytes = first_two;
  std::mutex mu;
  std::set<int> read_ahead_units;
  auto hooks = std::make_shared<TestHooks>();
  hooks->after_read_ahead = [&](int u, uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    read_ahead_units.insert(u);
  };
  TrainerOptions opt;
  opt.test_hooks = hooks;
  run(c, opt);
  ASSERT_FALSE(read_ahead_units.empty());
  EXPECT_EQ(*read_ahead_units.begin(), 2) << "read-ahead must skip the kept units";
  Config serial = c;
  serial.offload.overlap_optimizer = false;
  std::vector<StepRecord> records = run(serial, opt).records;
  ASSERT_EQ(records.size(), size_t(c.train.steps));
  for (const StepRecord& r : records) {  // step 1 also writes the initial states
    EXPECT_EQ(r.traffic.nvme_read_bytes, all - first_two) << "step " << r.step;
    EXPECT_EQ(r.traffic.nvme_write_bytes, (r.step == 1 ? 2 : 1) * (all - first_two))
        << "step " << r.step;
  }

  c.offload.optimizer_host_bytes = all;  // every unit
  {
    TrainerOptions quiet;
    quiet.progress = false;
    EXPECT_EQ(Trainer(c, world(), quiet).state_memory().pinned_bytes, 0u);
  }
  read_ahead_units.clear();
  records = run(c, opt).records;
  ASSERT_EQ(records.size(), size_t(c.train.steps));
  for (const StepRecord& r : records) {
    EXPECT_EQ(r.traffic.nvme_read_bytes, 0u) << "step " << r.step;
    EXPECT_EQ(r.traffic.nvme_write_bytes, 0u) << "step " << r.step;
  }
  EXPECT_TRUE(read_ahead_units.empty());
}

// A clipped, overlapped step whose first units' states are kept in memory
// (offload.optimizer_host_bytes): a second worker updates those beside the first worker, which
// goes straight to the first unit on NVMe, so the disk's share of the step starts at go — not
// behind the kept updates. The hook holds unit 0's update, in every step, until the update of
// unit 2 (the first on NVMe) has begun (bounded: 20 s; were one thread to step the units in
// order, it would wait that out and see nothing). Gradients in host memory and on NVMe, one rank
// or several; the numbers are the serial order's.
TEST(Offload, KeptUnitsUpdateBesideTheFirstUnitOnNvme) {
  for (Tier grads : {Tier::host, Tier::nvme}) {
    Result serial;
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(str("gradients on ", name(grads), overlap ? ", overlapped" : ", serial"));
      Config c = base(Precision::bf16);
      ASSERT_GT(c.train.grad_clip, 0.0);
      c.offload.optimizer = Tier::nvme;
      c.offload.params = Tier::nvme;
      c.offload.grads = grads;
      if (grads == Tier::nvme) c.train.grad_accum = 1;
      c.offload.nvme_path = {nvme_dir("kept_beside")};
      c.offload.overlap_optimizer = overlap;
      const LlamaModel model(c.model, world().size());
      ASSERT_GE(model.num_units(), 4);
      c.offload.optimizer_host_bytes =
          (model.unit(0).layout.shard_numel() + model.unit(1).layout.shard_numel()) * 12;
      std::mutex mu;
      std::condition_variable cv;
      int64_t began_0 = 0, began_2 = 0;
      std::vector<bool> beside;  // per step: unit 2's update began while unit 0's was held
      auto hooks = std::make_shared<TestHooks>();
      hooks->before_unit_update = [&](int u) {
        if (!overlap || (u != 0 && u != 2)) return;
        std::unique_lock<std::mutex> lock(mu);
        if (u == 2) {
          ++began_2;
          cv.notify_all();
          return;
        }
        ++began_0;
        beside.push_back(
            cv.wait_for(lock, std::chrono::seconds(20), [&] { return began_2 >= began_0; }));
      };
      TrainerOptions opt;
      opt.test_hooks = hooks;
      const Result r = run(c, opt);
      ASSERT_EQ(r.records.size(), size_t(c.train.steps));
      if (!overlap) {
        serial = r;
        continue;
      }
      EXPECT_EQ(beside, std::vector<bool>(size_t(c.train.steps), true));
      expect_serial_order(r, serial);
    }
  }
}

// offload.grads = nvme: every gradient but the kept units' is written once during the backward
// and read once by its update, and host memory holds none of them — serial and overlapped
// alike. (That the numbers do not change is EveryPlacementIsBitIdenticalToAllDevice's.)
TEST(Offload, GradientsOnNvmeAreWrittenOnceAndReadOnce) {
  Config c = base(Precision::fp32);
  c.train.grad_accum = 1;
  c.offload.optimizer = Tier::nvme;
  c.offload.params = Tier::host;
  c.offload.grads = Tier::nvme;
  c.offload.nvme_path = {nvme_dir("grads")};
  const LlamaModel model(c.model, world().size());
  uint64_t states = 0, grads = 0, first = 0;
  for (int u = 0; u < model.num_units(); ++u) {
    const uint64_t n = model.unit(u).layout.shard_numel();
    if (u == 0) first = n;
    else states += n * 12, grads += n * 4;  // f32 master, m, v; f32 gradient
  }
  c.offload.optimizer_host_bytes = first * 12;  // unit 0's states, and so its gradient, kept
  TrainerOptions quiet;
  quiet.progress = false;
  Config host = c;
  host.offload.grads = Tier::host;
  const ZeroMemory on_nvme = Trainer(c, world(), quiet).state_memory();
  const ZeroMemory in_ram = Trainer(host, world(), quiet).state_memory();
  EXPECT_EQ(on_nvme.host_bytes + grads, in_ram.host_bytes);
  EXPECT_EQ(on_nvme.nvme_bytes, in_ram.nvme_bytes + grads);
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "serial");
    c.offload.overlap_optimizer = overlap;
    const std::vector<StepRecord> records = run(c).records;
    ASSERT_EQ(records.size(), size_t(c.train.steps));
    // Step 1 also writes the initial states.
    if (!overlap) {
      for (const StepRecord& r : records) {
        EXPECT_EQ(r.traffic.nvme_read_bytes, states + grads) << "step " << r.step;
        EXPECT_EQ(r.traffic.nvme_write_bytes, (r.step == 1 ? 2 * states : states) + grads)
            << "step " << r.step;
      }
      continue;
    }
    // Overlapped, an update's bytes fall in the record of the step that ran it or of the next
    // (its worker reads the first chunks during the backward, the rest after the norm, beside
    // the record's end), and the last step's update may end after the last record. Every other
    // update has ended inside them (the next step's prepare waits for it), once: so the records
    // hold n - 1 or n updates and every backward's gradients, no more.
    const uint64_t n = records.size();
    uint64_t read = 0, written = 0, read_before_last = 0;
    for (const StepRecord& r : records) {
      read += r.traffic.nvme_read_bytes;
      written += r.traffic.nvme_write_bytes;
      if (uint64_t(r.step) < n) read_before_last += r.traffic.nvme_read_bytes;
    }
    EXPECT_GE(read, (n - 1) * (states + grads));
    EXPECT_LE(read, n * (states + grads));
    EXPECT_LE(read_before_last, (n - 1) * (states + grads));
    EXPECT_GE(written, states + n * grads + (n - 1) * states);
    EXPECT_LE(written, states + n * grads + n * states);
  }
}

// A gradient acquired and never reduced is the caller's protocol error, named by the next
// optimizer step before it touches anything — with gradients on NVMe too, where one rank's
// backward accumulates into a staging buffer instead of a gradient slot (several ranks: a slot;
// one rank with gradients in host memory accumulates into the shard itself, and holds nothing).
TEST(Offload, AGradientAcquiredAndNeverReducedStopsTheStep) {
  for (const Tier grads : {Tier::host, Tier::nvme}) {
    if (grads == Tier::host && world().size() == 1) continue;
    SCOPED_TRACE(str("gradients on ", name(grads)));
    Config c = base(Precision::fp32);
    c.train.grad_accum = 1;
    c.offload.optimizer = Tier::nvme;
    c.offload.params = Tier::host;
    c.offload.grads = grads;
    c.offload.nvme_path = {nvme_dir("unreduced")};
    const LlamaModel model(c.model, world().size());
    auto device = make_device(DeviceKind::cpu);
    auto compute = device->make_stream("compute");
    auto comm = device->make_stream("comm");
    auto reduce = device->make_stream("reduce");
    ZeroEngine zero(model, *device, world(), *compute, *comm, *reduce, zero_options(c));
    zero.acquire_grad(1);
    EXPECT_ERROR_HAS(zero.optimizer_step(AdamWHyper{}, 1, 1.0f, true), "[zero::schedule]",
                     "unit 1", "optimizer_step while the unit's gradient was acquired and never "
                     "reduced");
  }
}

// A tied embedding's gradient is acquired at the head and reduced at the embedding, the last of
// the backward: on NVMe its staging buffer is held that long, beside the others'. Bit-identical
// to the all-device run, clipped and unclipped.
TEST(Offload, TiedEmbeddingGradientOnNvmeIsHeldThroughTheBackward) {
  for (const float clip : {1.0f, 0.0f}) {
    Config all = base(Precision::bf16);
    all.train.grad_accum = 1;
    all.train.grad_clip = clip;
    all.model.tie_embeddings = true;
    Config c = all;
    c.offload.optimizer = c.offload.params = c.offload.grads = Tier::nvme;
    c.offload.nvme_path = {nvme_dir("tied_grads")};
    SCOPED_TRACE(str("grad_clip ", clip));
    const Result want = run(all), got = run(c);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_TRUE(got.weights == want.weights) << "final weights differ";
  }
}

// Serial: the error stops the step it happens in. Overlapped (offload.overlap_optimizer): step
// 2's update runs behind its end, so step 2 has reported (its metrics line is written) when the
// error surfaces in step 3's forward, the first pass that needs the unit it did not update; no
// later step completes.
TEST(Offload, IoErrorMidStepStopsTheRun) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped optimizer" : "serial optimizer");
    Config c = base(Precision::fp32);
    c.offload.overlap_optimizer = overlap;
    c.train.steps = 4;
    c.offload.optimizer = Tier::nvme;
    c.offload.nvme_path = {nvme_dir("fault")};
    c.log.every = 1;
    c.log.metrics = std::string(STRATA_TEST_WORK_DIR) + "/fault_metrics_" + std::to_string(overlap) +
                    "_r" + std::to_string(world().rank()) + ".jsonl";
    // Calibrate: the optimizer step is the only reader of the NVMe optimizer states, one read per
    // 16K chunk per array; fail a read half-way through the second step.
    uint64_t step_read_bytes = 0;
    {
      Config quiet = c;
      quiet.log.metrics.clear();
      quiet.train.steps = 1;
      quiet.offload.overlap_optimizer = false;  // every read of the step inside its record
      TrainerOptions cal;
      cal.on_step = [&](const StepRecord& r) { step_read_bytes = r.traffic.nvme_read_bytes; };
      run(quiet, cal);
    }
    const int reads_per_step = int(step_read_bytes / c.offload.optimizer_chunk);
    ASSERT_GT(reads_per_step, 4);
    TrainerOptions opt;
    FaultRule rule;
    rule.fault = Fault::io_error;
    rule.op = int(IoOp::read);
    rule.skip = reads_per_step + reads_per_step / 2;
    rule.times = 1;
    auto hooks = std::make_shared<TestHooks>();
    hooks->io_faults = {rule};
    opt.test_hooks = hooks;
    int steps_done = 0;
    opt.on_step = [&](const StepRecord&) { ++steps_done; };
    try {
      run(c, opt);
      FAIL() << "the injected I/O error was not reported";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("strata-"), std::string::npos) << "the error names the swap file: " << m;
      EXPECT_NE(m.find("offset"), std::string::npos) << m;
    }
    EXPECT_EQ(steps_done, overlap ? 2 : 1);  // no step after the error completed
    // Metrics record only the steps that completed, none after the failure.
    if (world().rank() == 0) {
      std::ifstream in(c.log.metrics);
      int lines = 0;
      for (std::string l; std::getline(in, l);) ++lines;
      EXPECT_EQ(lines, steps_done);
    }
  }
}
