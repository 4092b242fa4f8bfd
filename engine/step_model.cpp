// engine/step_model.cpp — the step-time model and the placement choice of engine/step_model.h:
// bytes per link from the layout and the placement decisions (offload/placement.h), times from
// the measured rates, feasibility from plan_memory.
#include "engine/step_model.h"

#include <algorithm>
#include <array>
#include <optional>
#include <set>
#include <string>

#include "core/error.h"
#include "core/size.h"
#include "engine/model.h"
#include "engine/pipeline.h"
#include "engine/zero.h"

namespace strata {
namespace {

constexpr double kTieMargin = 0.01;

// ms to move `bytes` at `gbps` (decimal GB/s); a rate the bytes need but the rates lack is an
// Error rather than a free transfer.
double transfer_ms(double bytes, double gbps, const char* rate) {
  if (bytes <= 0) return 0;
  if (!(gbps > 0))
    fail("plan::step_model", str("the placement moves ", format_bytes(uint64_t(bytes)), " per step at the ",
                                 rate, " rate, which was not measured"),
         "measure the rates again with `strata plan --auto --reprobe` (NVMe rates need "
         "offload.nvme_path)");
  return bytes / (gbps * 1e9) * 1e3;
}

// The window from the start of `cpu_ms` of compute until both it and a disk transfer that began
// with it are done, when the transfer takes `busy_ms` at the disk's rate beside compute and
// `idle_ms` alone: the busy rate while the CPU computes, the idle rate after.
double beside_compute_ms(double cpu_ms, double busy_ms, double idle_ms) {
  if (busy_ms <= cpu_ms) return cpu_ms;
  return cpu_ms + (1 - cpu_ms / busy_ms) * idle_ms;
}

}  // namespace

StepPrediction predict_step(const Config& c, int dp, const PlanMachine& machine,
                            const MachineRates& rates, int stage) {
  const int tp = c.parallel.tp, pp = c.parallel.pp;
  STRATA_CHECK(stage >= 0 && stage < pp, "plan::step_model", "stage ", stage, " of ", pp);
  const Placement pl = zero_options(c).placement;  // refuses an unresolved "auto"
  const LlamaModel model(c.model, dp, tp, 0, pipeline_partition(c)[size_t(stage)]);
  double shard = 0, padded = 0;  // elements of this rank's shards, and of the whole units
  for (const auto& u : model.units()) {
    shard += double(u.layout.shard_numel());
    padded += double(u.layout.padded_numel());
  }

  const int ranks_here = machine.ranks_here > 0 ? machine.ranks_here : dp * tp * pp;
  const bool cpu = machine.device_is_host_memory;
  // CPU rates are shared by the ranks of this machine; a GPU's own rates are not. The CPU's
  // compute (GEMM on the CPU device, AdamW) runs on train.threads of the threads it was
  // measured with.
  const double share = 1.0 / ranks_here;
  const int measured_threads = std::max(rates.cpu_threads, 1);
  const int threads = c.train.threads > 0 ? std::min(c.train.threads, measured_threads) : measured_threads;
  const double cpu_share = std::min(share, double(threads) / measured_threads);
  const double gemm = rates.gemm_flops * (cpu ? cpu_share : 1.0);
  // The CPU AdamW's kernel for the states' dtype: with bf16 m and v it converts as it streams,
  // slower per byte than the f32 one (an earlier probe did not measure it: the f32 rate).
  const bool bf16_states = pl.state == DType::bf16;
  const double adam_rate =
      bf16_states && rates.adam_bf16_gbps > 0 ? rates.adam_bf16_gbps : rates.adam_gbps;
  const double adam_gbps = adam_rate * cpu_share;
  const double device_gbps = rates.device_mem_gbps * (cpu ? cpu_share : 1.0);
  const double h2d_gbps = rates.h2d_gbps * (cpu ? share : 1.0);
  const double d2h_gbps = rates.d2h_gbps * (cpu ? share : 1.0);
  const double read_gbps = rates.nvme_read_gbps * share, write_gbps = rates.nvme_write_gbps * share;
  // On the CPU device the disk serves the passes beside compute on every core, at the rates
  // measured so (when they were); a GPU's compute leaves the CPU, and the disk, alone.
  auto busy = [&](double busy_gbps, double idle_gbps) {
    return cpu && busy_gbps > 0 ? busy_gbps * share : idle_gbps;
  };
  const double read_busy_gbps = busy(rates.nvme_read_busy_gbps, read_gbps);
  const double write_busy_gbps = busy(rates.nvme_write_busy_gbps, write_gbps);
  // On the CPU device the NVMe bytes moved beside compute cost the cores this much wall time:
  // the steal they cause (core-seconds per GB, machine-wide: every rank's bytes count) spread
  // over the threads this rank computes on.
  auto steal_ms = [&](double bytes) {
    if (!cpu || !(rates.nvme_steal_s_per_gb > 0) || bytes <= 0) return 0.0;
    return rates.nvme_steal_s_per_gb * bytes / 1e9 * 1e3 / (measured_threads * cpu_share);
  };

  const int m = c.train.grad_accum;
  const double tokens = double(m) * c.data.micro_batch * c.data.seq_len;
  const double attention = rates.attention_flops * (cpu ? cpu_share : 1.0);
  if (!(gemm > 0) || !(attention > 0))
    fail("plan::step_model", str("the ", gemm > 0 ? "attention" : "GEMM", " rate was not measured"),
         "run `strata plan --auto --reprobe`");
  // Forward and backward at the GEMM rate, but for attention at its own; the backward does twice
  // the forward's work, three times with activation checkpointing (the forward again).
  const double attention_flops =
      model.attention_flops_per_token(c.data.seq_len) * tokens / (double(tp) * pp);
  const double gemm_flops =
      model.train_flops_per_token(c.data.seq_len) * tokens / (double(tp) * pp) - attention_flops;
  const double pass_ms = (gemm_flops / gemm + attention_flops / attention) / 3 * 1e3;
  StepPrediction p;
  const double fwd_compute = pass_ms;
  const double bwd_compute = pass_ms * (c.zero.activation_checkpointing ? 3.0 : 2.0);
  p.compute_ms = fwd_compute + bwd_compute;

  // Bytes per step (engine/zero.h's protocol; docs/tuning.md "What each placement moves").
  StepBytes& b = p.bytes;
  const double P = shard * double(pl.param_elem_bytes());  // the compute copy's shard
  const double S = shard * 4;                               // an f32 shard (gradients)
  const double O = shard * double(pl.optimizer_state_bytes());
  // Gathers of the compute copy per pass: one per micro-batch; backward gathers again unless
  // the units stay gathered from forward to backward.
  const double fwd_gathers = m, bwd_gathers = c.zero.reshard_after_forward ? m : 0;
  const bool offload_opt = pl.optimizer != Tier::device;
  // Where the gathers round the master (Placement::param_rounds_master) they read its f32 shard
  // from NVMe, none for the first units whose states are kept in host memory.
  const bool rounds = pl.param_rounds_master();
  const int host_units = optimizer_host_units(model, pl);
  const double R = rounds ? (shard - double(optimizer_host_elems(model, pl))) * 4 : P;
  double fwd_h2d = 0, bwd_h2d = 0, fwd_read = 0, bwd_read = 0;
  if (pl.params != Tier::device) {  // staged to the device before every gather
    fwd_h2d = fwd_gathers * (rounds ? S : P);
    bwd_h2d = bwd_gathers * (rounds ? S : P);
  }
  // The share of the forward's gathers rounded from the master (the rest cast a kept copy).
  double fwd_rounded = rounds ? 1.0 : 0.0;
  if (pl.params == Tier::nvme) {
    fwd_read = fwd_gathers * R;
    bwd_read = bwd_gathers * R;
    // An update keeps the compute copy it wrote for the next forward's gather of that unit
    // (PinnedStaging::forward_shards buffers, freed as the forward gathers them): a clipped
    // overlapped step's forward follows the updates unit by unit and takes every unit's from
    // there (two buffers: one filling while the forward gathers the other); a serial step
    // updates every unit first, so the forward takes the first units' only, and an unclipped
    // step's worker keeps up during the backward and keeps the embedding's alone.
    const int kept_shards =
        pinned_staging(model, pl, c.offload.pinned_mem_limit, c.offload.prefetch).forward_shards;
    int kept_units = 0;
    if (kept_shards > 0) {
      if (!offload_opt || !c.offload.overlap_optimizer) kept_units = kept_shards;  // serial
      else if (c.train.grad_clip > 0.0f && kept_shards >= 2) kept_units = model.num_units();
      else kept_units = 1;
    }
    kept_units = std::min(kept_units, model.num_units());
    double kept_bytes = 0;
    for (int u = rounds ? host_units : 0; u < kept_units; ++u)
      kept_bytes += double(model.unit(u).layout.shard_numel()) * double(pl.param_read_bytes());
    fwd_read -= kept_bytes;  // the first micro-batch's gathers
    if (rounds && R > 0) fwd_rounded -= kept_bytes / (fwd_gathers * R);
  }
  // Each reduction into the host shard (none where the backward accumulates into it in place).
  const double bwd_d2h =
      pl.grads_tier() == Tier::host && !pl.aliased_grads(dp, cpu) ? m * S : 0;
  double opt_h2d = 0, opt_d2h = 0, opt_read = 0, opt_write = 0;
  // (offload.optimizer_host_bytes: the first units' states stay in host memory, off the disk)
  const double kept = double(optimizer_host_elems(model, pl));  // 0 unless on NVMe
  if (pl.optimizer == Tier::nvme)
    opt_read = opt_write = O - kept * double(pl.optimizer_state_bytes());
  // Gradients on NVMe (but the kept units'): written during the backward, as each unit's is
  // final, and read back by the updates (never ahead: they are written last).
  const double grad_io = pl.nvme_grads() ? (shard - kept) * 4 : 0.0;
  opt_read += grad_io;
  if (!pl.param_is_master()) {  // the optimizer writes the refreshed compute copy to its tier
                                // (none where the gathers round the master)
    if (pl.params == Tier::nvme) opt_write += P;
    if (offload_opt && pl.params == Tier::device) opt_h2d += P;
    if (!offload_opt && pl.params != Tier::device) opt_d2h += P;
  }
  b.h2d = fwd_h2d + bwd_h2d + opt_h2d;
  b.d2h = bwd_d2h + opt_d2h;
  b.nvme_param_read = fwd_read + bwd_read;
  b.nvme_read = b.nvme_param_read + opt_read;
  b.nvme_write = opt_write + grad_io;
  // AdamW reads master, gradient, m, v and writes master, m, v (28 bytes per parameter with f32
  // m and v, 20 with bf16), plus the compute copy when it is not the master.
  b.adam = shard * (4.0 + 2.0 * pl.optimizer_state_bytes()) +
           (pl.param_is_master() && !rounds ? 0.0 : P);  // (rounded: the forward's kept copies)

  // Collectives (dp > 1), as the engine counts comm_bytes: each gather all-gathers the unit's
  // compute copy, each micro-batch's backward reduce-scatters its f32 gradients.
  double fwd_comm = 0, bwd_comm = 0;
  if (dp > 1) {
    fwd_comm = fwd_gathers * padded * double(pl.param_elem_bytes());
    bwd_comm = bwd_gathers * padded * double(pl.param_elem_bytes()) + m * padded * 4;
  }
  b.comm = fwd_comm + bwd_comm;
  const bool count_comm = dp > 1 && rates.comm_gbps > 0;
  const double fwd_comm_ms = count_comm ? transfer_ms(fwd_comm, rates.comm_gbps, "communication") : 0;
  const double bwd_comm_ms = count_comm ? transfer_ms(bwd_comm, rates.comm_gbps, "communication") : 0;
  p.comm_ms = fwd_comm_ms + bwd_comm_ms;

  // The passes: reads and copies run ahead of compute (offload.prefetch, zero.prefetch); so do
  // the collectives on a GPU. On the CPU device the collectives' and the host⇄device copies'
  // memcpys run on the compute's cores: they add to the pass (only the disk overlaps it). A
  // bf16 compute copy is not copied there but cast to f32 into the gather's slot, whatever its
  // tier (the device's own shards too), the whole unit once gathered: its bf16 bytes read and
  // twice as many written, the traffic of a copy of 1.5 times its bytes. (Measured on the
  // oversize slice, 2-core Xeon VM: the casts took 0.68 s a step; the copy rate gives 0.34 s
  // for the bf16 bytes, 0.51 s for 1.5 times them.) A gather that rounds the f32 master reads
  // and writes 4 bytes an element: a copy of twice the bf16 bytes.
  const bool cpu_cast = cpu && pl.param_elem_bytes() == 2;
  const double unit_bytes = padded * double(pl.param_elem_bytes());
  const double fwd_cast =
      cpu_cast ? (1.5 + 0.5 * fwd_rounded) * fwd_gathers * unit_bytes : fwd_h2d;
  const double bwd_cast = cpu_cast ? (rounds ? 2.0 : 1.5) * bwd_gathers * unit_bytes : bwd_h2d;
  const double fwd_read_ms = transfer_ms(fwd_read, read_busy_gbps, "NVMe read");
  const double bwd_read_ms = transfer_ms(bwd_read, read_busy_gbps, "NVMe read");
  const double fwd_copy_ms = transfer_ms(fwd_cast, h2d_gbps, "host-to-device copy");
  const double bwd_copy_ms = transfer_ms(bwd_cast, h2d_gbps, "host-to-device copy") +
                             transfer_ms(bwd_d2h, d2h_gbps, "device-to-host copy");
  // offload.optimizer_read_ahead: that many bytes of the states are read during the last
  // backward, beside its parameter reads, instead of after the norm (clipped) or at the end of
  // the backward (unclipped: the first units, which it finishes last).
  const double ahead_bytes = std::min(opt_read - grad_io, double(read_ahead_bytes(model, pl)));
  const double grad_write_ms = transfer_ms(grad_io, write_busy_gbps, "NVMe write");
  // On the CPU device a pass's reads (and the read-ahead, and the gradients' writes) run beside
  // its compute: their steal lengthens it.
  const double fwd_steal = steal_ms(fwd_read);
  const double bwd_steal = steal_ms(bwd_read + ahead_bytes + grad_io);
  const double fwd_busy = cpu ? fwd_compute + fwd_comm_ms + fwd_copy_ms + fwd_steal
                              : std::max(fwd_compute, fwd_comm_ms);
  const double bwd_busy = cpu ? bwd_compute + bwd_comm_ms + bwd_copy_ms + bwd_steal
                              : std::max(bwd_compute, bwd_comm_ms);
  p.steal_ms = fwd_steal + bwd_steal;
  const double ahead_ms = transfer_ms(ahead_bytes, read_busy_gbps, "NVMe read");
  const double ahead_idle_ms = transfer_ms(ahead_bytes, read_gbps, "NVMe read");
  p.forward_ms = std::max({fwd_busy, fwd_read_ms, cpu ? 0.0 : fwd_copy_ms});
  p.backward_ms =
      std::max({bwd_busy, bwd_read_ms + ahead_ms + grad_write_ms, cpu ? 0.0 : bwd_copy_ms});

  // The optimizer step.
  const double opt_copy_ms = transfer_ms(opt_h2d, h2d_gbps, "host-to-device copy") +
                             transfer_ms(opt_d2h, d2h_gbps, "device-to-host copy");
  const double opt_read_ms = transfer_ms(opt_read, read_gbps, "NVMe read");
  const double opt_io_ms = opt_read_ms + transfer_ms(opt_write, write_gbps, "NVMe write");
  // The same beside compute (the overlapped orders on the CPU device).
  const double opt_io_busy_ms = transfer_ms(opt_read, read_busy_gbps, "NVMe read") +
                                transfer_ms(opt_write, write_busy_gbps, "NVMe write");
  double adam_ms = 0;
  std::string opt_kind;
  if (!offload_opt) {
    adam_ms = transfer_ms(b.adam, device_gbps, "device memory");
    opt_kind = "optimizer (device)";
  } else {
    adam_ms = transfer_ms(b.adam, adam_gbps, "CPU AdamW");
  }
  // The gradient norm (every step: the metrics log it, clipping needs it) reads the f32
  // gradients once before any update of a clipped step; on the cores where the gradients are in
  // host memory or on the CPU device, else on the GPU (at its memory rate). Not charged where
  // the rate was not measured (an earlier probe).
  const bool host_norm = cpu || pl.grads_tier() != Tier::device;
  const double norm_rate = host_norm ? rates.norm_gbps * cpu_share : device_gbps;
  p.norm_ms = norm_rate > 0 ? transfer_ms(S, norm_rate, "gradient norm") : 0;
  p.optimizer_ms = p.norm_ms + std::max(adam_ms, opt_io_ms) + opt_copy_ms;
  if (offload_opt) opt_kind = adam_ms >= opt_io_ms ? "optimizer (cpu adamw)" : "optimizer (nvme)";
  p.nvme_ms = fwd_read_ms + bwd_read_ms + grad_write_ms + opt_io_ms;
  p.copy_ms = fwd_copy_ms + bwd_copy_ms + opt_copy_ms;

  const double passes = p.forward_ms + p.backward_ms;
  if (!offload_opt || !c.offload.overlap_optimizer) {
    p.exposed_optimizer_ms = p.optimizer_ms;
  } else if (c.train.grad_clip <= 0.0f) {
    // Unclipped: each unit is updated as soon as its gradient is final, what is left during the
    // next forward (ZeroEngine::update_in_backward), so the optimizer overlaps both passes; the
    // disk serves the passes' parameter reads and the optimizer's traffic together, and on the
    // CPU device the AdamW shares the passes' cores.
    // The backward finishes the stage's first two units last, and the next forward needs them
    // first: while the worker keeps up, the forward waits for their updates (on the CPU device
    // for their disk time; the AdamW is counted whole already). When the optimizer or the disk
    // is the bottleneck the worker never idles, and that wait is inside their time.
    // The disk's time at its idle rates, and at its rates beside compute (equal on a GPU).
    const double disk = transfer_ms(fwd_read + bwd_read, read_gbps, "NVMe read") +
                        transfer_ms(grad_io, write_gbps, "NVMe write") + opt_io_ms + opt_copy_ms;
    const double disk_busy =
        fwd_read_ms + bwd_read_ms + grad_write_ms + opt_io_busy_ms + opt_copy_ms;
    double first = 0;  // their share of the states on NVMe (none when kept in host memory)
    const double nvme_states = std::max(shard - kept, 1.0);
    for (int u = optimizer_host_units(model, pl); u < std::min(2, model.num_units()); ++u)
      first += double(model.unit(u).layout.shard_numel()) / nvme_states;
    // What was read ahead of them (offload.optimizer_read_ahead) is off their disk time.
    const double first_ahead_ms = std::min(first * opt_read_ms, ahead_idle_ms);
    const double first_io_ms = opt_io_ms - first_ahead_ms / std::max(first, 1e-12);
    // (on a GPU their share of the norm, summed unit by unit before each update, comes first)
    const double tail = cpu ? first * (opt_io_ms + opt_copy_ms) - first_ahead_ms
                            : first * (p.norm_ms + std::max(adam_ms, first_io_ms) + opt_copy_ms);
    // On the CPU device the disk runs at its busy rates while the cores compute, then at its
    // idle ones; the first units' wait (tail) leaves the cores idle.
    // The optimizer's bytes moved while the cores compute cost them their steal (the read-ahead's
    // is the backward's already).
    double cores = passes + p.norm_ms + adam_ms + opt_copy_ms;
    if (cpu && disk_busy > 0) {
      const double beside = std::min(1.0, cores / disk_busy);
      const double s = steal_ms(beside * (opt_read - ahead_bytes + opt_write));
      cores += s;
      p.steal_ms += s;
    }
    const double step = cpu ? std::max(beside_compute_ms(cores, disk_busy, disk), cores + tail)
                            : std::max({passes + tail, p.optimizer_ms, disk});
    p.exposed_optimizer_ms = step - passes;
  } else if (cpu) {
    // The AdamW runs on the cores the forward computes on: only the disk time can hide, at the
    // disk's busy rates while the cores work and its idle ones after. What was read ahead during
    // the backward is off it.
    const double rest_read = opt_read - ahead_bytes;
    const double io_idle = transfer_ms(rest_read, read_gbps, "NVMe read") +
                           transfer_ms(opt_write, write_gbps, "NVMe write");
    const double io_busy = transfer_ms(rest_read, read_busy_gbps, "NVMe read") +
                           transfer_ms(opt_write, write_busy_gbps, "NVMe write");
    double cores = p.forward_ms + p.norm_ms + adam_ms + opt_copy_ms;
    if (io_busy > 0) {  // the bytes moved while the cores work cost them their steal
      const double s = steal_ms(std::min(1.0, cores / io_busy) * (rest_read + opt_write));
      cores += s;
      p.steal_ms += s;
    }
    // The disk's part waits for the norm too (beyond the read-ahead, the updates' reads and
    // writes follow it).
    const double window =
        std::max(beside_compute_ms(cores, io_busy, io_idle), p.norm_ms + io_idle + opt_copy_ms);
    p.exposed_optimizer_ms = window - p.forward_ms;
  } else {
    // The norm first: every update waits for it, and the forward for the updates.
    const double after_norm = std::max(adam_ms, opt_io_ms - ahead_idle_ms) + opt_copy_ms;
    p.exposed_optimizer_ms = p.norm_ms + std::max(0.0, after_norm - p.forward_ms);
  }
  p.step_ms = passes + p.exposed_optimizer_ms;

  // The bottleneck: the largest share of the step — compute, the excess of a pass over its
  // compute (reads or copies), or the optimizer's exposed part.
  double read_excess = 0, copy_excess = 0, comm_excess = 0;
  for (auto [pass, compute, busy, read, copy] :
       {std::array{p.forward_ms, fwd_compute, fwd_busy, fwd_read_ms, fwd_copy_ms},
        std::array{p.backward_ms, bwd_compute, bwd_busy, bwd_read_ms, bwd_copy_ms}}) {
    if (cpu) {  // busy = compute + collectives + copies; only the reads run beside it
      comm_excess += busy - compute - copy;
      copy_excess += copy;
      read_excess += pass - busy;
    } else {
      comm_excess += busy - compute;
      (read >= copy ? read_excess : copy_excess) += pass - busy;
    }
  }
  const std::array<std::pair<double, std::string>, 5> parts = {{
      {p.compute_ms, "compute"},
      {comm_excess, "communication"},
      {read_excess, "nvme (parameter reads)"},
      {copy_excess, "host-device copies"},
      {p.exposed_optimizer_ms, opt_kind},
  }};
  p.bottleneck = std::max_element(parts.begin(), parts.end(),
                                  [](const auto& a, const auto& z) { return a.first < z.first; })
                     ->second;
  return p;
}

std::string PlacementCandidate::name() const {
  return str("params=", tier_name(params), " grads=", tier_name(grads), " optimizer=", tier_name(optimizer),
             optimizer_host_bytes ? str(" optimizer_host_bytes=", optimizer_host_bytes) : "",
             optimizer_read_ahead ? str(" optimizer_read_ahead=", *optimizer_read_ahead) : "");  // exact
}

Config with_placement(Config c, const PlacementCandidate& k) {
  c.offload.params = k.params;
  c.offload.grads = k.grads;
  c.offload.optimizer = k.optimizer;
  c.offload.optimizer_host_bytes = k.optimizer == Tier::nvme ? k.optimizer_host_bytes : 0;
  if (k.optimizer_read_ahead) c.offload.optimizer_read_ahead = *k.optimizer_read_ahead;
  return c;
}

AutoPlan plan_placements(const Config& c, int dp, const PlanMachine& machine,
                         const MachineRates& rates) {
  const OffloadConfig& o = c.offload;
  const bool vary_all = !o.any_auto();
  auto options = [&](const TierSetting& s, std::vector<Tier> all) {
    return vary_all || s.automatic ? all : std::vector<Tier>{s.tier};
  };
  const bool nvme = !o.nvme_path.empty();
  std::vector<Tier> tiers = {Tier::device, Tier::host};
  if (nvme) tiers.push_back(Tier::nvme);
  AutoPlan plan;
  std::set<std::string> limit_names;
  // NVMe optimizer candidates get a twin that keeps states in RAM (see step_model.h) unless the
  // optimizer tier or the budget is the user's; a twin must keep at least one whole unit of
  // stage 0, whose model is the same for every placement.
  const bool twins = nvme && (vary_all || o.optimizer.automatic) && o.optimizer_host_bytes == 0;
  std::optional<LlamaModel> first_stage;
  if (twins) first_stage.emplace(c.model, dp, c.parallel.tp, 0, pipeline_partition(c)[0]);
  // A candidate's bytes, fit and prediction in stage st (the largest and slowest over the stages).
  auto evaluate = [&](PlacementCandidate& k, int st) {
    const Config cc = with_placement(c, k);
    const MemoryPlan mp = plan_memory(cc, dp, machine, st);
    k.device_bytes = std::max(k.device_bytes, mp.tier_bytes("device"));
    k.pinned_bytes = std::max(k.pinned_bytes, mp.tier_bytes("pinned"));
    k.host_bytes = std::max(k.host_bytes, mp.tier_bytes("host"));
    k.nvme_bytes = std::max(k.nvme_bytes, mp.tier_bytes("nvme"));
    for (const PlanCheck& ch : mp.checks) {
      // Each limit once, from the first candidate that is checked against it (the pinned budget
      // and the NVMe space only apply to placements that stage or swap).
      if (limit_names.insert(ch.limit_name).second)
        plan.limits.push_back(str(ch.what, ": ", format_bytes(ch.limit), " (", ch.limit_name, ")"));
      if (!ch.ok() && k.fits) {
        k.fits = false;
        k.why_not = str(ch.what, " needs ", format_bytes(ch.need), " of ", format_bytes(ch.limit));
      }
    }
    const StepPrediction sp = predict_step(cc, dp, machine, rates, st);
    if (st == 0 || sp.step_ms > k.prediction.step_ms) k.prediction = sp;
    return mp;
  };
  // Per rank, in every stage: the RAM a twin of `k` (keeping nothing yet) may keep states in.
  auto spare_ram = [&](const PlacementCandidate& k) {
    uint64_t spare = ~uint64_t(0);
    for (int st = 0; st < c.parallel.pp; ++st) {
      const MemoryPlan mp = plan_memory(with_placement(c, k), dp, machine, st);
      const uint64_t room = uint64_t(kKeptShareOfRam * double(mp.host_limit));
      const uint64_t free = room > mp.host_need ? room - mp.host_need : 0;
      spare = std::min(spare, free / uint64_t(mp.ranks_here));
    }
    return spare;
  };
  // The share of a kept twin's RAM its states may take: all of it, or with gradients on NVMe
  // (a kept unit's gradient stays in host memory beside its states) master, m and v of
  // master, m, v and gradient. Only m and v's dtype decides it.
  Placement states;
  states.state = c.train.optimizer_state_dtype;
  const double nvme_grads_share = double(states.optimizer_state_bytes()) /
                                  double(states.optimizer_state_bytes() + 4);
  auto grad_tiers = [&](Tier opt) -> std::vector<Tier> {
    if (opt == Tier::device) {
      std::vector<Tier> g = options(o.grads, {Tier::device, Tier::host});
      return g.size() == 1 && g[0] == Tier::nvme ? std::vector<Tier>{} : g;
    }
    const bool nvme_ok = opt == Tier::nvme && c.train.grad_accum == 1;
    if (vary_all || o.grads.automatic)
      return nvme_ok ? std::vector<Tier>{Tier::host, Tier::nvme} : std::vector<Tier>{Tier::host};
    if (o.grads.tier == Tier::nvme)
      return nvme_ok ? std::vector<Tier>{Tier::nvme} : std::vector<Tier>{};
    return {Tier::host};
  };
  // Optimizer first (its 12 of 16 bytes move the most), then params, then grads.
  for (Tier opt : options(o.optimizer, tiers))
    for (Tier params : options(o.params, tiers))
      // With the optimizer off the device the gradients are in host memory whatever offload.grads
      // says (Placement::grads_tier), so a fixed grads = device does not rule those out; on NVMe
      // beside an NVMe optimizer, with one micro-batch a step.
      for (Tier grads : grad_tiers(opt)) {
        if (opt == Tier::device && params != Tier::device && !machine.device_is_host_memory)
          continue;  // the device AdamW cannot write a compute copy off the device (zero.cpp)
        PlacementCandidate k;
        k.params = params, k.grads = grads, k.optimizer = opt;
        k.optimizer_host_bytes = opt == Tier::nvme ? o.optimizer_host_bytes : 0;
        k.fits = true;
        for (int st = 0; st < c.parallel.pp; ++st) evaluate(k, st);
        plan.candidates.push_back(k);
        if (!twins || opt != Tier::nvme || !k.fits) continue;
        // The twins keep states in the RAM left free: (with a read-ahead budget) with its memory
        // kept as well, and with the read-ahead as configured. A kept byte saves twice the
        // traffic a byte read ahead does, but the read-ahead starts the first NVMe units' reads
        // during the backward: the prediction decides, and a tie goes to the first listed, which
        // moves fewer bytes.
        for (const bool ra_kept : {true, false}) {
          if (ra_kept && (o.optimizer_read_ahead == 0 || !o.overlap_optimizer)) continue;
          PlacementCandidate kept;
          kept.params = params, kept.grads = grads, kept.optimizer = opt;
          if (ra_kept) kept.optimizer_read_ahead = 0;
          const double share = grads == Tier::nvme ? nvme_grads_share : 1.0;
          kept.optimizer_host_bytes = uint64_t(share * double(spare_ram(kept)));
          const Placement pk = zero_options(with_placement(c, kept)).placement;
          if (kept.optimizer_host_bytes == 0 || optimizer_host_units(*first_stage, pk) == 0)
            continue;  // no whole unit
          kept.fits = true;
          for (int st = 0; st < c.parallel.pp; ++st) evaluate(kept, st);
          plan.candidates.push_back(std::move(kept));
        }
      }
  // A later candidate (more bytes moved) wins only when it is predicted faster by more than
  // kTieMargin: closer than that is a tie within the model's rounding, not a real difference.
  for (int i = 0; i < int(plan.candidates.size()); ++i) {
    const PlacementCandidate& k = plan.candidates[size_t(i)];
    if (k.fits && (plan.chosen < 0 || k.prediction.step_ms < (1 - kTieMargin) *
                                          plan.candidates[size_t(plan.chosen)].prediction.step_ms))
      plan.chosen = i;
  }
  return plan;
}

const PlacementCandidate& chosen_placement(const AutoPlan& plan) {
  if (plan.chosen >= 0) return plan.candidates[size_t(plan.chosen)];
  std::string what = "no placement fits";
  for (const auto& k : plan.candidates) what += str("\n  ", k.name(), ": ", k.why_not);
  what += "\n  limits:";
  for (const auto& l : plan.limits) what += "\n    " + l;
  // NVMe candidates exist only with offload.nvme_path: then its space is what to add.
  bool nvme = false;
  for (const auto& k : plan.candidates)
    nvme |= k.params == Tier::nvme || k.optimizer == Tier::nvme;
  throw Error("plan::auto", what,
              {str("raise offload.device_mem_limit or offload.pinned_mem_limit, ",
                   nvme ? "free space under offload.nvme_path or add folders on other disks to it"
                        : "add offload.nvme_path (NVMe placements)",
                   ", use train.precision = \"bf16\" or more data-parallel ranks")});
}

}  // namespace strata
