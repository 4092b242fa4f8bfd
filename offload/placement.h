// offload/placement.h — the tiers, where each kind of state lives, and the decisions that follow
// from it: which states are one and the same, how many gathered and gradient slots the device
// holds, whether NVMe staging is needed and in what chunks. The ZeRO engine allocates by these
// decisions and the memory plan counts by them, so the plan counts exactly what is allocated.
//
// A value type: it allocates nothing and reads no config (engine/zero.cpp builds one from the
// offload, zero and train sections). Byte counts that need the model's layout take its numbers
// as arguments, so offload/ stays below engine/.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace strata {

enum class Tier { device, host, nvme };

// The kinds of unit a slot may serve, by index: 0 the embedding, 1 a decoder block, 2 the head
// (engine/model.h's UnitKind, in that order).
inline constexpr int kUnitKinds = 3;

// One class of gathered slots: `slots` device buffers of `numel` elements each, serving the unit
// kinds whose bit is set in `kinds` (bit k: kind k). A unit takes a free slot of its kind's class.
struct SlotClass {
  uint64_t numel = 0;
  int slots = 0;
  unsigned kinds = 0;
};

struct Placement {
  // Where each kind of state lives (offload.params, offload.grads, offload.optimizer).
  Tier params = Tier::device;     // the compute copy of the parameters
  Tier grads = Tier::device;      // f32 gradient shards, as configured (grads_tier() is in effect)
  Tier optimizer = Tier::device;  // f32 master weights, AdamW m and v
  DType compute = DType::f32;     // the compute copy: f32 or bf16 (train.precision)
  DType state = DType::f32;       // AdamW m and v: f32 or bf16 (train.optimizer_state_dtype)
  // What the slot counts and the aliasing depend on.
  int prefetch = 1;                    // units gathered ahead (zero.prefetch)
  bool keep_embedding = false;         // unit 0 stays gathered through the step (tied embeddings)
  bool reshard_after_forward = true;   // false: one slot per unit, forward to backward
  int grad_accum = 1;                  // micro-batches per step (train.grad_accum)
  uint64_t optimizer_chunk = 64ull << 20;  // offload.optimizer_chunk, bytes per array
  // offload.optimizer_read_ahead, bytes (0 when offload.overlap_optimizer is off: without the
  // optimizer's worker nothing reads ahead).
  uint64_t optimizer_read_ahead = 0;
  // offload.optimizer_host_bytes: with the optimizer on NVMe, the first units' states (whole
  // units, in forward order, while their bytes fit) live in host memory instead
  // (optimizer_host_units in engine/zero.h counts them).
  uint64_t optimizer_host_bytes = 0;

  // The grads tier in effect: optimizer states off the device pull gradients to host memory,
  // or to NVMe where both are on NVMe (grads = nvme; one micro-batch a step): each unit's
  // gradient is staged whole in pinned memory through its backward, its norm's partial sums
  // are taken, and it is written out while the backward goes on; the update reads it back
  // chunk by chunk beside the states. The first units whose states stay in host memory
  // (optimizer_host_bytes) keep their gradients there too.
  Tier grads_tier() const;
  bool nvme_grads() const { return grads_tier() == Tier::nvme; }
  size_t param_elem_bytes() const { return dtype_bytes(compute); }
  size_t state_elem_bytes() const { return dtype_bytes(state); }  // one element of m (or v)
  // Bytes per parameter of master, m and v: 12 with f32 m and v, 8 with bf16. An optimizer step
  // reads them and the f32 gradient and writes them back — 28 bytes per parameter, 20 with bf16
  // m and v; with the states on NVMe it reads and writes optimizer_state_bytes() each way.
  size_t optimizer_state_bytes() const { return 4 + 2 * state_elem_bytes(); }
  // The gathers read the master shard: it is the compute copy itself (f32, on the optimizer's
  // tier), or — param_rounds_master() — each gather rounds it to the bf16 compute copy.
  bool param_is_master() const;
  // bf16 compute with params and optimizer on NVMe: no compute copy is stored or written. A
  // gather reads the f32 master (4 bytes a parameter, during the passes) and rounds it as the
  // update would have; an update keeps its bf16 copy only for the next forward (ForwardCopies).
  // The copy's write (2 bytes a parameter, after a clipped step's norm) is gone; the backward
  // reads 2 bytes a parameter more, and the swap space is 2 bytes a parameter smaller.
  bool param_rounds_master() const;
  // Bytes per element a gather reads from the params' tier: 4 where it reads the master.
  size_t param_read_bytes() const { return param_is_master() ? 4 : param_elem_bytes(); }
  // No parameter slots at all: acquire() hands out the device shard (one rank, f32 on device).
  bool direct_params(int dp) const;
  // No gradient slots at all: one rank and one micro-batch per step, with the gradient shard in
  // memory the device computes in — device gradients, or host gradients when the device's memory
  // is the host's (the CPU device; device_is_host_memory), or gradients on NVMe there. The
  // backward accumulates into the zeroed shard itself (on NVMe: into a zeroed pinned staging
  // buffer written out when the unit's gradient is final). (With several micro-batches it must sum each micro-batch into a zeroed
  // buffer and add that to the shard, as every other placement does, or the rounding of the sums
  // would differ.)
  bool aliased_grads(int dp, bool device_is_host_memory) const;
  // Each parameter slot has a shard buffer on the device (the slot's numel / dp compute-copy
  // elements) that the all-gather reads: with several ranks and parameters off the device, where
  // the device cannot address host memory (the shard is copied in first), and wherever the
  // gathers round the master (it is rounded into it). Elsewhere the all-gather reads the shard
  // where it is (engine/zero_schedule.cpp, prefetch).
  bool param_shard_staged(int dp, bool device_is_host_memory) const;
  bool nvme_params() const;  // the compute copy is read from NVMe every pass
  bool chunk_io() const;     // the optimizer step moves chunks through NVMe
  // Gathered-parameter slots: prefetch + 1 (+ 1 for a tied embedding held through the step),
  // or one per unit when units stay gathered from forward to backward.
  int param_slots(int units) const;
  // Full-gradient slots: two (one in backward, one being reduced), a third when prefetching so a
  // reduce-scatter finishing late does not stall the backward, one more for a tied embedding.
  int grad_slots() const;
  // Slots sized per unit kind, for a schedule that holds at most `window` consecutive units of
  // the model's order at once (forward: a unit and the ones gathered ahead of it; backward the
  // same, reversed), plus unit 0 throughout when `keep_first` (a tied embedding). unit_kinds[u]
  // and unit_numel[u]: unit u's kind and padded size. The kinds are split into classes (every
  // partition of them is tried): a class's slots are sized for its largest unit, and there are
  // as many as the most units of the class any such schedule holds at once. The partition with
  // the fewest elements wins (ties: fewer classes), so it never has more than one class of
  // window + keep_first slots of the largest unit — the old pool. With a large vocabulary the
  // embedding and the head share one slot (never held together unless a window spans the
  // model) and the blocks get slots of their own size.
  static std::vector<SlotClass> slot_classes(const std::vector<int>& unit_kinds,
                                             const std::vector<uint64_t>& unit_numel, int window,
                                             bool keep_first);
  static uint64_t slot_numel(const std::vector<SlotClass>& classes);  // Σ slots × numel
  // Optimizer pipeline chunk in bytes per array: optimizer_chunk rounded down to whole
  // `align_elems` f32 elements (shards are multiples of it), at least one, at most a shard.
  uint64_t chunk_bytes(uint64_t max_shard_elems, uint64_t align_elems) const;
  // Staging buffers (of chunk_bytes each) per set of the optimizer pipeline: master, m and v,
  // and the refreshed compute copy — 4; with bf16 m and v the two share one buffer (each is
  // half a chunk), 3; one more for the gradient's chunk when it is read from NVMe. The pipeline
  // holds three sets.
  int chunk_buffers_per_set() const {
    return (state == DType::bf16 ? 3 : 4) + (nvme_grads() ? 1 : 0);
  }
  int chunk_buffers() const { return 3 * chunk_buffers_per_set(); }
  // Buffers of one chunk of master, m and v read ahead of their update: 3; 2 with bf16 m and v.
  int read_ahead_buffers_per_chunk() const { return state == DType::bf16 ? 2 : 3; }
  // Staging buffers (of chunk_bytes each) for optimizer states read from NVMe ahead of their
  // update (offload.optimizer_read_ahead): the budget rounded down to whole chunks, capped at the
  // chunks of the largest stage's states (`state_chunks`: there is nothing more to read ahead);
  // 0 unless the optimizer's states are on NVMe.
  int read_ahead_buffers(uint64_t max_shard_elems, uint64_t align_elems, uint64_t state_chunks) const;
};

}  // namespace strata
