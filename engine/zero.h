// engine/zero.h — ZeRO-3 state of a model: every unit's parameters, gradients and optimizer
// states exist only as this rank's shard, each kind on its tier; full parameters are gathered
// just in time.
//
// Per unit u, this rank holds shards of FlatLayout::shard_numel() elements: master (f32), m, v
// (f32, or bf16 under train.optimizer_state_dtype = bf16; on offload.optimizer's tier: device,
// host or nvme), grad (f32, accumulated over micro-batches;
// on the device, or in host memory when offload.grads = host or the optimizer is off the
// device), and the compute copy of the parameters (f32, or bf16 under train.precision = bf16; on
// offload.params' tier; in f32 on the optimizer's tier it is the master itself).
// Gathered full parameters live in a fixed pool of device slots (prefetch + 1, plus one for the
// tied embedding), sized per unit kind (a large embedding or head gets slots of its own, the
// blocks share slots sized for a block), so the gathered working set is bounded by construction
// and never larger than prefetch + 1 slots of the largest unit; gradient slots likewise. All-gathers run on the communication stream and reduce-scatters on a reduction
// stream of their own (over a duplicate communicator, as FSDP does), each ordered against the
// compute stream by events — never by host synchronization. NVMe reads and writes run on the swapper's
// thread through staging buffers of a fixed pinned pool; NVMe reads of compute copies run
// offload.prefetch units ahead of the pass order given to begin_pass(). Once the swapper exists,
// only its thread touches the FileIO (the engine's thread submits jobs and waits for tickets).
//
// Schedule contract (the trainer follows it, in the model's order): begin_pass(order) before a
// forward or backward pass; acquire(u) before unit u computes and release(u) after; prefetch(v)
// may be called for units that will be acquired next. In backward: acquire_grad(u) before unit
// u's backward and reduce_grad(u) after it. Offload never changes a number: every placement
// runs the same operations in the same order on the same values.
//
// Which tier each state lives on, and what follows from it, is offload/placement.h's decision
// (the plan counts by it too). The state is private (engine/zero_state.h); the calls below are
// implemented by concern: placing the states (engine/zero.cpp), the schedule
// (zero_schedule.cpp), the step (zero_step.cpp), weights in and out (zero_weights.cpp) and
// checkpoints (zero_checkpoint.cpp). Tests' hooks (NVMe faults, a forced AdamW path) come in
// through ZeroOptions::test_hooks (engine/test_hooks.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "comm/comm.h"
#include "engine/config.h"
#include "engine/model.h"
#include "kernels/device.h"
#include "offload/placement.h"
#include "optimizer/adamw.h"

namespace strata {

class SafetensorsReader;
class CheckpointSource;
struct CheckpointManifest;
struct TestHooks;

struct ZeroOptions {
  // Where each kind of state lives, the compute copy's dtype and the schedule knobs the slot
  // counts depend on (offload/placement.h: the decisions the engine and the plan share).
  Placement placement;
  // NVMe staging (offload section).
  std::vector<std::string> nvme_path;
  uint64_t pinned_mem_limit = 0;    // 0: as the plan needs
  int nvme_prefetch = 2;            // offload.prefetch: NVMe reads ahead, in units
  // I/O (io section).
  std::string io_backend = "auto";
  int io_queue_depth = 32;
  uint64_t io_block_size = 1ull << 20;
  int io_submit_batch = kDefaultSubmitBatch;
  uint64_t io_stripe_size = 1ull << 20;
  double timeout_s = 600;           // parallel.timeout: bound of every swapper and pool wait
  // This rank in the whole job, for the names of its swap files (strata-<pid>-rank<R>-<i>.swap);
  // -1: the data-parallel rank (a job of dp ranks only). With tp or pp, several ranks share a dp
  // index, and an error naming a file must point at the rank that holds it.
  int world_rank = -1;
  // offload.overlap_optimizer: with the optimizer's states off the device, start_step() returns
  // at once and the next pass overlaps the update (the step's contract below).
  bool overlap_optimizer = true;
  // Tests only (engine/test_hooks.h: NVMe faults, a forced CPU AdamW path); null in a real run.
  std::shared_ptr<const TestHooks> test_hooks;
};

// The engine's options from a config (offload, zero, io sections and train.precision).
ZeroOptions zero_options(const Config& config);

// The gathered-parameter and full-gradient slots of `model` under `placement`, sized per unit
// kind (Placement::slot_classes); the engine allocates these and the plan counts them.
std::vector<SlotClass> param_slot_classes(const LlamaModel& model, const Placement& placement);
std::vector<SlotClass> grad_slot_classes(const LlamaModel& model, const Placement& placement);
// The staging buffers for optimizer states read from NVMe ahead of their update
// (Placement::read_ahead_buffers over this rank's chunks of `model`); the engine allocates these
// and the plan counts them.
int read_ahead_buffers(const LlamaModel& model, const Placement& placement);
// With the optimizer on NVMe: how many of `model`'s first units (forward order) keep their
// optimizer states in host memory under offload.optimizer_host_bytes — whole units, while this
// rank's shards of master, m and v fit; and those units' shard elements. 0 otherwise.
int optimizer_host_units(const LlamaModel& model, const Placement& placement);
uint64_t optimizer_host_elems(const LlamaModel& model, const Placement& placement);
uint64_t read_ahead_bytes(const LlamaModel& model, const Placement& placement);  // their bytes
// The NVMe swap space one rank allocates for `nvme_bytes` of its shards over `dirs` directories
// of offload.nvme_path (offload/swap_space.h's swap_capacity, four extents a unit: master, m, v
// and the compute copy); the engine allocates this and the plan checks it.
uint64_t nvme_swap_bytes(const LlamaModel& model, uint64_t nvme_bytes, size_t dirs,
                         uint64_t stripe_bytes);

// One rank's pinned staging pools under offload.pinned_mem_limit: the engine allocates these and
// the plan counts them, from this one reckoning.
struct PinnedStaging {
  uint64_t chunk_bytes = 0;        // one optimizer-chunk buffer (chunk and read-ahead pools)
  int chunk_buffers = 0;           // the NVMe optimizer pipeline's three sets (0 without chunk I/O)
  int ahead_buffers = 0;           // optimizer states read ahead (offload.optimizer_read_ahead)
  // offload.optimizer_read_ahead is set, states are read from NVMe, and it holds no whole chunk
  // of master, m and v: the engine refuses it and the plan says so, by this one test.
  bool read_ahead_below_chunk = false;
  // One shard a gather reads from NVMe (the compute copy's, or the f32 master's where the gathers
  // round it, Placement::param_rounds_master); 0 unless the params are on NVMe.
  uint64_t param_shard_bytes = 0;
  uint64_t forward_shard_bytes = 0;  // one compute-copy shard kept for the forward (below)
  // NVMe parameter read-ahead: offload.prefetch + 1 shards, or as many whole shards as the budget
  // leaves after the optimizer's pools, and at least one (minimum() checks that one fits).
  int param_shards = 0;
  // The compute copy an update writes to NVMe (or, where the gathers round the master, makes for
  // this alone), kept for the next forward's gather of that unit so the gather does not read it
  // (engine/zero_state.h, ForwardCopies): kForwardShards
  // shards, or as many as the budget leaves after the read-ahead, possibly none.
  static constexpr int kForwardShards = 2;
  int forward_shards = 0;
  // Gradients on NVMe (Placement::nvme_grads): each unit's gradient is staged whole from its
  // backward to its write, in one of Placement::grad_slots() shards of the largest such unit's
  // f32 shard (0 without NVMe gradients).
  uint64_t grad_shard_bytes = 0;
  int grad_shards = 0;

  uint64_t chunk_need() const { return uint64_t(chunk_buffers) * chunk_bytes; }
  uint64_t ahead_need() const { return uint64_t(ahead_buffers) * chunk_bytes; }
  uint64_t param_need() const { return uint64_t(param_shards) * param_shard_bytes; }
  uint64_t forward_need() const { return uint64_t(forward_shards) * forward_shard_bytes; }
  uint64_t grad_need() const { return uint64_t(grad_shards) * grad_shard_bytes; }
  uint64_t total() const {
    return chunk_need() + ahead_need() + param_need() + forward_need() + grad_need();
  }
  // What a rank cannot run without: both optimizer pools whole, the gradients' staging and one
  // parameter shard.
  uint64_t minimum() const {
    return chunk_need() + ahead_need() + grad_need() + param_shard_bytes;
  }
};
PinnedStaging pinned_staging(const LlamaModel& model, const Placement& placement,
                             uint64_t pinned_mem_limit, int nvme_prefetch);

// What this rank holds, by the engine's own accounting.
struct ZeroMemory {
  uint64_t shard_bytes = 0;      // device-resident shards (master, m, v, grad, compute copy)
  uint64_t gathered_bytes = 0;   // device parameter and gradient slots (the gathered working set)
  uint64_t host_bytes = 0;       // host-resident shards
  uint64_t pinned_bytes = 0;     // pinned staging pools (their slabs, rounded up to whole pages)
  uint64_t staging_bytes = 0;    // the pools' buffers (count × buffer bytes): what the plan counts
  int param_staging_shards = 0;  // buffers of the NVMe parameter read-ahead pool
  int forward_shards = 0;        // buffers keeping updated compute copies for the next forward
  uint64_t nvme_bytes = 0;       // swap-space extents
};

// Traffic since the last take_traffic() call.
struct ZeroTraffic {
  uint64_t comm_bytes = 0;       // collective buffer bytes (nccl-tests "size")
  uint64_t gathers = 0;          // units gathered (parameter all-gathers, or copies with dp = 1)
  uint64_t h2d_bytes = 0;        // host → device copies
  uint64_t d2h_bytes = 0;        // device → host copies
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
  double nvme_busy_ms = 0;       // the swapper had I/O in flight
  double nvme_wait_ms = 0;       // the engine's and the optimizer's threads waited for NVMe
  double update_wait_ms = 0;     // passes waited for an overlapped optimizer step's updates
  uint64_t read_ahead_bytes = 0; // optimizer states whose NVMe read was submitted ahead of their
                                 // update (offload.optimizer_read_ahead; in nvme_read_bytes too)
  uint64_t forwarded_bytes = 0;  // compute copies gathered from the update's own buffer instead
                                 // of read back from NVMe (PinnedStaging::forward_shards)
};

class ZeroEngine {
 public:
  // comm carries the all-gathers, reduce the reduce-scatters (over a duplicate of dp), so that
  // neither waits in line behind the other.
  // tp: the tensor-parallel group (null with tp = 1), pp: the pipeline group (null with pp = 1;
  // `model` is then this stage's units), over which the gradient norm also sums.
  ZeroEngine(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute,
             Stream& comm, Stream& reduce, const ZeroOptions& options, Communicator* tp = nullptr,
             Communicator* pp = nullptr);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Initialization: every rank fills only its own shards (engine/zero_weights.cpp).
  void init_from_seed(uint64_t seed);
  void init_from(const SafetensorsReader& reader);

  // ---- the schedule (engine/zero_schedule.cpp) ----
  void begin_pass(const std::vector<int>& order);  // the units' order in the coming pass
  void prefetch(int u);                  // start gathering unit u ahead (a hint; see the step)
  const float* acquire(int u);           // gathered f32 parameters; compute waits for them
  void release(int u);                   // compute is done with unit u's gathered parameters
  float* acquire_grad(int u);            // full f32 gradient buffer of unit u for backward
  void reduce_grad(int u);               // reduce-scatter it into this rank's grad shard (+=)

  // ---- the step (engine/zero_step.cpp) ----
  // Global L2 norm of the gradient (local sum of squares, all-reduced over the dp and tp
  // groups; a replicated tensor counted once: only its primary copy, flat_param.h).
  // Synchronizes the streams first.
  double grad_norm();
  // AdamW on every shard, the refreshed compute copy written to its tier, and every gradient
  // zeroed; grad_scale multiplies gradients (the clipping coefficient). Norm weights are not
  // decayed when `decay_norms` is false. States on NVMe are stepped as a pipeline over chunks
  // (read k+1, update k, write k−1).
  //
  // Overlap (ZeroOptions::overlap_optimizer with the optimizer's states in host memory or on
  // NVMe): the call returns at once and a thread of the engine steps the units in forward order
  // (unit 0 first), zeroing each unit's gradient after its update. The next pass's acquire(u)
  // waits (bounded by parallel.timeout) for unit u's update only, so the update of unit u+1 runs
  // while unit u computes: the NVMe reads ahead (offload.prefetch, begin_pass) skip a unit whose
  // update is pending, and prefetch(v) — called once the compute of the unit before is enqueued —
  // waits for v's update only when v is the unit the pass acquires next; any other unit whose
  // update no pass has waited for yet it leaves to its acquire (a rule of the program's position,
  // not the worker's pace: across ranks the gather is a collective). Every other
  // call that reads or writes states (grad_norm, zero_grads, the weights and checkpoint calls
  // below) waits for the whole step first; finish_step() does so explicitly. The numbers are
  // those of the serial order: the same operations on the same values, each unit's update
  // complete before anything reads it. Without overlap the call returns once every unit is
  // stepped.
  //
  // prepare_step() (optional, overlap only): the gradients are about to become final — call it
  // before the last backward pass of the step. The thread starts now and reads unit 0's states
  // ahead from NVMe while the backward runs; it updates nothing until optimizer_step() gives it
  // the hyper-parameters (the clipping coefficient needs the norm of every final gradient).
  //
  // update_in_backward(h, step, decay_norms) (overlap only; in place of prepare_step() when the
  // step does not clip, grad_scale 1): nothing waits for the norm, so each unit may be updated
  // as soon as the backward that follows has made its gradient final (reduce_grad(u) of that
  // pass; call it before the last backward pass of the step) — the worker takes the final unit
  // with the lowest index first, so the states' NVMe traffic overlaps the backward, and units
  // it has not reached by then are updated during the next forward, each before the pass reads
  // it. Each unit's squares are summed before its update (by the worker, or by grad_norm() for
  // the units it has not reached), so grad_norm() returns the serial order's norm without
  // waiting for updates, and optimizer_step() with the same arguments and grad_scale 1 returns
  // at once (other arguments are an error: the updates are under way). The numbers are the
  // serial order's. Gradients read between the backward and optimizer_step() may be zero
  // (consumed): a caller that needs them (Trainer's on_gradients) uses prepare_step(). Without
  // overlap this does nothing.
  //
  // Example (the trainer's step):
  //   for micro-batch a: forward; if (a == last) zero.prepare_step(); backward
  //   double norm = zero.grad_norm();
  //   zero.optimizer_step(h, step, clip_coefficient(norm, clip), decay_norms);  // returns
  //   next step: begin_pass(forward) ... acquire(0) waits for unit 0's update, not unit 1's
  // and without clipping:
  //   for micro-batch a: forward; if (a == last) zero.update_in_backward(h, step, dn); backward
  //   double norm = zero.grad_norm();  // sums what the worker has not reached
  //   zero.optimizer_step(h, step, 1.0f, dn);  // returns
  void prepare_step();
  void update_in_backward(const AdamWHyper& hyper, int64_t step, bool decay_norms);
  void optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale, bool decay_norms);
  void finish_step();  // waits for a step in flight and rethrows its error; no-op when none
  void zero_grads();

  // ---- weights in and out (engine/zero_weights.cpp) ----
  // Full (unpadded) values of one unit on the host of every rank (gathered; collective).
  std::vector<float> gather_unit_to_host(int u);
  // The same for the accumulated gradient shards.
  std::vector<float> gather_grad_to_host(int u);
  // Overwrites elements [offset, offset + values.size()) of unit u's flat parameters with
  // values (every rank passes the same values and writes its own part of them).
  void set_values(int u, size_t offset, const std::vector<float>& values);
  // Writes the model's units as Hugging Face tensors into dir/file, with config.json when
  // `config` (dp and tp rank 0 writes; collective over dp and tp, unit by unit).
  void save(const std::string& dir, DType dtype, const std::string& file = "model.safetensors",
            bool config = true);

  // ---- checkpoints (engine/zero_checkpoint.cpp; the format is engine/checkpoint.h) ----
  // Where a save reads this rank's master, m and v blocks from: their own memory when the host
  // can address it, a pinned snapshot of device-resident states otherwise (taken here), or NVMe
  // through the swapper (from the writer's thread). Synchronizes the streams. Valid until the
  // next call; the states must not change until the save has read them (see
  // CheckpointWriter::wait_reads).
  CheckpointSource& checkpoint_source();
  // Fills this rank's master, m and v from a checkpoint written by any mesh (global tensor
  // ranges) and refreshes the compute copy; tensors must match the model's names and shapes.
  // m and v take this run's dtype: bf16 ones into f32 states widen exactly, f32 ones into bf16
  // states round to nearest even.
  void load_checkpoint(const std::string& step_dir, const CheckpointManifest& manifest);

  // ---- accounting (engine/zero.cpp) ----
  ZeroMemory memory() const;
  ZeroTraffic take_traffic();
  int dp_size() const;

 private:
  struct Impl;  // the state and the operations on it: engine/zero_state.h
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
