// engine/plan.cpp — the memory plan: per-rank bytes of every state on its tier, the gathered
// working set, staging pools and activations, from the same layout and the same placement
// decisions (offload/placement.h) the engine allocates with; then each tier against its limit.
#include "engine/plan.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/cpu.h"
#include "core/error.h"
#include "core/size.h"
#include "engine/model.h"
#include "engine/zero.h"
#include "offload/swap_space.h"

namespace strata {
namespace {

// Byte counts of the plan: 64-bit and overflow-checked, so an absurd shape or rank count is an
// Error rather than a wrapped total that "fits".
constexpr const char* kPlanBytes = "memory plan bytes";
uint64_t mul(uint64_t a, uint64_t b) { return checked_mul(a, b, kPlanBytes); }
uint64_t add(uint64_t a, uint64_t b) { return checked_add(a, b, kPlanBytes); }

}  // namespace

uint64_t MemoryPlan::tier_bytes(const std::string& tier) const {
  uint64_t b = 0;
  for (const auto& r : rows)
    if (r.tier == tier) b = add(b, r.bytes);
  return b;
}

bool MemoryPlan::fits() const {
  for (const auto& c : checks)
    if (!c.ok()) return false;
  return true;
}

std::string MemoryPlan::failed_checks() const {
  std::string failed;
  for (const auto& c : checks)
    if (!c.ok())
      failed += str(failed.empty() ? "" : "; ", c.what, " needs ", format_bytes(c.need), " but ",
                    c.limit_name, " allows ", format_bytes(c.limit));
  return failed;
}

std::string MemoryPlan::hint() const {
  std::string h;
  bool swap_hinted = false;
  for (const auto& k : checks) {
    if (k.ok()) continue;
    if (k.what.rfind("NVMe swap", 0) == 0 && !std::exchange(swap_hinted, true))
      h += "for the NVMe swap, point offload.nvme_path at writable folders on disks with the "
           "space (a folder on another disk adds its space; with several folders each file is "
           "whole io.stripe_size stripes); ";
    if (k.limit_name == "offload.optimizer_read_ahead")
      h += "raise offload.optimizer_read_ahead to a whole chunk, or set 0 to read only the "
           "pipeline's next chunk ahead; ";
  }
  return h.empty() ? std::string(kDoesNotFitHint) : str(h, "or ", kDoesNotFitHint);
}

MemoryPlan plan_memory(const Config& c, int dp, const PlanMachine& machine, int stage) {
  const int tp = c.parallel.tp, pp = c.parallel.pp;
  STRATA_CHECK(stage >= 0 && stage < pp, "plan::stage", "stage ", stage, " of ", pp);
  const std::vector<StageUnits> stages = pipeline_partition(c);
  // tp rank 0 holds the largest vocabulary part; a stage its own units.
  LlamaModel model(c.model, dp, tp, 0, stages[size_t(stage)]);
  const Placement pl = zero_options(c).placement;
  // The micro-batches this stage's schedule holds at once (1 without pipeline stages).
  const int in_flight = pp == 1 ? 1 : max_in_flight(pipeline_schedule(c.parallel.pp_schedule, pp,
                                                                       stage, c.train.grad_accum));
  MemoryPlan p;
  p.stage = stage;
  p.units = stages[size_t(stage)];
  p.micro_batches_held = in_flight;
  p.params = model.num_params();
  p.ranks_here = machine.ranks_here > 0
                     ? machine.ranks_here
                     : checked_cast<int>(int64_t(dp) * c.parallel.tp * c.parallel.pp,
                                         "ranks = dp x tp x pp");

  uint64_t shard = 0, max_shard = 0;
  for (const auto& u : model.units()) {
    shard = add(shard, u.layout.shard_numel());
    max_shard = std::max<uint64_t>(max_shard, u.layout.shard_numel());
  }
  const bool bf16 = pl.compute == DType::bf16;
  const uint64_t esz = pl.param_elem_bytes();
  const Tier grads = pl.grads_tier();
  auto row = [&](Tier t, const std::string& what, uint64_t bytes, bool pinned = false) {
    if (bytes == 0) return;
    std::string tier = t == Tier::device ? "device" : t == Tier::nvme ? "nvme" : pinned ? "pinned" : "host";
    p.rows.push_back(PlanRow{tier, what, bytes});
  };

  // Shards.
  // offload.optimizer_host_bytes: the first units' states in host memory, the rest on NVMe.
  const uint64_t kept = optimizer_host_elems(model, pl);  // shard elements whose states stay
  // An f32 master that is also the compute copy is pinned in host memory (engine/zero.cpp).
  const bool pinned_master = pl.param_is_master();
  row(Tier::host, "master weights, first units kept (f32)", mul(kept, 4), pinned_master);
  row(Tier::host, str("AdamW m and v, first units kept (", dtype_name(pl.state), ")"),
      mul(kept, 2 * pl.state_elem_bytes()));
  row(pl.optimizer, "master weights (f32 shard)", mul(shard - kept, 4), pinned_master);
  row(pl.optimizer, str("AdamW m and v (", dtype_name(pl.state), " shards)"),
      mul(shard - kept, 2 * pl.state_elem_bytes()));
  if (grads == Tier::nvme) {  // but the first units', whose states stay in host memory
    row(Tier::host, "gradients, first units kept (f32)", mul(kept, 4), true);
    row(Tier::nvme, "gradients (f32 shard)", mul(shard - kept, 4));
  } else {
    row(grads, "gradients (f32 shard)", mul(shard, 4), true);
  }
  if (!pl.param_is_master())
    row(pl.params, bf16 ? "compute copy (bf16 shard)" : "compute copy (f32 shard)", mul(shard, esz), true);
  // The gathered working set: slots sized per unit kind (engine/zero.h).
  auto slot_text = [&](const std::vector<SlotClass>& classes) {
    static const char* kinds[kUnitKinds] = {"embedding", "blocks", "head"};
    std::string t;
    for (const SlotClass& cl : classes) {
      std::string k;
      for (int i = 0; i < kUnitKinds; ++i)
        if (cl.kinds & (1u << i)) k += str(k.empty() ? "" : "+", kinds[i]);
      t += str(t.empty() ? "" : ", ", cl.slots, " ", k);
    }
    return t;
  };
  if (!pl.direct_params(dp)) {
    const auto classes = param_slot_classes(model, pl);
    uint64_t bytes = 0;
    for (const SlotClass& cl : classes) {
      const bool staged = pl.param_shard_staged(dp, machine.device_is_host_memory);
      const uint64_t per = add(mul(cl.numel, bf16 ? 6 : 4),
                               staged ? mul(cl.numel / uint64_t(dp), esz) : 0);
      bytes = add(bytes, mul(uint64_t(cl.slots), per));
    }
    row(Tier::device, str("gathered parameters (", slot_text(classes), ")"), bytes);
  }
  if (!pl.aliased_grads(dp, machine.device_is_host_memory)) {
    const auto classes = grad_slot_classes(model, pl);
    uint64_t bytes = 0;
    for (const SlotClass& cl : classes) bytes = add(bytes, mul(mul(uint64_t(cl.slots), cl.numel), 4));
    row(Tier::device, str("full gradients (", slot_text(classes), ")"), bytes);
    if (dp > 1) row(Tier::device, "reduce-scatter result (1 shard)", mul(max_shard, 4));
  }
  const uint64_t acts = activation_bytes(model, c.data.micro_batch, c.data.seq_len,
                                         c.zero.activation_checkpointing,
                                         c.parallel.sequence_parallel, in_flight);
  const uint64_t logits =
      model.has_head() ? logits_bytes(c.model, c.data.micro_batch, c.data.seq_len, tp) : 0;
  row(Tier::device,
      in_flight == 1 ? std::string("activations (one micro-batch)")
                     : str("activations (", in_flight, " micro-batches in flight)"),
      acts - logits);
  row(Tier::device,
      str("logits (", loss_chunk_rows(c.model, c.data.micro_batch, c.data.seq_len, tp),
          " tokens x ", model.tp().vocab_rows, " vocabulary rows)"),
      logits);
  // Pinned staging pools (engine/zero.h: the engine allocates the same).
  const PinnedStaging staging =
      pinned_staging(model, pl, c.offload.pinned_mem_limit, c.offload.prefetch);
  if (staging.chunk_buffers)
    row(Tier::host,
        str("NVMe optimizer pipeline staging (3 sets x ", pl.chunk_buffers_per_set(), " chunks)"),
        staging.chunk_need(), true);
  // A read-ahead too small for one whole chunk: the engine refuses it (engine/zero.cpp), so the
  // plan does too, with the chunk it needs.
  if (staging.read_ahead_below_chunk)
    p.checks.push_back({"optimizer read-ahead (a whole chunk of master, m and v)",
                        mul(uint64_t(pl.read_ahead_buffers_per_chunk()), staging.chunk_bytes),
                        pl.optimizer_read_ahead, "offload.optimizer_read_ahead"});
  if (staging.ahead_buffers)
    row(Tier::host,
        str("NVMe optimizer state read-ahead (",
            staging.ahead_buffers / pl.read_ahead_buffers_per_chunk(), " chunks)"),
        staging.ahead_need(), true);
  if (staging.grad_shards)
    row(Tier::host, str("NVMe gradient staging (", staging.grad_shards, " shards)"),
        staging.grad_need(), true);
  if (staging.param_shards)
    row(Tier::host, str("NVMe parameter read-ahead staging (", staging.param_shards, " shards)"),
        staging.param_need(), true);
  if (staging.forward_shards)
    row(Tier::host,
        str("NVMe compute copies kept for the forward (", staging.forward_shards, " shards)"),
        staging.forward_need(), true);

  // Checks.
  const uint64_t device_need = p.device_bytes();
  uint64_t device_limit = machine.device_capacity;
  if (c.offload.device_mem_limit) device_limit = std::min(device_limit, c.offload.device_mem_limit);
  p.checks.push_back({"device memory per rank", device_need, device_limit,
                      c.offload.device_mem_limit ? "offload.device_mem_limit" : "the device's size"});
  if (c.offload.pinned_mem_limit && staging.total() > 0)
    p.checks.push_back({staging.ahead_buffers ? "pinned staging per rank (one unit, read-ahead)"
                                              : "pinned staging per rank (at least one unit)",
                        staging.minimum(), c.offload.pinned_mem_limit, "offload.pinned_mem_limit"});
  // The files each rank creates for the NVMe tier (the engine's swap space, one file per
  // folder), checked per file system: folders on one disk, a symlink among them, share its free
  // space. On a file system in memory (tmpfs: /dev/shm) they take RAM as well.
  const uint64_t nvme = p.tier_bytes("nvme");
  std::vector<SwapFileSystem> swap_fs;
  uint64_t swap_share = 0, swap_in_ram = 0;  // per folder's file; per rank, in RAM
  if (nvme > 0) {
    const size_t n = std::max<size_t>(c.offload.nvme_path.size(), 1);
    swap_share =
        swap_file_share(nvme_swap_bytes(model, nvme, n, c.io.stripe_size), n, c.io.stripe_size);
    swap_fs = swap_file_systems(c.offload.nvme_path);
    for (const SwapFileSystem& f : swap_fs)
      if (f.in_memory) swap_in_ram = add(swap_in_ram, mul(swap_share, f.files));
  }
  const uint64_t ram = machine.host_memory ? machine.host_memory : physical_memory_bytes();
  uint64_t host_need = mul(add(add(add(p.tier_bytes("host"), p.tier_bytes("pinned")),
                                   machine.device_is_host_memory ? device_need : 0),
                               swap_in_ram),
                           uint64_t(p.ranks_here));
  p.host_need = host_need;
  p.host_limit = ram;
  std::string included;
  if (machine.device_is_host_memory) included = "CPU device memory";
  if (swap_in_ram)
    included += str(included.empty() ? "" : ", ", "NVMe swap files in memory (tmpfs)");
  p.checks.push_back({str("host memory of ", p.ranks_here, " rank(s)",
                          included.empty() ? "" : str(" (", included, " included)")),
                      host_need, ram, "this machine's RAM"});
  for (const SwapFileSystem& f : swap_fs)
    p.checks.push_back({str("NVMe swap of ", p.ranks_here, " rank(s)"),
                        mul(mul(swap_share, f.files), uint64_t(p.ranks_here)), f.free_bytes,
                        f.problem.empty() ? str("free space in ", f.dirs)
                                          : str("free space in ", f.dirs, " (", f.problem, ")")});
  return p;
}

std::string MemoryPlan::table() const {
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line, "  %-7s %-52s %10s\n", "tier", "state", "per rank");
  out += line;
  for (const char* tier : {"device", "pinned", "host", "nvme"}) {
    for (const auto& r : rows) {
      if (r.tier != tier) continue;
      std::snprintf(line, sizeof line, "  %-7s %-52s %10s\n", r.tier.c_str(), r.what.c_str(),
                    format_bytes(r.bytes).c_str());
      out += line;
    }
  }
  out += "  totals per rank:";
  for (const char* tier : {"device", "pinned", "host", "nvme"})
    out += str(" ", tier, " ", format_bytes(tier_bytes(tier)), ";");
  out += "\n";
  for (const auto& c : checks) {
    std::snprintf(line, sizeof line, "  %-52s %10s of %10s (%s)%s\n", c.what.c_str(),
                  format_bytes(c.need).c_str(), format_bytes(c.limit).c_str(), c.limit_name.c_str(),
                  c.ok() ? "" : "  DOES NOT FIT");
    out += line;
  }
  return out;
}

}  // namespace strata
