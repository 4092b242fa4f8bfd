// engine/zero_state.h — the ZeRO engine's private state (ZeroEngine::Impl): per-unit shards on
// their tiers, the gather state, parameter and gradient slots, NVMe staging, and the operations
// on them, which ZeroEngine's public calls forward to. Not public API: only engine/zero*.cpp
// include it. The operations are implemented by concern, a file each: engine/zero.cpp (placing
// the states on their tiers, host access to them), zero_schedule.cpp (the gather protocol),
// zero_step.cpp (the optimizer step over the tiers), zero_weights.cpp (initial values, weights
// in and out) and zero_checkpoint.cpp (a save's source, loading).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/checkpoint_writer.h"
#include "engine/zero.h"
#include "kernels/device.h"
#include "offload/pinned_pool.h"

namespace strata {

class FileIO;
class SwapSpace;
class Swapper;

// Where a unit's gathered parameters stand (docs/architecture.md, "The gather protocol"):
//   idle ──fetch──▶ fetching ──gather──▶ gathered ──acquire──▶ held ──release──▶ idle
//   idle ─────────────────────gather──▶ gathered          (compute copy not on NVMe)
// fetching: a staging lease is held and an NVMe read (ticket) is in flight into it;
// gathered: a parameter slot is owned and the gather into it is enqueued on the comm stream;
// held: compute has waited for the slot's `ready` event and reads it until release().
enum class GatherState : uint8_t { idle, fetching, gathered, held };

inline const char* gather_state_name(GatherState g) {
  switch (g) {
    case GatherState::idle: return "idle";
    case GatherState::fetching: return "fetching";
    case GatherState::gathered: return "gathered";
    case GatherState::held: return "held";
  }
  return "?";
}

struct ZeroEngine::Impl {
  // One state's shard on its tier: device or host memory in `mem`, or an extent of the swap
  // space named `key`.
  struct Shard {
    Tier tier = Tier::device;
    Buffer mem;
    std::string key;
    size_t bytes = 0;
    template <class T>
    T* ptr() const { return mem.as<T>(); }
  };

  struct Unit {
    Shard master, m, v;  // master f32, m and v f32 or bf16 (place_.state); the optimizer's tier
    Shard grad;          // f32, the grads tier, accumulated over micro-batches
    Shard param;         // compute copy (f32 or bf16), the params tier; empty when it is the master
    GatherState gather = GatherState::idle;
    int slot = -1;       // parameter slot while gathered or held, else -1
    int grad_slot = -1;  // gradient slot from acquire_grad() to reduce_grad(), else -1
    PinnedPool::Lease fetch_lease;     // while fetching: the staging buffer the read fills
    // Gradients on NVMe (grad.tier): from acquire_grad to reduce_grad, the buffer of grad_pool_
    // the backward accumulates the unit's gradient into (one rank on a device that is host
    // memory; elsewhere reduce_grad leases it for the reduction's result alone).
    PinnedPool::Lease grad_lease;
    uint64_t fetch_ticket = 0;         // while fetching: its swapper ticket (never 0 then)
  };

  struct Slot {
    Buffer full;     // (numel) f32: gathered parameters or a full gradient
    Buffer full16;   // (numel) bf16: gathered compute copy before the cast (bf16 only)
    Buffer shard;    // (numel / dp) staging of an off-device compute copy before the gather
                     // (dp > 1, on a device that cannot address host memory)
    uint64_t numel = 0;  // the largest padded unit it holds (its class's)
    unsigned kinds = 0;  // the unit kinds it serves (bit k: UnitKind k; offload/placement.h)
    std::unique_ptr<Event> ready;  // the gather (or the backward) into `full` has completed
    std::unique_ptr<Event> free;   // the last reader of `full` has completed
    int owner = -1;  // unit held, -1 when free
  };

  // One chunk of the optimizer pipeline: staging for master, m, v, the compute copy and — on
  // NVMe — the gradient (bf16 m and v share buf[1]; buf[2] is then unused).
  struct ChunkSet {
    PinnedPool::Lease buf[5];
    uint64_t read = 0, write = 0;  // swapper tickets, 0 when none: master, m, v
    uint64_t param_write = 0;      // the compute copy's write (a job of its own, submitted first)
    uint64_t grad_read = 0;        // the gradient's read (once it is written: a job of its own)
    size_t grad_chunk = SIZE_MAX;  // the chunk whose gradient buf[4] holds or is reading
  };

  // One chunk of master, m and v read from NVMe ahead of its update (offload.optimizer_read_ahead),
  // in buffers of ahead_pool_ (bf16 m and v share buf[1]); updated in place and written back from
  // there.
  struct AheadChunk {
    PinnedPool::Lease buf[3];
    uint64_t read = 0, write = 0;  // swapper tickets, 0 when none
  };
  // Where state i (master, m, v) of a chunk staged in `buf` lies (a ChunkSet's or an
  // AheadChunk's buffers): its own buffer, or — bf16 m and v — v in the second half of m's;
  // `half` is a chunk's bytes of m.
  static char* staged_state(const PinnedPool::Lease* buf, int i, bool bf16_states, size_t half) {
    if (bf16_states && i == 2) return static_cast<char*>(buf[1].data) + half;
    return static_cast<char*>(buf[i].data);
  }

  // What one optimizer step applies.
  struct StepParams {
    AdamWHyper hyper;
    int64_t step = 0;
    float grad_scale = 1.0f;
    bool decay_norms = true;
  };

  // An overlapped optimizer step (engine/zero.h, optimizer_step): a worker thread steps the
  // units in forward order (a clipped step whose units split between states in memory and
  // states on NVMe: a second thread, run_job's, steps the units in memory, so that the disk's
  // work starts at go instead of behind theirs). Before `go` it only reads ahead
  // (prepare_step); `params` are set before `go` and never change after. updated[u]: unit u's
  // states and compute copy hold the new values (its compute copy at least: the states' last
  // NVMe writes may still drain) and its gradient is zero. `finished`: the workers returned
  // (after the last unit, or with the first `error`). The engine's thread owns the StepJob;
  // the workers read and write the fields under `mu` only (params: after seeing go).
  //
  // An unclipped step (update_in_backward) is `eager`: go is given at the start, and a unit
  // may be updated once final[u] — the last backward reduced its gradient and recorded
  // final_events_[u] after the accumulation. The worker takes the final unit with the lowest
  // index (the one the next forward needs first; while it keeps up, the one the backward just
  // finished), so units it could not reach during the backward are updated during the next
  // forward, in the order the forward needs them. Each unit's squares are summed into the
  // norm's partial sums before its update, by whoever claims it first (normed[u]: 0 not yet,
  // 1 claimed, 2 summed): the worker before updating it, or grad_norm() for every unit the
  // worker has not reached. `released`: every unit's sum is in (grad_norm() may return and the
  // next passes may run, each waiting for its unit's update). `abort`: stop at the first wait
  // for a unit that is not final. go_us: when the worker's last wait ended (trace clock).
  struct StepJob {
    std::mutex mu;
    std::condition_variable cv;
    bool go = false, abort = false, finished = false, eager = false;
    int64_t go_us = 0;  // trace clock when the worker saw go after waiting for it (0: no wait)
    StepParams params;
    std::vector<char> updated;
    std::vector<char> final;   // eager: unit u's gradient is final (its event is recorded)
    std::vector<char> normed;  // eager: 0, 1 (being summed), 2 (summed)
    // in_memory[u]: unit u's update moves no bytes (updates_in_memory); set before the workers
    // start, never changed. split: the second worker steps these units.
    std::vector<char> in_memory;
    bool split = false;
    // The worker's own: unit u's first chunks read ahead (ahead[u][k] is chunk k), whether its
    // update has begun (nothing more is read ahead for it then), the next unit to read ahead and
    // the read-ahead buffers not leased.
    std::vector<std::vector<AheadChunk>> ahead;
    // The worker's own: read-ahead chunks of units already published whose state writes may
    // still be in flight (write-behind) — their buffers return to the pool as each write ends
    // (reap_behind), so the next unit's update does not wait for the last one's writes.
    std::vector<AheadChunk> behind;
    std::vector<char> started;
    int ahead_unit = 0;
    int ahead_free = 0;
    bool released = false;     // eager: every unit's squares are summed
    // The engine's thread: a pass has waited for unit u's update (its acquire, or a prefetch
    // that did not skip it) — set in program order, so the same on every rank whatever the
    // worker's pace (a hinted prefetch decides by it whether to issue a collective).
    std::vector<char> awaited;
    std::exception_ptr error;
    std::thread worker;
  };

  // Compute copies that updates wrote to NVMe, kept in pinned buffers for the next gather of
  // their unit — the next forward's — which then reads nothing back from NVMe
  // (PinnedStaging::forward_shards buffers; no pool when there are none). The optimizer's thread
  // (the overlapped step's worker, or the engine's in a serial step) leases a buffer, updates
  // into it and puts it; the engine's thread takes it in prefetch and returns it behind the comm
  // stream. `mu` orders the two. A unit's buffer holds exactly its compute copy: its next update
  // replaces it, and any other write of the compute copy (write_master_values) drops it.
  struct ForwardCopies {
    std::mutex mu;
    std::unique_ptr<PinnedPool> pool;
    std::vector<PinnedPool::Lease> of_unit;  // per unit: its kept compute copy, or empty

    PinnedPool::Lease try_acquire() {
      std::lock_guard<std::mutex> lock(mu);
      return pool ? pool->try_acquire() : PinnedPool::Lease{};
    }
    // Unit u's compute copy is in `lease` (no I/O in flight on it); an older one goes back.
    void put(int u, PinnedPool::Lease lease) {
      std::lock_guard<std::mutex> lock(mu);
      pool->release(std::exchange(of_unit[size_t(u)], lease));
    }
    PinnedPool::Lease take(int u) {
      std::lock_guard<std::mutex> lock(mu);
      return of_unit.empty() ? PinnedPool::Lease{} : std::exchange(of_unit[size_t(u)], {});
    }
    bool has(int u) {
      std::lock_guard<std::mutex> lock(mu);
      return !of_unit.empty() && of_unit[size_t(u)];
    }
    // Free once `after` has passed the work enqueued on it so far (now when null).
    void release(PinnedPool::Lease lease, Stream* after) {
      if (!lease) return;
      std::lock_guard<std::mutex> lock(mu);
      pool->release(lease, after);
    }
  };

  class Source;  // the engine as the source of a checkpoint save (below)

  // engine/zero.cpp: every state placed on its tier, slots and staging allocated, m, v and
  // grads zeroed; the destructor drains the streams and the swapper first.
  Impl(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute, Stream& comm,
       Stream& reduce, const ZeroOptions& options, Communicator* tp, Communicator* pp);
  ~Impl();
  bool direct_params() const;   // acquire() returns the device shard itself (no slot)
  bool aliased_grads() const;   // backward accumulates straight into the grad shard (no slot)
  bool param_is_master() const; // the compute copy is the master shard
  size_t param_elem_bytes() const { return place_.param_elem_bytes(); }
  const Shard& param_shard(const Unit& s) const;
  // Reads / writes elements [begin, begin + count) of a shard from / to host memory.
  void read_shard(const Shard& sh, size_t esz, size_t begin, size_t count, void* host);
  void write_shard(Shard& sh, size_t esz, size_t begin, size_t count, const void* host);
  // Writes master values (and the matching compute copy) of elements [begin, begin + count).
  void write_master_values(Unit& s, size_t begin, size_t count, const float* values);
  ZeroMemory memory() const;
  ZeroTraffic take_traffic();

  // engine/zero_schedule.cpp: the gather protocol (engine/zero.h's schedule contract).
  void begin_pass(const std::vector<int>& order);
  void fetch_param(int u);      // start the NVMe read of unit u's compute copy (never waits)
  // hint: a look-ahead (ZeroEngine::prefetch), which leaves unit u alone while its update may be
  // outstanding (update_outstanding) unless u is the unit the pass acquires next; acquire's own
  // gather is never a hint.
  void prefetch(int u, bool hint = false);
  const float* acquire(int u);
  void release(int u);
  float* acquire_grad(int u);
  void reduce_grad(int u);
  // Gradients on NVMe: after the work enqueued so far on the reduce stream (the unit's whole
  // gradient is in `lease`), takes unit u's norm parts from it and writes it to its extent on
  // that stream; the buffer goes back to grad_pool_ once written.
  void write_grad(int u, PinnedPool::Lease lease);
  // A free slot of unit u's kind; an Error when none is free or `limit` slots of the pool are
  // owned already (param_slots / grad_slots: the bound the schedule keeps, whatever the classes).
  Slot& take_slot(std::vector<Slot>& pool, int limit, int u, const char* what);
  // A break of the gather protocol: an Error naming the unit, its state and slots (never a wait).
  [[noreturn]] void protocol_violation(int u, const std::string& what) const;
  int checked_unit(int u, const char* op) const;  // u, or an Error when no such unit
  // Every unit idle, no gradient slot (or NVMe gradient staging buffer) owned.
  void check_quiescent(const char* op) const;

  // engine/zero_step.cpp: the optimizer step over the tiers, inline or on the step's thread.
  double grad_norm();
  bool overlapped_step() const;  // overlap on and the states off the device (CPU AdamW)
  void prepare_step();
  void update_in_backward(const StepParams& p);
  void optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale, bool decay_norms);
  // A StepJob and its worker: before go, or (eager) with go and its params given.
  void start_job(bool eager, const StepParams* params = nullptr);
  void run_job(StepJob& job);    // the worker's body
  // The worker's loop over its units (a split step's second worker: in_memory ones, the first
  // worker the others); the first error is kept in job.error.
  void run_units(StepJob& job, bool in_memory);
  // Unit u's update reads and writes nothing: states, gradient and compute copy in memory the
  // host addresses, no staging copy to the device.
  bool updates_in_memory(int u) const;
  // In the worker: reads more optimizer states ahead into ahead_pool_ (offload.
  // optimizer_read_ahead) — the next chunk of the lowest-index unit whose update has not begun —
  // while buffers are free and fewer than kAheadInFlight such reads are in flight. Returns
  // whether a later call could read more (chunks left and buffers for them).
  bool read_ahead(StepJob& job);
  static constexpr int kAheadInFlight = 2;  // enough to keep the disk busy, few enough that
                                            // the passes' parameter reads queue behind little
  // In the worker: waits on job.cv (`lock` held) until pred() or limit_s, reading ahead
  // meanwhile (every 2 ms while read_ahead() has more to do). Returns pred().
  template <class Pred>
  bool wait_reading_ahead(StepJob& job, std::unique_lock<std::mutex>& lock, double limit_s, Pred pred);
  // A read-ahead chunk's buffers back to ahead_pool_ (its tickets waited for).
  void release_ahead(StepJob& job, AheadChunk& a);
  // In the worker: every chunk of job.behind whose write has ended goes back to the pool (no wait).
  void reap_behind(StepJob& job);
  // The worker's end, also on error: waits for every read-ahead ticket still held (errors
  // dropped: the worker's first error is the one reported) and returns the buffers.
  void drain_ahead(StepJob& job) noexcept;
  // reduce_grad(u) of the last backward of an eager step: u's gradient is final once the work
  // enqueued so far on `accumulating` has run.
  void mark_final(int u, Stream& accumulating);
  // Eager: the next unit the worker updates — the lowest-index one not yet updated whose
  // gradient is final and accumulated; else the highest-index one not yet updated (the next the
  // streams finish); -1 when every unit is updated.
  int next_eager_unit(StepJob& job);
  // Eager: unit u's squares in the norm's partial sums — summed here on `stream` when nobody
  // has claimed them, else waited for (bounded). The worker's call first waits (bounded) for u
  // to be final; the engine's thread calls it for final units only.
  void ensure_normed(StepJob& job, int u, Stream& stream);
  // Unit u's partial sums of the gradient norm (its norm_ranges_) into norm_parts_ (via
  // `stream`, synchronized) or norm_host_ (grads the host reads directly on a device it cannot
  // address) — the same operations grad_norm() runs, so the norm is the same either way.
  void unit_norm_parts(int u, Stream& stream);
  // The same from gradient `g` (unit u's whole shard; a staging buffer on its way to NVMe: a
  // unit whose gradient is on NVMe had its parts taken so, and the call above does nothing).
  void unit_norm_parts(int u, Stream& stream, const float* g);
  // In the worker: unit u's compute copy holds the new values — its gradient is zeroed and it is
  // marked updated (the passes may read it) while the states' last writes may still drain.
  void publish_update(StepJob& job, int u);
  // Keep u's updated compute copy (ForwardCopies)? Only when no unit before it that could take
  // a buffer (not in_memory) waits for its update.
  bool forwarded_next(int u, StepJob* gate);
  // An eager step: sums the squares of every unit the worker has not reached, waits (bounded)
  // for the ones it is summing, and releases the step to the passes (each waits for its unit's
  // update, await_update); finish_step() waits for the rest.
  void await_eager_updates();
  // One unit's update, with the test hook before it and its trace span (serial or worker).
  void update_unit(int u, const StepParams& p, StepJob* gate);
  // In the worker, before unit u's first update: waits for go (an eager step: u's squares are
  // summed, ensure_normed); throws on abort.
  void await_go(StepJob& job, int u);
  // The engine's thread, before a pass reads unit u's compute copy: waits for u's update when a
  // started step has not reached it (bounded; the step's error is rethrown).
  void await_update(int u);
  // Whether await_update(u) would wait now: an overlapped step under way has yet to publish u.
  // The NVMe read-ahead (fetch_param) skips such a unit, so that a pass waits for the update of
  // the unit it computes alone; its acquire fetches it. (A hinted prefetch decides by
  // update_outstanding, below: its gather is a collective across ranks.)
  bool update_pending(int u);
  // Whether a started step's update of unit u has not been waited for by a pass yet (acquire, or
  // a prefetch that gathered u). Unlike update_pending it does not depend on the worker's pace:
  // every rank answers alike at the same point of its program.
  bool update_outstanding(int u);
  // Waits for a started step; a prepared one that never started is abandoned. Rethrows the
  // step's error. settle_step() waits only for a started step (a prepared one reads, never
  // writes, so reading states beside it is safe).
  void finish_step();
  void settle_step();
  void step_unit_on_device(int u, const StepParams& p);
  // gate: the job whose `go` the first update waits for (null: inline, go already given).
  void step_unit_chunked(int u, const StepParams& p, StepJob* gate);
  void zero_grads();

  // engine/zero_weights.cpp: initial values, Hugging Face weights in and out, host values.
  void init_from_seed(uint64_t seed);
  void init_from(const SafetensorsReader& reader);
  std::vector<float> gather_unit_to_host(int u);
  std::vector<float> gather_grad_to_host(int u);
  std::vector<float> gather_to_host(int u, bool grads);
  void set_values(int u, size_t offset, const std::vector<float>& values);
  void save(const std::string& dir, DType dtype, const std::string& file, bool config);

  // engine/zero_checkpoint.cpp.
  CheckpointSource& checkpoint_source();
  void load_checkpoint(const std::string& step_dir, const CheckpointManifest& manifest);

  const LlamaModel& model_;
  Device& device_;
  Communicator& dp_;
  Communicator* tp_ = nullptr;
  Communicator* pp_ = nullptr;  // the pipeline group: the gradient norm sums over it too
  std::unique_ptr<Communicator> dp_reduce_;  // a duplicate of dp_ for the reduce stream
  Stream& compute_;
  Stream& comm_;
  Stream& reduce_;
  ZeroOptions opt_;
  const Placement& place_ = opt_.placement;
  Tier grads_tier_;
  std::vector<Unit> units_;
  std::vector<Slot> param_slots_;  // by class (param_slot_classes)
  std::vector<Slot> grad_slots_;   // by class (grad_slot_classes)
  int param_slot_limit_ = 0;       // units held at once: Placement::param_slots
  int grad_slot_limit_ = 0;        // Placement::grad_slots
  Buffer reduce_tmp_;     // one shard of f32 for reduce-scatter results (device)
  Buffer grad_stage_;     // one shard of f32 in pinned host memory (non host-addressable devices)
  // Per unit: this step's gradient shard already holds a micro-batch. Until it does, the shard
  // holds zeros (zeroed at start and after each update), so on a device that cannot address host
  // memory the first reduction copies straight into it and only later ones stage and add.
  // Written and read by the engine's thread alone; cleared by optimizer_step and zero_grads.
  std::vector<uint8_t> grad_accumulated_;
  Buffer param_stage_;    // one compute-copy shard in pinned host memory (the same)
  // Gradients on NVMe: per unit, this step's gradient has been written to its extent and no
  // update has consumed it (else it is zero, and nothing reads the extent). The engine's thread
  // sets it in reduce_grad and clears it as a step's updates begin (optimizer_step), after an
  // unclipped step (finish_step) and in zero_grads.
  // And per unit, the event the reduce stream waits on before it takes the unit's norm parts
  // and writes it (the backward's accumulation into the staging buffer has run).
  std::vector<uint8_t> grad_written_;
  std::vector<std::unique_ptr<Event>> grad_events_;
  // The gradient norm's ranges of each unit's shard (primary views only; the whole shard when
  // every view is primary), and one double per range.
  std::vector<std::vector<std::pair<size_t, size_t>>> norm_ranges_;
  std::vector<size_t> norm_first_;  // index of unit u's first range among every unit's
  Buffer norm_parts_;     // one double per range (device)
  Buffer norm_host_;      // the same on the host
  std::vector<int> order_;  // the current pass's unit order
  int acquired_at_ = -1;    // the index in order_ of the unit the pass acquired last
  // NVMe tier
  std::unique_ptr<FileIO> io_;
  std::unique_ptr<SwapSpace> swap_;
  std::unique_ptr<PinnedPool> param_pool_;  // compute-copy shards read ahead from NVMe
  std::unique_ptr<PinnedPool> chunk_pool_;  // optimizer pipeline chunks
  std::unique_ptr<PinnedPool> ahead_pool_;  // optimizer states read ahead (offload.optimizer_read_ahead)
  ForwardCopies forward_;                   // updated compute copies kept for the next forward
  std::unique_ptr<PinnedPool> grad_pool_;   // gradients on their way to NVMe (Unit::grad_lease)
  // Declared after the pools it reads into and writes from, so it is stopped before they are
  // freed (the destructor also drains and stops it first).
  std::unique_ptr<Swapper> swapper_;
  ZeroTraffic traffic_;
  // The overlapped step (null when none is in flight), the time passes waited for its updates,
  // host → device bytes it moved (the worker's own counter), and the stream it copies a
  // refreshed compute copy to the device on (devices the host cannot address).
  std::unique_ptr<StepJob> job_;
  double update_wait_ms_ = 0;
  std::atomic<uint64_t> step_h2d_bytes_{0};
  std::atomic<uint64_t> read_ahead_bytes_{0};  // the worker's, as step_h2d_bytes_
  std::unique_ptr<Stream> step_stream_;
  // Eager (unclipped) steps: one event per unit, recorded where its last gradient accumulation
  // was enqueued; the worker's own stream for the norm's partial sums; the step the worker
  // applied and whose norm parts it left, until grad_norm() / optimizer_step() take it.
  std::vector<std::unique_ptr<Event>> final_events_;
  std::unique_ptr<Stream> norm_stream_;
  std::optional<StepParams> eager_step_;
  std::optional<AdamIsa> adam_isa_;  // a CPU AdamW path forced by the test hooks, else none
  std::unique_ptr<Source> checkpoint_source_;
};

// The ZeRO engine as the source of a checkpoint save (engine/zero_checkpoint.cpp).
class ZeroEngine::Impl::Source final : public CheckpointSource {
 public:
  explicit Source(Impl& engine) : e_(engine) {}
  const void* block_memory(const CheckpointBlock& block) override;
  uint64_t read_block(const CheckpointBlock& block, uint64_t offset, void* buffer, uint64_t bytes) override;
  void wait_read(uint64_t ticket) override;
  // Copies device-resident states the host cannot address into pinned snapshots.
  void snapshot();

 private:
  Shard& state(const CheckpointBlock& block);
  Impl& e_;
  std::vector<Buffer> snapshots_;  // [unit * 3 + state], empty where not needed
};

}  // namespace strata
