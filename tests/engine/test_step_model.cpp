// The step model and the placement choice behind offload.* = "auto" (engine/step_model.h), and
// the rate cache (engine/rate_cache.h). No hardware is probed: the rates are injected, and the
// machine (device size, RAM) is a PlanMachine the test sets.
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/statfs.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/rate_cache.h"
#include "engine/step_model.h"
#include "engine/zero.h"
#include "offload/swap_space.h"
#include "tests/engine/test_util.h"

using namespace strata;
using strata::test::scratch_dir;
using strata::test::write_bytes;

namespace {

// Rates of a made-up GPU machine: fast device, slower copies, slower disks.
MachineRates rates() {
  MachineRates r;
  r.device = "test gpu";
  r.nvme = "259:1 /mnt (ext4)";
  r.gemm_flops = 100e9;
  r.attention_flops = 100e9;
  r.adam_gbps = 10;
  r.adam_bf16_gbps = 8;
  r.norm_gbps = 40;
  r.device_mem_gbps = 1000;
  r.h2d_gbps = 20;
  r.d2h_gbps = 20;
  r.nvme_read_gbps = 2;
  r.nvme_write_gbps = 1.5;
  r.nvme_read_busy_gbps = 2;  // as fast beside compute: the tests below that need slower set it
  r.nvme_write_busy_gbps = 1.5;
  r.cpu_threads = 2;
  r.measured_at = "2026-12-01T17:00:00Z";
  return r;
}

PlanMachine gpu_machine(uint64_t device_bytes = 64ull << 30) {
  PlanMachine m;
  m.device_is_host_memory = false;
  m.device_capacity = device_bytes;
  m.host_memory = 512ull << 30;
  m.ranks_here = 1;
  return m;
}

// The same machine whose device is the CPU's own memory (the CPU device).
PlanMachine cpu_machine() {
  PlanMachine m = gpu_machine();
  m.device_is_host_memory = true;
  return m;
}

Config small(const std::string& nvme_dir) {
  Config c;
  c.model.dim = 128;
  c.model.n_layers = 4;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.ffn_dim = 384;
  c.data.seq_len = 64;
  c.data.micro_batch = 2;
  if (!nvme_dir.empty()) c.offload.nvme_path = {nvme_dir};
  return c;
}

Config placed(Config c, Tier params, Tier optimizer) {
  c.offload.params = params;
  c.offload.optimizer = optimizer;
  c.offload.grads = optimizer == Tier::device ? Tier::device : Tier::host;
  return c;
}

// Calls fn(config, params, overlap) for every order an NVMe optimizer runs in on the small model:
// params on the host or NVMe, clipped or not, overlapped or serial — each under a SCOPED_TRACE.
template <class Fn>
void for_each_nvme_optimizer_order(const std::string& dir, Fn fn) {
  for (Tier params : {Tier::host, Tier::nvme})
    for (float clip : {1.0f, 0.0f})
      for (bool overlap : {false, true}) {
        Config c = placed(small(dir), params, Tier::nvme);
        c.train.grad_clip = clip;
        c.offload.overlap_optimizer = overlap;
        SCOPED_TRACE(str("params ", tier_name(params), " clip ", clip, " overlap ", overlap));
        fn(c, params, overlap);
      }
}

}  // namespace

TEST(StepModel, PicksAllDeviceWhenItFits) {
  Config c = small(scratch_dir());
  c.offload.params.automatic = c.offload.grads.automatic = c.offload.optimizer.automatic = true;
  const AutoPlan plan = plan_placements(c, 1, gpu_machine(), rates());
  // params × optimizer over 3 tiers, grads device|host with the optimizer on the device, and
  // params off the device only with the optimizer off it (a GPU): 2 + 2·3 = 8 candidates; and
  // with 512G of RAM, each of the 3 NVMe optimizer placements has a twin keeping states there;
  // with one micro-batch a step, each of the 3 again with gradients on NVMe, and its twin.
  EXPECT_EQ(plan.candidates.size(), 8u + 3u + 3u * 2u);
  const PlacementCandidate& k = chosen_placement(plan);
  EXPECT_EQ(k.params, Tier::device);
  EXPECT_EQ(k.grads, Tier::device);
  EXPECT_EQ(k.optimizer, Tier::device);
  EXPECT_EQ(k.prediction.bottleneck, "compute");
  const Config resolved = with_placement(c, k);
  EXPECT_FALSE(resolved.offload.any_auto());
  EXPECT_NO_THROW(zero_options(resolved));
}

TEST(StepModel, OffloadsWhenTheDeviceIsSmall) {
  Config c = small(scratch_dir());
  c.offload.params.automatic = c.offload.grads.automatic = c.offload.optimizer.automatic = true;
  const AutoPlan roomy = plan_placements(c, 1, gpu_machine(), rates());
  const uint64_t all_device = roomy.candidates.front().device_bytes;
  ASSERT_GT(all_device, 0u);
  c.offload.device_mem_limit = all_device - 1;  // the all-device run no longer fits
  const AutoPlan plan = plan_placements(c, 1, gpu_machine(), rates());
  EXPECT_FALSE(plan.candidates.front().fits);
  const PlacementCandidate& k = chosen_placement(plan);
  EXPECT_TRUE(k.params != Tier::device || k.grads != Tier::device || k.optimizer != Tier::device) << k.name();
  EXPECT_LE(k.device_bytes, c.offload.device_mem_limit);
  // The fastest of those that fit.
  for (const auto& o : plan.candidates) {
    if (o.fits) {
      EXPECT_LE(k.prediction.step_ms, o.prediction.step_ms) << o.name();
    }
  }
  // Smaller than every placement that keeps the optimizer on the device: it goes off.
  uint64_t smallest = ~0ull;
  for (const auto& o : roomy.candidates)
    if (o.optimizer == Tier::device) smallest = std::min(smallest, o.device_bytes);
  c.offload.device_mem_limit = smallest - 1;
  const AutoPlan tight = plan_placements(c, 1, gpu_machine(), rates());
  const PlacementCandidate& off = chosen_placement(tight);
  EXPECT_NE(off.optimizer, Tier::device) << off.name();
  EXPECT_EQ(off.grads, Tier::host) << off.name();
}

TEST(StepModel, KeepsTheTiersThatAreNotAuto) {
  Config c = small(scratch_dir());
  c.offload.params = Tier::host;
  c.offload.optimizer.automatic = true;
  c.offload.grads.automatic = true;
  const AutoPlan plan = plan_placements(c, 1, gpu_machine(), rates());
  ASSERT_FALSE(plan.candidates.empty());
  for (const auto& k : plan.candidates) EXPECT_EQ(k.params, Tier::host) << k.name();
  // grads left at its default (device) still lets the optimizer go off the device: the
  // gradients then live in host memory anyway.
  Config d = small(scratch_dir());
  d.offload.optimizer.automatic = true;
  d.offload.device_mem_limit = plan_placements(d, 1, gpu_machine(), rates()).candidates.front().device_bytes - 1;
  const AutoPlan off = plan_placements(d, 1, gpu_machine(), rates());
  const PlacementCandidate& k = chosen_placement(off);
  EXPECT_NE(k.optimizer, Tier::device) << k.name();
  EXPECT_EQ(k.grads, Tier::host) << k.name();
}

// offload.optimizer = "auto": each NVMe optimizer candidate has a twin that keeps the first units'
// states in the RAM the plan leaves free under kKeptShareOfRam; the twin moves fewer bytes, is
// predicted faster, and resolves to a config with that offload.optimizer_host_bytes. No twin
// for a fixed optimizer tier, a user's own optimizer_host_bytes, or RAM with no room left.
TEST(StepModel, AutoOptimizerKeepsStatesInTheRamLeftFree) {
  Config c = small(scratch_dir());
  c.offload.optimizer.automatic = true;
  c.offload.grads.automatic = true;
  PlacementCandidate plain;
  plain.params = Tier::device, plain.grads = Tier::host, plain.optimizer = Tier::nvme;
  const MemoryPlan base = plan_memory(with_placement(c, plain), 1, gpu_machine());
  const LlamaModel model(c.model, 1);
  uint64_t states = 0;  // master, m and v of every unit
  for (const auto& u : model.units()) states += u.layout.shard_numel() * 12;
  PlanMachine machine = gpu_machine();
  machine.host_memory = uint64_t(double(base.host_need + states / 2) / kKeptShareOfRam) + 1;
  const AutoPlan plan = plan_placements(c, 1, machine, rates());
  const PlacementCandidate* twin = nullptr;
  const PlacementCandidate* nvme = nullptr;
  for (const auto& k : plan.candidates) {
    if (k.params != Tier::device || k.grads != Tier::host || k.optimizer != Tier::nvme) continue;
    (k.optimizer_host_bytes ? twin : nvme) = &k;
  }
  ASSERT_NE(nvme, nullptr);
  ASSERT_NE(twin, nullptr);
  const uint64_t room = uint64_t(kKeptShareOfRam * double(machine.host_memory)) - base.host_need;
  EXPECT_EQ(twin->optimizer_host_bytes, room);
  EXPECT_NEAR(double(room), double(states / 2), 2.0);
  EXPECT_TRUE(twin->fits) << twin->why_not;
  EXPECT_LT(twin->nvme_bytes, nvme->nvme_bytes);
  EXPECT_GT(twin->host_bytes, nvme->host_bytes);
  EXPECT_LT(twin->prediction.step_ms, nvme->prediction.step_ms);
  EXPECT_LT(twin->prediction.bytes.nvme_read, nvme->prediction.bytes.nvme_read);
  const Config resolved = with_placement(c, *twin);
  EXPECT_EQ(resolved.offload.optimizer_host_bytes, room);
  const MemoryPlan kept = plan_memory(resolved, 1, machine);
  EXPECT_LE(kept.host_need, uint64_t(kKeptShareOfRam * double(machine.host_memory)));
  EXPECT_NE(twin->name().find("optimizer_host_bytes="), std::string::npos) << twin->name();
  EXPECT_EQ(with_placement(c, *nvme).offload.optimizer_host_bytes, 0u);

  auto twins = [&](const Config& cfg, const PlanMachine& m) {
    int n = 0;
    for (const auto& k : plan_placements(cfg, 1, m, rates()).candidates)
      n += k.optimizer == Tier::nvme && k.optimizer_host_bytes != 0;
    return n;
  };
  EXPECT_GT(twins(c, machine), 0);
  Config fixed = c;  // the user chose NVMe: nothing kept unless they say so
  fixed.offload.optimizer = Tier::nvme;
  fixed.offload.params.automatic = true;
  EXPECT_EQ(twins(fixed, machine), 0);
  Config own = c;  // the user's own budget: every NVMe candidate carries it, no twin
  own.offload.optimizer_host_bytes = 12345;
  for (const auto& k : plan_placements(own, 1, machine, rates()).candidates)
    EXPECT_EQ(k.optimizer_host_bytes, k.optimizer == Tier::nvme ? 12345u : 0u) << k.name();
  PlanMachine full = machine;  // no room beside the plan
  full.host_memory = uint64_t(double(base.host_need) / kKeptShareOfRam);
  EXPECT_EQ(twins(c, full), 0);
}

// With a read-ahead budget, a second twin keeps the read-ahead's memory's states as well: more
// bytes kept, fewer written, offload.optimizer_read_ahead = 0 in its config and its name. None
// without a budget, or with the optimizer not overlapped (nothing reads ahead then).
TEST(StepModel, AutoOptimizerWeighsTheReadAheadAgainstKeepingItsMemory) {
  Config c = small(scratch_dir());
  c.offload.optimizer.automatic = true;
  c.offload.grads.automatic = true;
  c.offload.optimizer_read_ahead = 4ull << 20;
  PlanMachine machine = gpu_machine();
  PlacementCandidate plain;
  plain.params = Tier::device, plain.grads = Tier::host, plain.optimizer = Tier::nvme;
  const MemoryPlan base = plan_memory(with_placement(c, plain), 1, machine);
  const LlamaModel model(c.model, 1);
  uint64_t states = 0;
  for (const auto& u : model.units()) states += u.layout.shard_numel() * 12;
  machine.host_memory = uint64_t(double(base.host_need + states / 2) / kKeptShareOfRam) + 1;
  auto twins_of = [&](const Config& cfg) {
    std::vector<PlacementCandidate> out;
    for (const auto& k : plan_placements(cfg, 1, machine, rates()).candidates)
      if (k.params == Tier::device && k.grads == Tier::host && k.optimizer == Tier::nvme &&
          k.optimizer_host_bytes)
        out.push_back(k);
    return out;
  };
  const std::vector<PlacementCandidate> twins = twins_of(c);
  ASSERT_EQ(twins.size(), 2u);
  const PlacementCandidate& kept_ra = twins[0];  // listed first: it moves fewer bytes
  const PlacementCandidate& kept = twins[1];
  EXPECT_FALSE(kept.optimizer_read_ahead.has_value());
  ASSERT_TRUE(kept_ra.optimizer_read_ahead.has_value());
  EXPECT_EQ(*kept_ra.optimizer_read_ahead, 0u);
  EXPECT_TRUE(kept.fits) << kept.why_not;
  EXPECT_TRUE(kept_ra.fits) << kept_ra.why_not;
  EXPECT_GT(kept_ra.optimizer_host_bytes, kept.optimizer_host_bytes);
  EXPECT_LT(kept_ra.prediction.bytes.nvme_write, kept.prediction.bytes.nvme_write);
  EXPECT_EQ(with_placement(c, kept).offload.optimizer_read_ahead, 4ull << 20);
  const Config resolved = with_placement(c, kept_ra);
  EXPECT_EQ(resolved.offload.optimizer_read_ahead, 0u);
  EXPECT_EQ(resolved.offload.optimizer_host_bytes, kept_ra.optimizer_host_bytes);
  EXPECT_LE(plan_memory(resolved, 1, machine).host_need,
            uint64_t(kKeptShareOfRam * double(machine.host_memory)));
  EXPECT_NE(kept_ra.name().find(" optimizer_read_ahead=0"), std::string::npos) << kept_ra.name();
  EXPECT_EQ(kept.name().find("optimizer_read_ahead"), std::string::npos) << kept.name();

  Config none = c;
  none.offload.optimizer_read_ahead = 0;
  EXPECT_EQ(twins_of(none).size(), 1u);
  Config serial = c;
  serial.offload.overlap_optimizer = false;
  EXPECT_EQ(twins_of(serial).size(), 1u);
}

// Gradients on NVMe beside NVMe states: the step writes each one during the backward and reads
// it back in its update (4 bytes a parameter each way), and the RAM they leave keeps more
// states; a kept unit's gradient stays in host memory beside its states, which the twin's
// budget leaves room for. Only with one micro-batch a step.
TEST(StepModel, AutoWeighsGradientsOnNvmeAgainstKeepingMoreStates) {
  Config c = small(scratch_dir());
  c.model.vocab_size = 256;  // blocks are most of the model: their gradients outweigh the staging
  c.model.n_layers = 12;
  c.train.grad_accum = 1;
  c.offload.optimizer.automatic = true;
  c.offload.grads.automatic = true;
  PlanMachine machine = gpu_machine();
  PlacementCandidate plain;
  plain.params = Tier::device, plain.grads = Tier::host, plain.optimizer = Tier::nvme;
  const MemoryPlan base = plan_memory(with_placement(c, plain), 1, machine);
  const LlamaModel model(c.model, 1);
  uint64_t shard = 0;
  for (const auto& u : model.units()) shard += u.layout.shard_numel();
  machine.host_memory = uint64_t(double(base.host_need + shard * 6) / kKeptShareOfRam) + 1;
  auto find = [&](const Config& cfg, Tier grads, bool kept) {
    std::optional<PlacementCandidate> out;
    for (const auto& k : plan_placements(cfg, 1, machine, rates()).candidates)
      if (k.params == Tier::device && k.optimizer == Tier::nvme && k.grads == grads &&
          bool(k.optimizer_host_bytes) == kept && !k.optimizer_read_ahead)
        out = k;
    return out;
  };
  const auto host = find(c, Tier::host, false), nvme = find(c, Tier::nvme, false);
  const auto host_kept = find(c, Tier::host, true), nvme_kept = find(c, Tier::nvme, true);
  ASSERT_TRUE(host && nvme && host_kept && nvme_kept);
  const double grads = double(shard) * 4;
  EXPECT_EQ(nvme->prediction.bytes.nvme_write, host->prediction.bytes.nvme_write + grads);
  EXPECT_EQ(nvme->prediction.bytes.nvme_read, host->prediction.bytes.nvme_read + grads);
  EXPECT_LT(nvme->host_bytes + nvme->pinned_bytes, host->host_bytes + host->pinned_bytes);
  EXPECT_TRUE(nvme_kept->fits) << nvme_kept->why_not;
  EXPECT_GT(nvme_kept->optimizer_host_bytes, host_kept->optimizer_host_bytes);
  const Config resolved = with_placement(c, *nvme_kept);
  EXPECT_EQ(resolved.offload.grads, Tier::nvme);
  EXPECT_LE(plan_memory(resolved, 1, machine).host_need,
            uint64_t(kKeptShareOfRam * double(machine.host_memory)));
  EXPECT_NE(nvme_kept->name().find("grads=nvme"), std::string::npos) << nvme_kept->name();

  Config accum = c;
  accum.train.grad_accum = 2;
  EXPECT_FALSE(find(accum, Tier::nvme, false).has_value());
  EXPECT_FALSE(find(accum, Tier::nvme, true).has_value());
}

TEST(StepModel, RefusesWhenNothingFitsNamingTheLimits) {
  Config c = small("");  // no NVMe: nvme is no candidate
  c.offload.params.automatic = c.offload.grads.automatic = c.offload.optimizer.automatic = true;
  c.offload.device_mem_limit = 64 << 10;
  PlanMachine m = gpu_machine();
  m.host_memory = 1 << 20;  // 1 MiB of RAM: the host tier cannot take the states either
  const AutoPlan plan = plan_placements(c, 1, m, rates());
  EXPECT_EQ(plan.chosen, -1);
  for (const auto& k : plan.candidates) EXPECT_NE(k.params, Tier::nvme);
  EXPECT_ERROR_HAS(chosen_placement(plan), "[plan::auto]", "no placement fits", "offload.device_mem_limit",
                   "this machine's RAM", "params=device grads=device optimizer=device", "offload.nvme_path");
}

// The limits the error lists are those of every candidate, not only of the first (all on the
// device), which is never checked against the pinned budget or the NVMe space.
TEST(StepModel, RefusalListsTheLimitsOfEveryCandidate) {
  Config c = small(scratch_dir());
  c.offload.params.automatic = c.offload.grads.automatic = c.offload.optimizer.automatic = true;
  c.offload.device_mem_limit = 64 << 10;
  c.offload.pinned_mem_limit = 64 << 10;
  PlanMachine m = gpu_machine();
  m.host_memory = 1 << 20;
  const AutoPlan plan = plan_placements(c, 1, m, rates());
  EXPECT_EQ(plan.chosen, -1);
  auto listed = [&](const std::string& name) {
    int n = 0;
    for (const auto& l : plan.limits) n += l.find(name) != std::string::npos;
    return n;
  };
  EXPECT_EQ(listed("offload.device_mem_limit"), 1);
  EXPECT_EQ(listed("this machine's RAM"), 1);
  EXPECT_EQ(listed("offload.pinned_mem_limit"), 1);
  EXPECT_EQ(listed("free space in '" + c.offload.nvme_path[0] + "'"), 1);
  EXPECT_ERROR_HAS(chosen_placement(plan), "offload.pinned_mem_limit", "free space in");
  // offload.nvme_path is set: the hint asks for its space, not for the key
  EXPECT_ERROR_HAS(chosen_placement(plan), "free space under offload.nvme_path");
}

// The plan checks the NVMe swap the engine creates (nvme_swap_bytes, swap_file_share), per file
// system: two folders of one disk (one of them a symlink to the other) share its free space, and
// a stripe size matters only where several folders stripe the space.
TEST(StepModel, PlanChecksTheSwapFilesPerFileSystem) {
  const std::string dir = scratch_dir();
  std::filesystem::create_directories(dir + "/a");
  std::filesystem::create_directory_symlink(dir + "/a", dir + "/link");
  Config c = placed(small(dir + "/a"), Tier::nvme, Tier::nvme);
  const MemoryPlan one = plan_memory(c, 1, cpu_machine());
  const LlamaModel model(c.model, 1);
  const uint64_t nvme = one.tier_bytes("nvme");
  auto swap_checks = [](const MemoryPlan& p) {
    std::vector<PlanCheck> out;
    for (const auto& k : p.checks)
      if (k.what.rfind("NVMe swap", 0) == 0) out.push_back(k);
    return out;
  };
  ASSERT_EQ(swap_checks(one).size(), 1u);
  EXPECT_EQ(swap_checks(one)[0].need, swap_file_share(nvme_swap_bytes(model, nvme, 1, 1 << 20), 1, 1 << 20));
  c.io.stripe_size = 8ull << 30;  // one folder: no stripes, the same files
  EXPECT_EQ(swap_checks(plan_memory(c, 1, cpu_machine()))[0].need, swap_checks(one)[0].need);
  c.offload.nvme_path = {dir + "/a", dir + "/link"};
  c.io.stripe_size = 1 << 20;
  const auto two = swap_checks(plan_memory(c, 1, cpu_machine()));
  ASSERT_EQ(two.size(), 1u);  // one file system
  // its free space, counted once (not twice); other tests write beside this one, so the free
  // space may move a little between the two plans
  const uint64_t free_once = swap_checks(one)[0].limit;
  EXPECT_GT(two[0].limit, free_once / 2);
  EXPECT_LT(two[0].limit, free_once + free_once / 2);
  EXPECT_EQ(two[0].need, 2 * swap_file_share(nvme_swap_bytes(model, nvme, 2, 1 << 20), 2, 1 << 20));
  EXPECT_NE(two[0].limit_name.find(dir + "/link"), std::string::npos);
  c.offload.nvme_path = {dir + "/a", "/proc/strata-no-such-folder"};  // not on a disk: its own check
  const MemoryPlan bad = plan_memory(c, 1, cpu_machine());
  ASSERT_EQ(swap_checks(bad).size(), 2u);
  EXPECT_EQ(swap_checks(bad)[1].limit, 0u);
  // (why: "not on a disk" as root, "not writable" otherwise)
  EXPECT_NE(bad.failed_checks().find("'/proc/strata-no-such-folder' ("), std::string::npos);
  EXPECT_NE(bad.hint().find("offload.nvme_path"), std::string::npos);
  EXPECT_EQ(one.hint(), kDoesNotFitHint);
}

// Swap files on a file system in memory (tmpfs, /dev/shm) take RAM: the plan counts them in the
// host memory check as well as against the file system's free space; on a disk it does not.
TEST(StepModel, PlanCountsSwapFilesInMemoryAgainstRam) {
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC)
    GTEST_SKIP() << "no tmpfs at /dev/shm on this machine";
  const Config disk = placed(small(scratch_dir()), Tier::nvme, Tier::nvme);
  Config shm = disk;
  shm.offload.nvme_path = {"/dev/shm/strata-plan-test-not-made"};
  const MemoryPlan on_disk = plan_memory(disk, 1, cpu_machine());
  const MemoryPlan in_ram = plan_memory(shm, 1, cpu_machine());
  uint64_t swap = 0;
  for (const auto& k : in_ram.checks)
    if (k.what.rfind("NVMe swap", 0) == 0) swap = k.need;
  ASSERT_GT(swap, 0u);
  EXPECT_EQ(in_ram.host_need, on_disk.host_need + swap);
  bool named = false;
  for (const auto& k : in_ram.checks)
    named |= k.what.find("NVMe swap files in memory (tmpfs) included") != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/strata-plan-test-not-made"));  // nothing made
}

// A read-ahead too small for one whole chunk, which the engine refuses: the plan refuses it too,
// naming the chunk it needs; 0 and a whole chunk pass.
TEST(StepModel, PlanRefusesAReadAheadBelowOneChunk) {
  Config c = placed(small(scratch_dir()), Tier::host, Tier::nvme);
  auto ahead_check = [](const MemoryPlan& p) -> const PlanCheck* {
    for (const auto& k : p.checks)
      if (k.limit_name == "offload.optimizer_read_ahead") return &k;
    return nullptr;
  };
  c.offload.optimizer_read_ahead = 1;
  const MemoryPlan tiny = plan_memory(c, 1, cpu_machine());
  ASSERT_NE(ahead_check(tiny), nullptr);
  EXPECT_FALSE(tiny.fits());
  const uint64_t chunk = ahead_check(tiny)->need;
  EXPECT_GT(chunk, 1u);
  EXPECT_NE(tiny.hint().find("raise offload.optimizer_read_ahead"), std::string::npos);
  c.offload.optimizer_read_ahead = 0;
  EXPECT_EQ(ahead_check(plan_memory(c, 1, cpu_machine())), nullptr);
  c.offload.optimizer_read_ahead = chunk;
  const MemoryPlan whole = plan_memory(c, 1, cpu_machine());
  EXPECT_EQ(ahead_check(whole), nullptr);
  EXPECT_TRUE(whole.fits()) << whole.failed_checks();
}

TEST(StepModel, BytesPerStepFollowTheTuningTable) {
  // params and optimizer on NVMe in f32: the compute copy is the master; each pass reads it
  // (forward, backward), the optimizer reads and writes master, m, v (docs/tuning.md).
  Config c = placed(small(scratch_dir()), Tier::nvme, Tier::nvme);
  const StepPrediction p = predict_step(c, 1, gpu_machine(), rates());
  double shard = 0;
  const LlamaModel model(c.model, 1);
  for (const auto& u : model.units()) shard += double(u.layout.shard_numel());
  EXPECT_DOUBLE_EQ(p.bytes.nvme_param_read, 2 * 4 * shard);
  EXPECT_DOUBLE_EQ(p.bytes.nvme_read, 2 * 4 * shard + 12 * shard);
  EXPECT_DOUBLE_EQ(p.bytes.nvme_write, 12 * shard);
  EXPECT_DOUBLE_EQ(p.bytes.h2d, 2 * 4 * shard);  // staged to the device before each gather
  EXPECT_DOUBLE_EQ(p.bytes.d2h, 4 * shard);      // the gradients, to the host
  EXPECT_DOUBLE_EQ(p.bytes.adam, 28 * shard);
  // bf16 m and v: 8 instead of 12 bytes each way.
  c.train.optimizer_state_dtype = DType::bf16;
  const StepPrediction q = predict_step(c, 1, gpu_machine(), rates());
  EXPECT_DOUBLE_EQ(q.bytes.nvme_write, 8 * shard);
  EXPECT_DOUBLE_EQ(q.bytes.adam, 20 * shard);
  // bf16 compute, params and optimizer on NVMe: no compute copy is stored; each gather reads the
  // f32 master and rounds it (Placement::param_rounds_master). The clipped overlapped step's
  // forward gathers every unit from the bf16 copy its update kept, so only the backward reads
  // the master; a serial step's forward takes the first two units' from there.
  c.train.optimizer_state_dtype = DType::f32;
  c.train.precision = Precision::bf16;
  ASSERT_GT(c.train.grad_clip, 0.0f);
  const StepPrediction o = predict_step(c, 1, gpu_machine(), rates());
  EXPECT_DOUBLE_EQ(o.bytes.nvme_param_read, 4 * shard);
  EXPECT_DOUBLE_EQ(o.bytes.nvme_write, 12 * shard);  // no copy written
  EXPECT_DOUBLE_EQ(o.bytes.h2d, 2 * 4 * shard);      // the master, staged for each gather
  const double first_two =
      double(model.unit(0).layout.shard_numel() + model.unit(1).layout.shard_numel());
  {
    Config serial = c;
    serial.offload.overlap_optimizer = false;
    const StepPrediction s = predict_step(serial, 1, gpu_machine(), rates());
    EXPECT_DOUBLE_EQ(s.bytes.nvme_param_read, 2 * 4 * shard - 4 * first_two);
  }
  // The first unit's states kept in host memory: its master is gathered from there, unread.
  {
    Config kept = c;
    const double first = double(model.unit(0).layout.shard_numel());
    kept.offload.optimizer_host_bytes = uint64_t(first) * 16 + 4096;
    const StepPrediction k = predict_step(kept, 1, gpu_machine(), rates());
    EXPECT_DOUBLE_EQ(k.bytes.nvme_param_read, 4 * (shard - first));
    EXPECT_DOUBLE_EQ(k.bytes.nvme_write, 12 * (shard - first));
  }
  // The optimizer in host memory: the bf16 compute copy is its own shard on NVMe, written by
  // each update and read back by the backward (the forward's kept as above).
  c.offload.optimizer = Tier::host;
  const StepPrediction h = predict_step(c, 1, gpu_machine(), rates());
  EXPECT_DOUBLE_EQ(h.bytes.nvme_param_read, 2 * shard);
  EXPECT_DOUBLE_EQ(h.bytes.nvme_write, 2 * shard);
  c.offload.overlap_optimizer = false;
  const StepPrediction s = predict_step(c, 1, gpu_machine(), rates());
  EXPECT_DOUBLE_EQ(s.bytes.nvme_param_read, 2 * 2 * shard - 2 * first_two);
}

TEST(StepModel, MoreNvmeBytesOrSlowerDisksAreNeverFaster) {
  const std::string dir = scratch_dir();
  MachineRates slow = rates();
  slow.adam_gbps = 1000;  // the disks, not the AdamW, bound the optimizer
  for (bool overlap : {false, true}) {
    Config c = placed(small(dir), Tier::nvme, Tier::nvme);
    c.offload.overlap_optimizer = overlap;
    const double f32 = predict_step(c, 1, gpu_machine(), slow).step_ms;
    c.train.optimizer_state_dtype = DType::bf16;  // fewer optimizer bytes on NVMe
    const double bf16 = predict_step(c, 1, gpu_machine(), slow).step_ms;
    EXPECT_GE(f32, bf16);
    MachineRates slower = slow;
    slower.nvme_read_gbps /= 4;
    slower.nvme_write_gbps /= 4;
    EXPECT_GT(predict_step(c, 1, gpu_machine(), slower).step_ms, bf16);
    EXPECT_EQ(predict_step(c, 1, gpu_machine(), slower).bottleneck.rfind("optimizer", 0), 0u)
        << predict_step(c, 1, gpu_machine(), slower).bottleneck;
  }
  // Without overlap, each tier further from the device is not faster at these rates (with it,
  // an offloaded optimizer may hide behind the forward and beat the device's).
  Config c = small(dir);
  c.offload.overlap_optimizer = false;
  const double device = predict_step(placed(c, Tier::device, Tier::device), 1, gpu_machine(), rates()).step_ms;
  const double host = predict_step(placed(c, Tier::host, Tier::host), 1, gpu_machine(), rates()).step_ms;
  const double nvme = predict_step(placed(c, Tier::nvme, Tier::nvme), 1, gpu_machine(), rates()).step_ms;
  EXPECT_LE(device, host);
  EXPECT_LE(host, nvme);
}

TEST(StepModel, OverlapHidesTheOptimizerBehindTheForwardOnly) {
  Config c = placed(small(scratch_dir()), Tier::device, Tier::host);
  MachineRates r = rates();
  r.adam_gbps = 0.01;  // an optimizer far longer than the forward
  c.offload.overlap_optimizer = false;
  const StepPrediction off = predict_step(c, 1, gpu_machine(), r);
  c.offload.overlap_optimizer = true;
  const StepPrediction on = predict_step(c, 1, gpu_machine(), r);
  EXPECT_NEAR(off.step_ms, off.forward_ms + off.backward_ms + off.optimizer_ms, 1e-9);
  EXPECT_NEAR(on.step_ms, off.step_ms - on.forward_ms, 1e-9);  // at most the forward is hidden
  EXPECT_EQ(on.bottleneck, "optimizer (cpu adamw)");
  // On the CPU device the AdamW shares the cores: nothing of it hides.
  const PlanMachine cpu = cpu_machine();
  const double cpu_on = predict_step(c, 1, cpu, r).step_ms;
  c.offload.overlap_optimizer = false;
  EXPECT_NEAR(cpu_on, predict_step(c, 1, cpu, r).step_ms, 1e-9);
}

// The CPU AdamW with bf16 m and v runs at its own measured rate (it converts as it streams: on
// the 2-core Xeon VM its updates took 476 ms where the f32 kernel's rate gave 318), and the
// gradient norm's pass over the f32 gradients is charged before the updates: at the CPU's sum of
// squares rate with the gradients in host memory, at the device's memory rate on a GPU. A rate
// an earlier probe did not measure falls back (f32 AdamW) or is not charged (norm).
TEST(StepModel, Bf16StatesAndTheNormRunAtTheirOwnRates) {
  Config c = placed(small(""), Tier::host, Tier::host);
  c.offload.overlap_optimizer = false;
  const MachineRates r = rates();
  const LlamaModel model(c.model, 1);
  double shard = 0;
  for (const auto& u : model.units()) shard += double(u.layout.shard_numel());
  const StepPrediction f32 = predict_step(c, 1, gpu_machine(), r);
  EXPECT_NEAR(f32.norm_ms, shard * 4 / (r.norm_gbps * 1e9) * 1e3, 1e-9 * f32.norm_ms);
  EXPECT_NEAR(f32.optimizer_ms, f32.norm_ms + f32.bytes.adam / (r.adam_gbps * 1e9) * 1e3,
              1e-9 * f32.optimizer_ms);
  c.train.optimizer_state_dtype = DType::bf16;
  const StepPrediction bf16 = predict_step(c, 1, gpu_machine(), r);
  EXPECT_NEAR(bf16.optimizer_ms, bf16.norm_ms + bf16.bytes.adam / (r.adam_bf16_gbps * 1e9) * 1e3,
              1e-9 * bf16.optimizer_ms);
  EXPECT_NEAR(bf16.step_ms, bf16.forward_ms + bf16.backward_ms + bf16.optimizer_ms, 1e-9);
  MachineRates earlier = r;  // a cache entry of an earlier probe
  earlier.adam_bf16_gbps = earlier.norm_gbps = 0;
  const StepPrediction old = predict_step(c, 1, gpu_machine(), earlier);
  EXPECT_EQ(old.norm_ms, 0);
  EXPECT_NEAR(old.optimizer_ms, bf16.bytes.adam / (r.adam_gbps * 1e9) * 1e3, 1e-9 * old.optimizer_ms);
  // The gradients on the GPU: its memory rate.
  const StepPrediction dev = predict_step(placed(c, Tier::device, Tier::device), 1, gpu_machine(), r);
  EXPECT_NEAR(dev.norm_ms, shard * 4 / (r.device_mem_gbps * 1e9) * 1e3, 1e-9 * dev.norm_ms);
  // A clipped overlapped step on the CPU device whose disk is the limit: the updates' reads and
  // writes follow the norm, so the step is the backward, the norm and the disk's time (params in
  // host memory: every NVMe byte is the optimizer's), and never shorter than unclipped.
  Config nv = placed(small(scratch_dir()), Tier::host, Tier::nvme);
  MachineRates slow = r;
  slow.nvme_read_gbps = slow.nvme_write_gbps = 0.01;
  slow.nvme_read_busy_gbps = slow.nvme_write_busy_gbps = 0.01;
  slow.norm_gbps = 0.001;  // a norm long enough to matter
  const StepPrediction clipped = predict_step(nv, 1, cpu_machine(), slow);
  const double disk_ms = clipped.bytes.nvme_read / (0.01 * 1e9) * 1e3 +
                         clipped.bytes.nvme_write / (0.01 * 1e9) * 1e3;
  EXPECT_NEAR(clipped.step_ms, clipped.backward_ms + clipped.norm_ms + disk_ms, 1e-9 * clipped.step_ms);
  nv.train.grad_clip = 0;
  EXPECT_LE(predict_step(nv, 1, cpu_machine(), slow).step_ms, clipped.step_ms);
}

// Attention runs on its own kernels at its own rate: the GEMM FLOPs at the GEMM rate, the
// attention FLOPs (6·layers·T·dim per token) at the attention rate, the backward twice the
// forward. On an H200 the f32 attention kernel ran ~100x below the bf16-operand GEMMs, and
// charging it the GEMM rate predicted a 155M model's step 8x too fast.
TEST(StepModel, AttentionRunsAtItsOwnRate) {
  const Config c = small("");
  const LlamaModel model(c.model, 1);
  const double tokens = double(c.data.micro_batch) * c.data.seq_len;
  const double attention = model.attention_flops_per_token(c.data.seq_len) * tokens;
  const double all = model.train_flops_per_token(c.data.seq_len) * tokens;
  EXPECT_DOUBLE_EQ(attention, 6.0 * 4 * 64 * 128 * tokens);
  MachineRates r = rates();
  const StepPrediction same = predict_step(c, 1, gpu_machine(), r);
  EXPECT_NEAR(same.compute_ms, all / r.gemm_flops * 1e3, 1e-9);
  r.attention_flops = r.gemm_flops / 100;
  const StepPrediction slow = predict_step(c, 1, gpu_machine(), r);
  EXPECT_NEAR(slow.compute_ms, ((all - attention) / r.gemm_flops + attention / r.attention_flops) * 1e3,
              1e-9);
  EXPECT_NEAR(slow.backward_ms, 2 * slow.forward_ms, 1e-9);
  r.attention_flops = 0;
  EXPECT_ERROR_HAS(predict_step(c, 1, gpu_machine(), r), "attention rate was not measured", "--reprobe");
}

// The host⇄device copies of the passes: a GPU's copy engines overlap them with compute; on the
// CPU device they are memcpys on the compute's cores, so they add to the pass.
TEST(StepModel, CpuDeviceCopiesAddToThePass) {
  Config c = placed(small(""), Tier::host, Tier::host);
  c.train.grad_accum = 2;  // (one micro-batch: see the next test)
  MachineRates r = rates();
  const StepPrediction gpu = predict_step(c, 1, gpu_machine(), r);
  EXPECT_GT(gpu.copy_ms, 0);
  EXPECT_NEAR(gpu.forward_ms + gpu.backward_ms, gpu.compute_ms, 1e-9);  // copies hidden
  const PlanMachine cpu = cpu_machine();
  const StepPrediction on_cpu = predict_step(c, 1, cpu, r);
  // (params and optimizer both on the host: every copy is a pass's, none the optimizer's)
  EXPECT_NEAR(on_cpu.copy_ms, gpu.copy_ms, 1e-9);
  EXPECT_NEAR(on_cpu.forward_ms + on_cpu.backward_ms, on_cpu.compute_ms + on_cpu.copy_ms, 1e-9);
  r.h2d_gbps = r.d2h_gbps = 1e-3;  // copies far slower than compute: the bottleneck
  EXPECT_EQ(predict_step(c, 1, cpu, r).bottleneck, "host-device copies");
}

// On the CPU device a bf16 compute copy is cast to f32 into each gather's slot, on every tier
// (the device's own shards too): its bytes read and twice as many written, charged as a copy of
// 1.5 times its bytes on the compute's cores. A GPU's f32 copy of the same placement is not.
TEST(StepModel, CpuDeviceCastsABf16ComputeCopyInEveryGather) {
  const MachineRates r = rates();
  for (Tier params : {Tier::device, Tier::host}) {
    SCOPED_TRACE(std::string(tier_name(params)));
    Config c = placed(small(""), params, params);
    c.train.precision = Precision::bf16;
    double padded = 0;
    const LlamaModel model(c.model, 1);
    for (const auto& u : model.units()) padded += double(u.layout.padded_numel());
    const double gathers = c.zero.reshard_after_forward ? 2 : 1;  // forward, and backward
    const StepPrediction on_cpu = predict_step(c, 1, cpu_machine(), r);
    EXPECT_NEAR(on_cpu.copy_ms, 1.5 * gathers * padded * 2 / (r.h2d_gbps * 1e9) * 1e3, 1e-9);
    EXPECT_NEAR(on_cpu.forward_ms + on_cpu.backward_ms, on_cpu.compute_ms + on_cpu.copy_ms, 1e-9);
    c.train.precision = Precision::fp32;  // f32 on the device's own shards: nothing to gather
    if (params == Tier::device) {
      EXPECT_EQ(predict_step(c, 1, cpu_machine(), r).copy_ms, 0);
    }
  }
}

// One rank and one micro-batch on the CPU device: the backward accumulates into the host
// gradient shard itself (Placement::aliased_grads), so no gradient is copied; a GPU copies each
// unit's gradient to the host once.
TEST(StepModel, CpuDeviceAccumulatesIntoTheHostGradients) {
  const Config c = placed(small(""), Tier::host, Tier::host);
  double shard = 0;
  const LlamaModel model(c.model, 1);
  for (const auto& u : model.units()) shard += double(u.layout.shard_numel());
  const StepPrediction gpu = predict_step(c, 1, gpu_machine(), rates());
  const StepPrediction on_cpu = predict_step(c, 1, cpu_machine(), rates());
  EXPECT_DOUBLE_EQ(gpu.bytes.d2h, 4 * shard);
  EXPECT_DOUBLE_EQ(on_cpu.bytes.d2h, 0);
  EXPECT_DOUBLE_EQ(on_cpu.bytes.h2d, gpu.bytes.h2d);  // the gathers still stage the params
  // Two ranks reduce-scatter into the shard: a copy again.
  EXPECT_GT(predict_step(c, 2, cpu_machine(), rates()).bytes.d2h, 0);
}

// Unclipped, the updates run during the backward and the next forward: the optimizer hides
// behind both passes instead of the forward only; the disk serves the passes' reads and the
// optimizer's traffic together.
TEST(StepModel, UnclippedUpdatesHideBehindTheBackward) {
  Config c = placed(small(scratch_dir()), Tier::host, Tier::nvme);
  MachineRates r = rates();
  r.nvme_read_gbps = r.nvme_write_gbps = 0.05;  // an NVMe-bound optimizer
  c.offload.overlap_optimizer = true;
  const StepPrediction clipped = predict_step(c, 1, gpu_machine(), r);
  c.train.grad_clip = 0;
  const StepPrediction unclipped = predict_step(c, 1, gpu_machine(), r);
  EXPECT_NEAR(clipped.step_ms, clipped.backward_ms + clipped.optimizer_ms, 1e-9);
  EXPECT_LT(unclipped.step_ms, clipped.step_ms);
  // The first two units' updates (the backward finishes them last, the forward waits for
  // them) add their share of the optimizer to the passes (params on the host: no copies, the
  // disk is the optimizer's); here the NVMe-bound optimizer is longer still.
  double shard = 0, first = 0;
  const LlamaModel model(c.model, 1);
  for (size_t u = 0; u < model.units().size(); ++u) {
    shard += double(model.units()[u].layout.shard_numel());
    if (u < 2) first += double(model.units()[u].layout.shard_numel());
  }
  const double passes = unclipped.forward_ms + unclipped.backward_ms;
  EXPECT_NEAR(unclipped.step_ms,
              std::max({passes + first / shard * unclipped.optimizer_ms, unclipped.optimizer_ms, unclipped.nvme_ms}),
              1e-9 * unclipped.step_ms);
  // A fast disk: the worker keeps up, and the forward waits for the first two units only.
  MachineRates fast = r;
  fast.nvme_read_gbps = fast.nvme_write_gbps = 1000;
  const StepPrediction quick = predict_step(c, 1, gpu_machine(), fast);
  EXPECT_NEAR(quick.step_ms, quick.forward_ms + quick.backward_ms + first / shard * quick.optimizer_ms,
              1e-9 * quick.step_ms);
  EXPECT_GT(quick.step_ms, quick.forward_ms + quick.backward_ms);
  // With the compute copy on NVMe too, the backward's reads share the disk with the optimizer:
  // the step is never shorter than the disk's whole traffic.
  const StepPrediction both = predict_step(placed(c, Tier::nvme, Tier::nvme), 1, gpu_machine(), r);
  EXPECT_GE(both.step_ms, both.nvme_ms);
  // Without the overlap, clipping changes nothing.
  c.offload.overlap_optimizer = false;
  EXPECT_NEAR(predict_step(c, 1, gpu_machine(), r).step_ms,
              clipped.forward_ms + clipped.backward_ms + clipped.optimizer_ms, 1e-9);
}

// offload.optimizer_read_ahead, clipped: the states it holds are read during the last backward
// (which is then at least that long) instead of after the norm, where only the writes are left
// to hide behind the forward. Off NVMe it holds nothing.
TEST(StepModel, ReadAheadMovesStateReadsIntoTheBackward) {
  Config c = placed(small(scratch_dir()), Tier::host, Tier::nvme);
  MachineRates r = rates();
  r.nvme_read_gbps = r.nvme_write_gbps = 0.05;  // an NVMe-bound optimizer
  const StepPrediction none = predict_step(c, 1, gpu_machine(), r);
  c.offload.optimizer_read_ahead = 1ull << 40;  // more than the states: all of them
  const StepPrediction all = predict_step(c, 1, gpu_machine(), r);
  // Params in host memory: every NVMe byte is the optimizer's, and no copy follows the update.
  const double read_ms = all.bytes.nvme_read / (r.nvme_read_gbps * 1e9) * 1e3;
  const double write_ms = all.bytes.nvme_write / (r.nvme_write_gbps * 1e9) * 1e3;
  EXPECT_NEAR(all.backward_ms, std::max(none.backward_ms, read_ms), 1e-9 * read_ms);
  // (the norm first: every update waits for it)
  EXPECT_NEAR(all.step_ms,
              all.forward_ms + all.backward_ms + all.norm_ms + std::max(0.0, write_ms - all.forward_ms),
              1e-9 * all.step_ms);
  EXPECT_GT(all.norm_ms, 0);
  EXPECT_LT(all.step_ms, none.step_ms);
  const Config host = placed(c, Tier::host, Tier::host);
  c.offload.optimizer_read_ahead = 0;
  EXPECT_EQ(predict_step(host, 1, gpu_machine(), r).step_ms,
            predict_step(placed(c, Tier::host, Tier::host), 1, gpu_machine(), r).step_ms);
}

// offload.optimizer_host_bytes: the kept units' states are neither read nor written on NVMe, so
// each step's optimizer traffic shrinks by their bytes each way; the AdamW still reads and
// writes them all. Keeping every unit moves nothing through NVMe for the optimizer.
TEST(StepModel, StatesKeptInHostMemoryLeaveTheDisk) {
  Config c = placed(small(scratch_dir()), Tier::host, Tier::nvme);
  const MachineRates r = rates();
  const StepPrediction none = predict_step(c, 1, gpu_machine(), r);
  const LlamaModel model(c.model, 1);
  const uint64_t per = zero_options(c).placement.optimizer_state_bytes();
  const uint64_t first_two =
      (model.unit(0).layout.shard_numel() + model.unit(1).layout.shard_numel()) * per;
  c.offload.optimizer_host_bytes = first_two + per;  // room for two units and a little: two
  EXPECT_EQ(optimizer_host_units(model, zero_options(c).placement), 2);
  const StepPrediction two = predict_step(c, 1, gpu_machine(), r);
  EXPECT_NEAR(two.bytes.nvme_read, none.bytes.nvme_read - double(first_two), 1.0);
  EXPECT_NEAR(two.bytes.nvme_write, none.bytes.nvme_write - double(first_two), 1.0);
  EXPECT_EQ(two.bytes.adam, none.bytes.adam);
  EXPECT_LT(two.nvme_ms, none.nvme_ms);
  c.offload.optimizer_host_bytes = 1ull << 40;  // every unit
  const StepPrediction all = predict_step(c, 1, gpu_machine(), r);
  EXPECT_EQ(all.bytes.nvme_read, 0.0);
  EXPECT_EQ(all.bytes.nvme_write, 0.0);
  // Off NVMe the key is refused before any prediction (config::validate); the engine's helper
  // counts nothing there.
  const Placement host = zero_options(placed(c, Tier::host, Tier::host)).placement;
  EXPECT_EQ(optimizer_host_units(model, host), 0);
}

// On the CPU device the GEMM and AdamW rates are the measured threads' and are shared: a rank
// gets min(1 / ranks on the machine, train.threads / measured threads) of them.
TEST(StepModel, CpuRatesFollowThreadsAndRanks) {
  PlanMachine cpu = cpu_machine();
  Config c = placed(small(""), Tier::device, Tier::device);
  const double all = predict_step(c, 1, cpu, rates()).compute_ms;
  c.train.threads = 1;  // half the threads the rates were measured with
  EXPECT_NEAR(predict_step(c, 1, cpu, rates()).compute_ms, 2 * all, 1e-9 * all);
  cpu.ranks_here = 2;  // two ranks of one thread each on the 2 measured threads: still half each
  EXPECT_NEAR(predict_step(c, 1, cpu, rates()).compute_ms, 2 * all, 1e-9 * all);
  c.train.threads = 0;  // two ranks sharing all threads
  EXPECT_NEAR(predict_step(c, 1, cpu, rates()).compute_ms, 2 * all, 1e-9 * all);
  // A GPU's GEMM rate is its own.
  PlanMachine gpu = gpu_machine();
  gpu.ranks_here = 2;
  c.train.threads = 1;
  EXPECT_NEAR(predict_step(c, 1, gpu, rates()).compute_ms, all, 1e-9 * all);
}

// dp > 1: the collectives the engine counts (an all-gather per gather, a reduce-scatter per
// micro-batch), counted only with a measured rate; the CPU device's cores copy them (added to
// the pass), a GPU overlaps them with compute.
TEST(StepModel, CollectivesWithAMeasuredRate) {
  Config c = placed(small(""), Tier::device, Tier::device);
  double padded = 0;
  const LlamaModel model(c.model, 2);
  for (const auto& u : model.units()) padded += double(u.layout.padded_numel());
  MachineRates r = rates();
  const StepPrediction none = predict_step(c, 2, gpu_machine(), r);
  EXPECT_DOUBLE_EQ(none.bytes.comm, 2 * padded * 4 + padded * 4);
  EXPECT_EQ(none.comm_ms, 0);  // no rate: not counted
  r.comm_gbps = 1000;  // far faster than compute: a GPU hides it
  const StepPrediction fast = predict_step(c, 2, gpu_machine(), r);
  EXPECT_GT(fast.comm_ms, 0);
  EXPECT_DOUBLE_EQ(fast.step_ms, none.step_ms);
  const PlanMachine cpu = cpu_machine();
  const StepPrediction cpu_none = predict_step(c, 2, cpu, rates());
  const StepPrediction cpu_fast = predict_step(c, 2, cpu, r);
  EXPECT_NEAR(cpu_fast.step_ms, cpu_none.step_ms + cpu_fast.comm_ms, 1e-9 * cpu_fast.step_ms);
  r.comm_gbps = 1e-3;  // far slower: the bottleneck
  EXPECT_EQ(predict_step(c, 2, gpu_machine(), r).bottleneck, "communication");
  EXPECT_EQ(predict_step(c, 2, cpu, r).bottleneck, "communication");
}

// On the CPU device the disk serves the passes and the overlapped optimizer beside compute, at
// the rates measured so; alone (the serial optimizer phase) at its idle rates. A GPU's passes
// leave the CPU idle: its predictions ignore the busy rates.
TEST(StepModel, TheDiskBesideTheCpuDevicesComputeRunsAtItsBusyRate) {
  const std::string dir = scratch_dir();
  const PlanMachine cpu = cpu_machine();
  MachineRates idle = rates();
  idle.nvme_read_gbps = idle.nvme_read_busy_gbps = 0.05;  // the disk matters
  idle.nvme_write_gbps = idle.nvme_write_busy_gbps = 0.04;
  idle.gemm_flops = idle.attention_flops = 1e9;  // compute about as long as the disk's traffic
  MachineRates unmeasured = idle;  // 0: not measured, the idle rates
  unmeasured.nvme_read_busy_gbps = unmeasured.nvme_write_busy_gbps = 0;
  MachineRates busy = idle;  // half as fast beside compute
  busy.nvme_read_busy_gbps /= 2;
  busy.nvme_write_busy_gbps /= 2;
  MachineRates half = busy;  // half as fast always
  half.nvme_read_gbps /= 2;
  half.nvme_write_gbps /= 2;
  for_each_nvme_optimizer_order(dir, [&](const Config& c, Tier params, bool overlap) {
    const StepPrediction pi = predict_step(c, 1, cpu, idle), pb = predict_step(c, 1, cpu, busy);
    const double i = pi.step_ms, b = pb.step_ms, h = predict_step(c, 1, cpu, half).step_ms;
    EXPECT_EQ(predict_step(c, 1, cpu, unmeasured).step_ms, i);
    EXPECT_EQ(predict_step(c, 1, gpu_machine(), busy).step_ms,
              predict_step(c, 1, gpu_machine(), idle).step_ms);
    EXPECT_LE(b, h);  // the busy rate for part of the time at most
    EXPECT_GT(h, i * 1.01);
    // The parameter reads run beside the passes' compute; the serial optimizer phase alone.
    if (params == Tier::nvme) EXPECT_GT(pb.nvme_ms, pi.nvme_ms);
    else EXPECT_EQ(pb.nvme_ms, pi.nvme_ms);
    EXPECT_EQ(pb.optimizer_ms, pi.optimizer_ms);
    if (overlap) EXPECT_GT(b, i * 1.01);  // the optimizer's traffic beside compute
    else if (params == Tier::host) EXPECT_EQ(b, i);
    else EXPECT_GE(b, i);  // (the passes here are compute-bound)
  });
}

// On a VM whose host emulates the disk on the guest's cores, the bytes moved beside the CPU
// device's compute cost it the steal they cause (nvme_steal_s_per_gb, spread over the threads
// the rank computes on). Bytes moved while the cores wait (the serial optimizer phase) cost
// nothing, and neither does anything on a GPU, whose passes leave the CPU idle.
TEST(StepModel, StealBesideTheCpuDevicesComputeLengthensIt) {
  const std::string dir = scratch_dir();
  const PlanMachine cpu = cpu_machine();
  MachineRates none = rates();  // the disk faster than compute: its traffic hides behind it
  none.gemm_flops = none.attention_flops = 1e9;
  MachineRates steal = none;
  steal.nvme_steal_s_per_gb = 0.3;
  for_each_nvme_optimizer_order(dir, [&](const Config& c, Tier params, bool overlap) {
    const StepPrediction p0 = predict_step(c, 1, cpu, none), ps = predict_step(c, 1, cpu, steal);
    EXPECT_EQ(p0.steal_ms, 0.0);
    EXPECT_EQ(predict_step(c, 1, gpu_machine(), steal).step_ms,
              predict_step(c, 1, gpu_machine(), none).step_ms);
    EXPECT_EQ(predict_step(c, 1, gpu_machine(), steal).steal_ms, 0.0);
    EXPECT_EQ(ps.optimizer_ms, p0.optimizer_ms);  // the optimizer on its own
    EXPECT_EQ(ps.compute_ms, p0.compute_ms);
    // The passes' own reads, beside their compute: k × bytes / threads.
    const double pass_steal = 0.3 * ps.bytes.nvme_param_read / 1e9 * 1e3 / 2;
    if (!overlap) {
      EXPECT_NEAR(ps.steal_ms, pass_steal, 1e-9 * pass_steal);
      if (params == Tier::host) {
        EXPECT_EQ(ps.step_ms, p0.step_ms);  // serial: its bytes move while the cores wait
      }
    } else {
      EXPECT_GT(ps.steal_ms, pass_steal);  // and the optimizer's traffic beside compute
      EXPECT_GT(ps.step_ms, p0.step_ms);
    }
    EXPECT_GE(ps.step_ms, p0.step_ms);
    EXPECT_LE(ps.step_ms, p0.step_ms + ps.steal_ms * (1 + 1e-12));
  });
}

TEST(StepModel, UnresolvedAutoIsNeverAllocated) {
  Config c = small("");
  c.offload.optimizer.automatic = true;
  EXPECT_ERROR_HAS(zero_options(c), "[zero::options]", "offload.optimizer = \"auto\"");
  EXPECT_ERROR_HAS(predict_step(c, 1, gpu_machine(), rates()), "offload.optimizer = \"auto\"");
}

TEST(RateCache, RoundTrip) {
  const std::string path = scratch_dir() + "/sub/rates.json";  // the directory is created
  const std::string key = rate_cache_key("test gpu", "259:1 /mnt (ext4)");
  EXPECT_FALSE(load_rates(path, key).has_value());  // no file yet
  store_rates(path, key, rates());
  MachineRates other = rates();
  other.gemm_flops = 5e9;
  store_rates(path, rate_cache_key("other", ""), other);  // a second machine, kept beside it
  const auto back = load_rates(path, key);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->gemm_flops, 100e9);
  EXPECT_EQ(back->adam_bf16_gbps, 8);
  EXPECT_EQ(back->norm_gbps, 40);
  EXPECT_EQ(back->nvme_read_gbps, 2);
  EXPECT_EQ(back->nvme_write_gbps, 1.5);
  EXPECT_EQ(back->nvme_read_busy_gbps, 2);
  EXPECT_EQ(back->nvme_write_busy_gbps, 1.5);
  EXPECT_EQ(back->nvme_steal_s_per_gb, 0.0);  // measured: none (bare metal)
  EXPECT_EQ(back->cpu_threads, 2);
  EXPECT_EQ(back->measured_at, "2026-12-01T17:00:00Z");
  EXPECT_EQ(back->source, path);
  EXPECT_EQ(load_rates(path, rate_cache_key("other", ""))->gemm_flops, 5e9);
  EXPECT_FALSE(load_rates(path, rate_cache_key("a third", "")).has_value());
  MachineRates vm = rates();
  vm.nvme_steal_s_per_gb = 0.3125;
  store_rates(path, key, vm);
  EXPECT_EQ(load_rates(path, key)->nvme_steal_s_per_gb, 0.3125);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(RateCache, CorruptFileIsAnErrorNamingTheFileAndTheFix) {
  const std::string dir = scratch_dir();
  const std::string path = dir + "/rates.json";
  const std::string key = rate_cache_key("test gpu", "259:1 /mnt (ext4)");
  write_bytes(path, "{\"version\": 1, \"machines\": {");  // cut short
  EXPECT_ERROR_HAS(load_rates(path, key), "[plan::rate_cache]", path, "not JSON", "rm '" + path,
                   "never overwritten");
  EXPECT_ERROR_HAS(store_rates(path, key, rates()), path, "not JSON");  // never overwritten silently
  write_bytes(path, "[1, 2]");
  EXPECT_ERROR_HAS(load_rates(path, key), path, "machines");
  store_rates(dir + "/good.json", key, rates());
  std::string text = strata::test::read_bytes(dir + "/good.json");
  const size_t at = text.find("\"gemm_flops\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, text.find(',', at) - at, "\"gemm_flops\": -1");
  write_bytes(path, text);
  EXPECT_ERROR_HAS(load_rates(path, key), path, "gemm_flops = -1", "--reprobe, which replaces the entry");
}

// An entry written before strata measured attention has no attention_flops: it is not an error
// and never read as a made-up rate, but absent, so the rates are measured again and replace it.
TEST(RateCache, EntryWithoutTheAttentionRateIsMeasuredAgain) {
  const std::string path = scratch_dir() + "/rates.json";
  const std::string key = rate_cache_key("test gpu", "259:1 /mnt (ext4)");
  store_rates(path, key, rates());
  std::string text = strata::test::read_bytes(path);
  const size_t at = text.find("\"attention_flops\"");
  ASSERT_NE(at, std::string::npos);
  text.erase(at, text.find('\n', at) + 1 - at);
  write_bytes(path, text);
  EXPECT_FALSE(load_rates(path, key).has_value());
  store_rates(path, key, rates());
  ASSERT_TRUE(load_rates(path, key).has_value());
  EXPECT_EQ(load_rates(path, key)->attention_flops, 100e9);
}

// Nor an entry an earlier probe measured (1: before the CPU's GEMM rate was its median call's:
// the best call's ran 5-8 % above the median, which a step's linear layers do not exceed; 2:
// before the bf16-state AdamW and the gradient norm were measured).
TEST(RateCache, EntryOfAnEarlierProbeIsMeasuredAgain) {
  const std::string path = scratch_dir() + "/rates.json";
  const std::string key = rate_cache_key("test gpu", "259:1 /mnt (ext4)");
  store_rates(path, key, rates());
  ASSERT_TRUE(load_rates(path, key).has_value());
  const std::string stored = strata::test::read_bytes(path);
  const size_t at = stored.find("\"probe\": 3");
  ASSERT_NE(at, std::string::npos) << stored;
  for (const char* older : {"\"probe\": 1", "\"probe\": 2", "\"probe\": \"3\"", "\"probe0\": 3"}) {
    std::string text = stored;
    text.replace(at, std::string("\"probe\": 3").size(), older);
    write_bytes(path, text);
    EXPECT_FALSE(load_rates(path, key).has_value()) << text;
  }
  store_rates(path, key, rates());  // replaced by the new measurement
  ASSERT_TRUE(load_rates(path, key).has_value());
}

// Nor the NVMe rates beside compute: an entry from before they were measured is measured again.
TEST(RateCache, EntryWithoutTheBusyNvmeRatesIsMeasuredAgain) {
  const std::string path = scratch_dir() + "/rates.json";
  const std::string key = rate_cache_key("test gpu", "259:1 /mnt (ext4)");
  store_rates(path, key, rates());
  std::string text = strata::test::read_bytes(path);
  for (const char* name : {"\"nvme_read_busy_gbps\"", "\"nvme_write_busy_gbps\""}) {
    const size_t at = text.find(name);
    ASSERT_NE(at, std::string::npos) << name;
    text.erase(at, text.find('\n', at) + 1 - at);
  }
  // (Neither is the entry's last member, whose line has no comma: the JSON stays valid.)
  write_bytes(path, text);
  EXPECT_FALSE(load_rates(path, key).has_value()) << text;
  // Without an NVMe path the entry has no NVMe rates to miss.
  const std::string plain = rate_cache_key("test gpu", "");
  MachineRates r = rates();
  r.nvme.clear();
  store_rates(path, plain, r);
  EXPECT_TRUE(load_rates(path, plain).has_value());
}

// Nor the steal beside them (an entry from before it was measured): measured again. A negative
// one is a damaged entry, named with the fix.
TEST(RateCache, EntryWithoutTheStealBesideTheDiskIsMeasuredAgain) {
  const std::string path = scratch_dir() + "/rates.json";
  const std::string key = rate_cache_key("test gpu", "259:1 /mnt (ext4)");
  store_rates(path, key, rates());
  const std::string good = strata::test::read_bytes(path);
  const size_t at = good.find("\"nvme_steal_s_per_gb\"");
  ASSERT_NE(at, std::string::npos);
  std::string text = good;
  text.erase(at, text.find('\n', at) + 1 - at);  // (not the last member: the JSON stays valid)
  write_bytes(path, text);
  EXPECT_FALSE(load_rates(path, key).has_value()) << text;
  text = good;
  text.replace(at, text.find(',', at) - at, "\"nvme_steal_s_per_gb\": -0.5");
  write_bytes(path, text);
  EXPECT_ERROR_HAS(load_rates(path, key), path, "nvme_steal_s_per_gb = -0.5", "--reprobe");
}
