// offload/placement.cpp — the decisions of offload/placement.h. Pure functions of the placement;
// the engine (engine/zero.cpp) and the plan (engine/plan.cpp) both call them.
#include "offload/placement.h"

#include <algorithm>

namespace strata {

Tier Placement::grads_tier() const { return optimizer == Tier::device ? grads : Tier::host; }

bool Placement::param_is_master() const { return compute == DType::f32 && params == optimizer; }

bool Placement::direct_params(int dp) const {
  return dp == 1 && compute == DType::f32 && params == Tier::device;
}

bool Placement::aliased_grads(int dp) const {
  return dp == 1 && grads_tier() == Tier::device && grad_accum == 1;
}

bool Placement::nvme_params() const { return params == Tier::nvme; }

bool Placement::chunk_io() const {
  return optimizer == Tier::nvme || (params == Tier::nvme && !param_is_master());
}

int Placement::param_slots(int units) const {
  if (!reshard_after_forward) return units;
  return prefetch + 1 + (keep_embedding ? 1 : 0);
}

int Placement::grad_slots() const {
  return 2 + (prefetch > 0 ? 1 : 0) + (keep_embedding ? 1 : 0);
}

uint64_t Placement::chunk_bytes(uint64_t max_shard_elems, uint64_t align_elems) const {
  const uint64_t unit = align_elems * 4;  // shards are multiples of this
  return std::clamp<uint64_t>(optimizer_chunk / unit * unit, unit, max_shard_elems * 4);
}

}  // namespace strata
