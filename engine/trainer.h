// engine/trainer.h — the training loop: data, forward, backward, clipping, AdamW, LR, logging.
//
// A Trainer owns the device, its streams, the model runner and the ZeRO engine for one rank.
// train() runs config.train.steps steps; each step runs train.grad_accum micro-batches through
// the ZeRO-3 schedule (gather ahead, compute, release; backward in reverse with gradients
// reduce-scattered as each unit finishes), then global-norm clipping and AdamW on the shards.
// The loss of a step is the mean over every target token of the global batch.
// Rank 0 writes metrics (JSONL) and the progress line; every rank computes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "engine/checkpoint.h"
#include "engine/checkpoint_writer.h"
#include "comm/comm.h"
#include "engine/config.h"
#include "engine/zero.h"
#include "kernels/device.h"
#include "optimizer/adamw.h"

namespace strata {

struct TestHooks;

struct StepRecord {
  int64_t step = 0;        // 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double compute_ms = 0;   // forward + backward (including waits for gathers)
  double wait_comm_ms = 0; // of compute_ms: the compute stream blocked on communication
  double optimizer_ms = 0; // norm, clipping and AdamW
  uint64_t comm_bytes = 0; // collective buffer bytes this rank enqueued (nccl-tests "size")
  uint64_t tp_comm_bytes = 0;  // the tensor-parallel part of it (activations, kv gradients)
  ZeroTraffic traffic;     // bytes moved per link this step (this rank)
  uint64_t device_peak_bytes = 0;  // largest over ranks (filled on logged steps)
  double tokens_per_s = 0;
  double mfu = 0;
  // Checkpoints: time this step's thread spent on saves (starting one, waiting for the previous
  // one or for a save to read the states before the optimizer step); the step it saved, or -1.
  double checkpoint_stall_ms = 0;
  int64_t checkpoint_saved = -1;
  double eval_loss = -1;   // validation after this step (eval.every), or < 0 when none ran
  // Where the machine's CPU time went during the step (all CPUs; steal: taken by a hypervisor)
  // and this process's CPU time: the difference of readings at its start and end.
  CpuTimes cpu;
};

struct TrainSummary {
  std::vector<double> losses;     // one per step
  double eval_loss = -1;          // after the last step; < 0 when not evaluated
  double best_eval_loss = -1;     // lowest over every evaluation of the run (eval.every)
  int64_t best_eval_step = -1;    // the step it followed
  double tokens_per_s = 0;        // over all steps but the first
  double mfu = 0;
  double seconds = 0;
  int64_t params = 0;
  uint64_t device_peak_bytes = 0;       // largest over ranks
  uint64_t device_peak_bytes_here = 0;  // this rank's (a pipeline stage's own)
  uint64_t host_peak_rss_bytes = 0;
  int stopped_by = 0;  // > 0: ended early by TrainerOptions::stop_requested (its reason)
  int64_t last_step = 0;  // the step the run ended after
};

struct TrainerOptions {
  std::string init_from;        // Hugging Face directory; empty = initialize from train.seed
  // A checkpoint to continue from: a checkpoint.dir root (its newest complete checkpoint) or
  // one step_N folder. The run continues to train.steps; init_from is then ignored.
  std::string resume;
  // What else every rank must agree on, compared with the config by
  // check_same_config_on_every_rank (apps/strata: "--out", the folder and dtype the weights are
  // written to: only rank 0 writes, so a rank given another one would be ignored in silence).
  std::map<std::string, std::string> same_on_every_rank;
  // End the run after this step (> 0), as an interruption would — after saving it when
  // checkpoint.dir is set; the LR schedule still spans train.steps. 0: run to train.steps.
  int64_t stop_after = 0;
  // Polled on every rank after every step and before every evaluation round: 0 to go on, or a
  // positive reason (apps/strata: the number of a SIGTERM, SIGINT or SIGUSR1 that arrived). When
  // it is positive on any rank, every rank ends the run after that same step (an evaluation in
  // progress ends there and reports no loss), saved like stop_after's when checkpoint.dir is
  // set, and TrainSummary::stopped_by is the largest reason over the ranks. Agreeing costs one
  // 8-byte all-reduce over the world per poll (none on one rank). Empty: never polled. Set it on
  // every rank or on none: the polls are collective.
  std::function<int()> stop_requested;
  double peak_flops = 0;        // denominator of MFU; 0 = no MFU
  bool progress = true;         // progress line / log lines on stderr (rank 0)
  CpuOpsMode cpu_ops = CpuOpsMode::fast;  // the scalar reference ops instead (tests)
  // Fault injection and test knobs (engine/test_hooks.h: I/O faults, checkpoint phase and
  // before-step callbacks, a forced CPU AdamW path), for tests and apps/strata's STRATA_FAULT;
  // null in a real run.
  std::shared_ptr<const TestHooks> test_hooks;
  // Called after every step on every rank (tests use it); may be empty.
  std::function<void(const StepRecord&)> on_step;
  // Called on every rank after a step's gradients are reduced, before clipping and AdamW
  // (Trainer::gradient() may be called from it); may be empty.
  std::function<void(int64_t step)> on_gradients;
  // Supplies micro-batches instead of data.path (tests, embedding programs): fills inputs and
  // targets (B × T each) for (step, micro-batch, rank). May be empty.
  std::function<void(int64_t step, int micro, int rank, int32_t* inputs, int32_t* targets)>
      batch_source;
};

// Every rank of a job must run the same configuration. A key that differs between ranks (a config
// file that differs between nodes, a --set given to one rank only) makes the ranks' collectives
// disagree, a hang until parallel.timeout, or lets the replicas drift apart in silence (a learning
// rate that differs). Collective over `world` (nothing to do with one rank): rank 0's effective
// configuration is broadcast and compared key by key; when any rank's differs, every rank throws
// the same Error naming the first such rank, its differing keys and both values. Keys that only
// describe a rank's own machine may differ: offload.nvme_path, train.threads, io.*, log.metrics
// and log.trace. (Paths given outside the config, --init-from and --resume, may differ too: the
// trainer compares what they hold — the model --init-from's folder describes and a fingerprint of
// its weights, the --resume checkpoint's step and manifest hash — through `start`.)
// `start`: what the ranks start from ("--resume": the checkpoint's step and manifest hash,
// "--init-from": a fingerprint of the weights), compared like keys.
void check_same_config_on_every_rank(const Config& config, Communicator& world,
                                     const std::map<std::string, std::string>& start = {});

// The CUDA device a rank trains on: its index among the ranks of its machine (Open MPI's, MPICH's
// or Slurm's local rank; 0 without one) modulo the machine's GPUs. 0 when there is none.
int training_cuda_ordinal();

class Trainer {
 public:
  // world: all ranks of the run (Solo for one process).
  Trainer(const Config& config, Communicator& world, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainSummary train();
  // The last checkpoint save that finished on this rank (step -1 when none).
  CheckpointStats checkpoint_stats() const;
  // Mean loss over eval.batches micro-batches (eval windows i·B … i·B + B − 1) of eval.path or
  // data.path, without touching gradients or optimizer state.
  double evaluate();
  // Writes config.json + model.safetensors (Hugging Face names) to dir (collective).
  void save(const std::string& dir, const std::string& dtype = "f32");
  // The full value of one parameter or of its accumulated gradient, by Hugging Face name
  // (collective).
  std::vector<float> parameter(const std::string& name);
  std::vector<float> gradient(const std::string& name);
  // Overwrites one parameter (master weights and compute copy; collective).
  void set_parameter(const std::string& name, const std::vector<float>& values);
  // Forward of one micro-batch (B × T inputs and targets) without touching gradients: returns the
  // mean loss and, when `logits` is not null, the logits (B × T × V).
  double forward_logits(const int32_t* inputs, const int32_t* targets, std::vector<float>* logits);
  int64_t num_params() const;
  // The effective config: the given one with the model section of --init-from's config.json or
  // of the checkpoint resumed from.
  const Config& config() const;
  std::vector<std::string> parameter_names() const;  // Hugging Face names, in unit order (all stages)
  // This rank's device bytes of model state (shards) and gathered working set (slots), from the
  // ZeRO engine's own accounting.
  ZeroMemory state_memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
