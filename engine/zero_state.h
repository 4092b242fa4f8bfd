// engine/zero_state.h — the ZeRO engine's per-unit state (shards, gather state, slots), shared by
// its translation units (engine/zero.cpp, engine/zero_checkpoint.cpp). Not public API.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint_writer.h"
#include "engine/zero.h"
#include "kernels/device.h"
#include "offload/pinned_pool.h"

namespace strata {

// One state's shard on its tier: device or host memory in `mem`, or an extent of the swap space
// named `key`.
struct ZeroEngine::Shard {
  Tier tier = Tier::device;
  Buffer mem;
  std::string key;
  size_t bytes = 0;
  template <class T>
  T* ptr() const { return mem.as<T>(); }
};

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

struct ZeroEngine::Unit {
  Shard master, m, v;  // f32, the optimizer's tier
  Shard grad;          // f32, the grads tier, accumulated over micro-batches
  Shard param;         // compute copy (f32 or bf16), the params tier; empty when it is the master
  GatherState gather = GatherState::idle;
  int slot = -1;       // parameter slot while gathered or held, else -1
  int grad_slot = -1;  // gradient slot from acquire_grad() to reduce_grad(), else -1
  PinnedPool::Lease fetch_lease;     // while fetching: the staging buffer the read fills
  uint64_t fetch_ticket = 0;         // while fetching: its swapper ticket (never 0 then)
};

struct ZeroEngine::Slot {
  Buffer full;     // (padded_numel) f32: gathered parameters or a full gradient
  Buffer full16;   // (padded_numel) bf16: gathered compute copy before the cast (bf16 only)
  Buffer shard;    // (shard) staging of an off-device compute copy before the gather (dp > 1)
  std::unique_ptr<Event> ready;  // the gather (or the backward) into `full` has completed
  std::unique_ptr<Event> free;   // the last reader of `full` has completed
  int owner = -1;  // unit held, -1 when free
};

// One chunk of the optimizer pipeline: staging for master, m, v and the compute copy.
struct ZeroEngine::ChunkSet {
  PinnedPool::Lease buf[4];
  uint64_t read = 0, write = 0;  // swapper tickets, 0 when none
};

// The ZeRO engine as the source of a checkpoint save (engine/zero_checkpoint.cpp).
class ZeroEngine::Source final : public CheckpointSource {
 public:
  explicit Source(ZeroEngine& engine) : e_(engine) {}
  const void* block_memory(const CheckpointBlock& block) override;
  uint64_t read_block(const CheckpointBlock& block, uint64_t offset, void* buffer, uint64_t bytes) override;
  void wait_read(uint64_t ticket) override;
  // Copies device-resident states the host cannot address into pinned snapshots.
  void snapshot();

 private:
  Shard& state(const CheckpointBlock& block);
  ZeroEngine& e_;
  std::vector<Buffer> snapshots_;  // [unit * 3 + state], empty where not needed
};

}  // namespace strata
