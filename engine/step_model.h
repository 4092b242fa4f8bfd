// engine/step_model.h — the predicted step time of a placement, and the choice among placements
// behind `offload.* = "auto"` and `strata plan --auto`.
//
// Pure functions of (config, ranks, machine, measured rates): nothing is probed or allocated
// here (bench/rate_probe.h measures the rates, engine/rate_cache.h keeps them). Feasibility is
// the memory plan's (engine/plan.h), so a placement "fits" exactly when `strata train` would
// start it. The model is deliberately small; what it counts and what it leaves out:
//
//   per rank and step, m = train.grad_accum micro-batches of B × T tokens,
//   F = LlamaModel::train_flops_per_token(T) × m·B·T (matmuls + causal attention), of which
//   A = attention_flops_per_token(T) × m·B·T runs on the attention kernels,
//   c           = (F − A) ÷ gemm + A ÷ attention (the two measured rates; on an H200 the f32
//                 attention kernel runs at ~1 % of the bf16-operand GEMMs' rate and is most of
//                 the compute of a T = 1024 model; bench/results/h200-2026-12-04-offload.md)
//   compute_fwd = c/3,  compute_bwd = 2c/3 (+ c/3 with activation checkpointing:
//                 the recompute runs inside the backward's gather, so it reads no more bytes);
//                 tensor and pipeline parallelism divide F evenly by tp × pp
//   pass time   = max(compute of the pass, its collectives ÷ comm rate,
//                     its NVMe parameter reads ÷ read rate (on the CPU device the rate measured
//                     beside compute, nvme_read_busy_gbps),
//                     its host→device (and, in backward, gradient device→host) bytes ÷ copy rate)
//                 on a GPU, which overlaps them; on the CPU device, whose cores do the
//                 collectives' and the copies' memcpys, max(compute + collectives + copies,
//                 NVMe parameter reads)
//   collectives = dp > 1: all-gathered bytes per gather (forward, backward) + the gradients
//                 reduce-scattered per micro-batch, at comm_gbps (bench/comm_bench.h),
//                 counted only when that rate was measured (the sweep does; a one-process probe
//                 cannot)
//   optimizer   = device AdamW: bytes ÷ device bandwidth;
//                 host / NVMe: max(CPU AdamW bytes ÷ AdamW rate, NVMe read ÷ r + write ÷ w)
//                              + the refreshed compute copy ÷ copy rate (params on the device)
//   step        = fwd + bwd + optimizer                         (device optimizer, or overlap off)
//               = fwd + bwd + max(0, optimizer − fwd)           (offload.overlap_optimizer, GPU)
//               = bwd + beside(fwd + AdamW, optimizer NVMe time) (overlap on the CPU device:
//                                                        the AdamW shares the compute cores)
//   where beside(cores, disk) = the time until both are done when the disk moves its bytes at
//   the busy rates while the cores compute and at the idle rates after (the CPU device only; a
//   GPU's passes leave the CPU idle, and its disk at the idle rates). The serial optimizer phase
//   runs at the idle rates: its AdamW is a few percent of the phase.
//   unclipped (train.grad_clip = 0, overlap on: the updates run during the backward and the
//   next forward), with disk = both passes' NVMe parameter reads + the optimizer's NVMe time +
//   its copies:
//   step        = max(fwd + bwd + first, optimizer, disk)       (GPU)
//               = max(beside(fwd + bwd + AdamW, disk), fwd + bwd + AdamW + first)  (CPU)
//   where first = the optimizer's time for the stage's first two units (on the CPU device its
//   disk time only): the backward finishes them last and the next forward waits for them.
//   offload.optimizer_read_ahead: its bytes (at most the states') are read during the backward
//   (the backward's disk time grows by them) and come off the optimizer's read time after the
//   norm (clipped) or off the first units' (unclipped).
//   steal (the CPU device only): the NVMe bytes moved while the cores compute — the passes'
//   reads, the read-ahead, and the share min(1, cores ÷ disk time) of an overlapped optimizer's
//   traffic — add nvme_steal_s_per_gb × GB ÷ the rank's threads to the cores' time (compute +
//   collectives + copies of a pass, the cores of beside()): on a VM whose host emulates the disk
//   on the guest's cores, those bytes cost compute (bench/results/
//   cpu-epyc-avx2-2core-2026-12-05d-steal.md). 0 on bare metal.
//
// Not counted: the data-parallel collectives when no comm rate was measured, tensor / pipeline
// parallel traffic, the elementwise ops (norms, rotary, SwiGLU, casts, the loss), the pipeline
// bubble, and contention between the forward's NVMe reads and the optimizer's
// (counted when the step is unclipped). CPU
// rates (GEMM on the CPU device, AdamW, copies, NVMe) are shared by the ranks on one machine;
// the CPU's compute rates scale with train.threads against the threads they were measured with
// (each rank gets min(1 / ranks, threads / measured threads) of them).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/plan.h"

namespace strata {

// The measured rates of one machine (decimal GB/s, FLOP/s); 0 = not measured.
struct MachineRates {
  std::string device;          // the device they were measured on (Device::name())
  std::string nvme;            // the file systems of offload.nvme_path, or "" (rate_cache.h)
  double gemm_flops = 0;       // GEMM FLOP/s of strata's linear path as the config runs it
                               // (CPU device: the median call's, nearer what a step sustains; f32;
                               // on CUDA with bf16 operands under train.matmul_precision)
  double attention_flops = 0;  // the device's causal attention, forward and backward, counted as
                               // LlamaModel::attention_flops_per_token counts it (CUDA: f32 on
                               // the CUDA cores, many times below the GEMMs' tensor-core rate)
  double adam_gbps = 0;        // CPU AdamW, bytes moved per second (28 per f32-state parameter)
  double adam_bf16_gbps = 0;   // the same with bf16 m and v (train.optimizer_state_dtype = "bf16",
                               // 20 per parameter); 0: not measured, adam_gbps
  double norm_gbps = 0;        // the gradient norm's sum of squares over f32 gradients in host
                               // memory, bytes read per second; 0: not measured (not charged)
  double device_mem_gbps = 0;  // the device AdamW's bytes per second (CPU device: adam_gbps)
  double h2d_gbps = 0;         // host → device copies (CPU device: host memory copies)
  double d2h_gbps = 0;         // device → host copies
  double nvme_read_gbps = 0;   // over offload.nvme_path (bench/io_bench.h), 0 without one
  double nvme_write_gbps = 0;
  // The same while every CPU thread computes (bench/rate_probe.h); the model charges the NVMe
  // traffic that runs beside the CPU device's compute at these. 0: not measured, the idle rates.
  double nvme_read_busy_gbps = 0;
  double nvme_write_busy_gbps = 0;
  // CPU seconds (all cores together) a hypervisor took as steal per GB the disk moved beside
  // compute (bench/rate_probe.h): on a VM whose host emulates the disk on the cores its guest
  // computes on, NVMe traffic costs compute. 0 on bare metal, and when not measured.
  double nvme_steal_s_per_gb = 0;
  double comm_gbps = 0;        // data-parallel collectives: a 64M all-gather and reduce-scatter
                               // together, bytes (gathered / reduced) ÷ time; 0: not measured
  int cpu_threads = 0;         // oneTBB threads the CPU rates (GEMM on the CPU device, AdamW) used
  std::string measured_at;     // UTC, ISO 8601
  std::string source;          // where they came from: a cache file, or "measured now" (not stored)
};

// Bytes one rank moves per step on each link.
struct StepBytes {
  double h2d = 0, d2h = 0;              // host ⇄ device copies
  double nvme_read = 0, nvme_write = 0; // all NVMe traffic
  double nvme_param_read = 0;           // of which compute-copy reads during the passes
  double adam = 0;                      // bytes the AdamW pass reads and writes
  double comm = 0;                      // data-parallel collectives (as the engine counts them)
};

struct StepPrediction {
  double forward_ms = 0, backward_ms = 0;  // each pass, reads and copies overlapped with compute
  double compute_ms = 0;         // GEMM FLOPs at the GEMM rate, forward + backward (+ recompute)
  double nvme_ms = 0;            // every NVMe byte at its rate (some of it hidden)
  double copy_ms = 0;            // every host ⇄ device byte at its rate (some of it hidden)
  double comm_ms = 0;            // the data-parallel collectives at the comm rate (0: not counted)
  double norm_ms = 0;            // the gradient norm's pass over the gradients (in optimizer_ms)
  double optimizer_ms = 0;       // the optimizer step on its own
  double exposed_optimizer_ms = 0;  // the part of it the step waits for
  double steal_ms = 0;           // of the parts above: the cores' time a hypervisor takes beside
                                 // the disk (CPU device, MachineRates::nvme_steal_s_per_gb)
  double step_ms = 0;
  std::string bottleneck;        // "compute", "communication", "nvme (parameter reads)", "host-device copies",
                                 // "optimizer (cpu adamw)", "optimizer (nvme)", "optimizer (device)"
  StepBytes bytes;
};

// The prediction for a config whose placement is resolved (no "auto"); stage: the pipeline
// stage (the caller takes the slowest). machine: device_is_host_memory says the CPU device;
// ranks_here (0: dp × tp × pp) share its CPU rates and disks. Throws an Error naming the
// missing rate when the placement needs one the rates lack (NVMe rates without nvme_path).
StepPrediction predict_step(const Config& config, int dp, const PlanMachine& machine,
                            const MachineRates& rates, int stage = 0);

struct PlacementCandidate {
  Tier params = Tier::device, grads = Tier::device, optimizer = Tier::device;
  // With the optimizer on NVMe: offload.optimizer_host_bytes, the user's, or (optimizer "auto")
  // the planner's choice for a second NVMe candidate beside the one that keeps nothing.
  uint64_t optimizer_host_bytes = 0;
  // Set where the planner replaces offload.optimizer_read_ahead: a kept twin that keeps the
  // read-ahead's memory too (0); unset, the configured budget stands.
  std::optional<uint64_t> optimizer_read_ahead;
  bool fits = false;
  std::string why_not;        // the first limit it exceeds, when it does not fit
  uint64_t device_bytes = 0, pinned_bytes = 0, host_bytes = 0, nvme_bytes = 0;  // per rank, largest stage
  StepPrediction prediction;  // the slowest stage's
  // "params=host grads=host optimizer=nvme[ optimizer_host_bytes=4294967296][
  // optimizer_read_ahead=0]": each part a key of [offload] and its value, exact (the bytes too),
  // so that --set reproduces the choice.
  std::string name() const;
};

struct AutoPlan {
  std::vector<PlacementCandidate> candidates;  // every valid combination, all-device first
  int chosen = -1;            // the fastest that fits; -1 when none does
  std::vector<std::string> limits;  // each limit as the plan names it, for messages
};

// Every placement the engine allows with the "auto" keys varied (all three when none is
// "auto"): params and optimizer over device, host, nvme (nvme only with offload.nvme_path;
// params off the device with the optimizer on it only where the device is host-addressable,
// i.e. the CPU device), grads device or host with the optimizer on the device, else host.
// With offload.optimizer = "auto" and no offload.optimizer_host_bytes, each NVMe optimizer
// candidate has a twin that keeps the first units' states in host memory: as many bytes as fit
// in kKeptShareOfRam of this machine's RAM beside everything else the plan puts there (the rest
// is left to the system, the page cache and the planner's misestimates); no twin when no whole
// unit fits. With a read-ahead budget (offload.optimizer_read_ahead, the optimizer overlapped)
// a second twin sets it to 0 and keeps that memory's states as well: a kept byte is neither
// read nor written, a byte read ahead only moves a read from after the norm into the backward.
// Ties — predictions within 1 % — go to the earlier candidate (fewer bytes moved, or the
// configured read-ahead). Does not throw when nothing fits.
inline constexpr double kKeptShareOfRam = 0.8;
AutoPlan plan_placements(const Config& config, int dp, const PlanMachine& machine,
                         const MachineRates& rates);
// The chosen candidate; an Error naming every limit when none fits.
const PlacementCandidate& chosen_placement(const AutoPlan& plan);
// The config with the candidate's tiers in place of its settings ("auto" resolved).
Config with_placement(Config config, const PlacementCandidate& candidate);

}  // namespace strata
