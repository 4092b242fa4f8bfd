// engine/zero.h — ZeRO-3 state of a model: every unit's parameters, gradients and optimizer
// states exist only as this rank's shard; full parameters are gathered just in time.
//
// Per unit u, this rank holds: master (f32), m, v (f32) and grad (f32, accumulated over
// micro-batches) shards of FlatLayout::shard_numel() elements, and the compute copy of the
// parameters (f32, or bf16 under train.precision = bf16; in f32 it is the master itself).
// Gathered full parameters live in a fixed pool of device slots (prefetch + 1, plus one for
// the tied embedding), so the gathered working set is bounded by construction; gradient slots
// likewise. All gathers and reductions run on the communication stream, ordered against the
// compute stream by events — never by host synchronization.
//
// Schedule contract (the trainer follows it, in the model's order): acquire(u) before unit u
// computes and release(u) after; prefetch(v) may be called for units that will be acquired
// next. In backward: acquire_grad(u) before unit u's backward and reduce_grad(u) after it.
// With one rank and device-resident f32 state, gathers and reductions are no-ops (aliases).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/comm.h"
#include "engine/config.h"
#include "engine/model.h"
#include "kernels/device.h"
#include "optimizer/adamw.h"

namespace strata {

class SafetensorsReader;
class SafetensorsWriter;

struct ZeroOptions {
  Precision precision = Precision::fp32;
  int prefetch = 1;                 // units gathered ahead
  bool keep_embedding = false;      // hold unit 0 gathered for the whole step (tied embeddings)
  std::optional<AdamIsa> adam_isa;  // force a CPU AdamW path (tests); default: the active one
};

// What this rank holds, for the engine's own memory accounting.
struct ZeroMemory {
  uint64_t shard_bytes = 0;      // master, m, v, grad and compute-copy shards
  uint64_t gathered_bytes = 0;   // parameter and gradient slots (the gathered working set)
};

class ZeroEngine {
 public:
  ZeroEngine(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute,
             Stream& comm, const ZeroOptions& options);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // Initialization: every rank fills only its own shards.
  void init_from_seed(uint64_t seed);
  void init_from(const SafetensorsReader& reader);

  // ---- the schedule ----
  void prefetch(int u);                  // start gathering unit u (no-op when already gathered)
  const float* acquire(int u);           // gathered f32 parameters; compute waits for them
  void release(int u);                   // compute is done with unit u's gathered parameters
  float* acquire_grad(int u);            // full f32 gradient buffer of unit u for backward
  void reduce_grad(int u);               // reduce-scatter it into this rank's grad shard (+=)

  // ---- the step (host side; synchronizes the streams first) ----
  // Global L2 norm of the gradient (local sum of squares, all-reduced over ranks).
  double grad_norm();
  // AdamW on every shard; grad_scale multiplies gradients (clipping coefficient). Norm
  // weights are not decayed when `decay_norms` is false. Refreshes the compute copy.
  void optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale, bool decay_norms);
  void zero_grads();

  // Full (unpadded) values of one unit on the host of every rank (gathered; collective).
  std::vector<float> gather_unit_to_host(int u);
  // The same for the accumulated gradient shards.
  std::vector<float> gather_grad_to_host(int u);
  // Overwrites elements [offset, offset + values.size()) of unit u's flat parameters with
  // values (every rank passes the same values and writes its own part of them).
  void set_values(int u, size_t offset, const std::vector<float>& values);
  // Writes the model as Hugging Face tensors (rank 0 writes; collective, unit by unit).
  void save(const std::string& dir, DType dtype);

  ZeroMemory memory() const;
  // Bytes of the collective buffers this rank has enqueued since the last call (all-gather: the
  // gathered size; reduce-scatter: the full gradient), as nccl-tests counts "size".
  uint64_t take_comm_bytes();
  int dp_size() const { return dp_.size(); }

 private:
  struct Unit;
  struct Slot;
  Slot& take_slot(std::vector<Slot>& pool, int u, const char* what);
  bool aliased_params() const;
  bool aliased_grads() const;
  std::vector<float> gather_to_host(int u, const Buffer& shard);

  const LlamaModel& model_;
  Device& device_;
  Communicator& dp_;
  Stream& compute_;
  Stream& comm_;
  ZeroOptions opt_;
  std::vector<Unit> units_;
  std::vector<Slot> param_slots_;
  std::vector<Slot> grad_slots_;
  Buffer reduce_tmp_;     // one shard of f32 for reduce-scatter results
  Buffer norm_parts_;     // one double per unit (device)
  Buffer norm_host_;      // the same on the host
  uint64_t comm_bytes_ = 0;
};

}  // namespace strata
