// offload/placement.cpp — the decisions of offload/placement.h. Pure functions of the placement;
// the engine (engine/zero.cpp) and the plan (engine/plan.cpp) both call them.
#include "offload/placement.h"

#include <algorithm>
#include <array>
#include <vector>

namespace strata {

Tier Placement::grads_tier() const {
  if (optimizer == Tier::device) return grads;
  return grads == Tier::nvme && optimizer == Tier::nvme ? Tier::nvme : Tier::host;
}

bool Placement::param_is_master() const {
  return (compute == DType::f32 && params == optimizer) || param_rounds_master();
}

bool Placement::param_rounds_master() const {
  return compute == DType::bf16 && params == Tier::nvme && optimizer == Tier::nvme;
}

bool Placement::direct_params(int dp) const {
  return dp == 1 && compute == DType::f32 && params == Tier::device;
}

bool Placement::aliased_grads(int dp, bool device_is_host_memory) const {
  return dp == 1 && grad_accum == 1 && (grads_tier() == Tier::device || device_is_host_memory);
}

bool Placement::param_shard_staged(int dp, bool device_is_host_memory) const {
  return dp > 1 && params != Tier::device && (!device_is_host_memory || param_rounds_master());
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

std::vector<SlotClass> Placement::slot_classes(const std::vector<int>& unit_kinds,
                                               const std::vector<uint64_t>& unit_numel, int window,
                                               bool keep_first) {
  const int units = static_cast<int>(unit_kinds.size());
  const int w = std::clamp(window, 1, std::max(units, 1));
  unsigned present = 0;
  std::array<uint64_t, kUnitKinds> numel{};
  for (int u = 0; u < units; ++u) {
    const int k = unit_kinds[size_t(u)];
    present |= 1u << k;
    numel[size_t(k)] = std::max(numel[size_t(k)], unit_numel[size_t(u)]);
  }
  // The most units of the kinds in `kinds` held at once: over every window [s, s + w), with
  // unit 0 added when it is kept.
  auto held = [&](unsigned kinds) {
    int most = 0;
    for (int s = 0; s + w <= units; ++s) {
      int n = keep_first && s > 0 && (kinds >> unit_kinds[0] & 1u) ? 1 : 0;
      for (int u = s; u < s + w; ++u) n += kinds >> unit_kinds[size_t(u)] & 1u;
      most = std::max(most, n);
    }
    return most;
  };
  // Every partition of the present kinds into classes: give kind k the class label c[k] ≤ the
  // largest label before it + 1 (restricted growth strings; 5 partitions of 3 kinds).
  std::vector<SlotClass> best;
  uint64_t best_numel = 0;
  std::array<int, kUnitKinds> c{};
  const int combos = 1 << (2 * kUnitKinds);
  for (int code = 0; code < combos; ++code) {
    bool ok = true;
    int top = -1;
    for (int k = 0; k < kUnitKinds; ++k) {
      c[size_t(k)] = code >> (2 * k) & 3;
      if (c[size_t(k)] > top + 1) ok = false;
      top = std::max(top, c[size_t(k)]);
    }
    if (!ok) continue;
    std::vector<SlotClass> classes;
    for (int label = 0; label <= top; ++label) {
      SlotClass cl;
      for (int k = 0; k < kUnitKinds; ++k)
        if (c[size_t(k)] == label && (present >> k & 1u)) {
          cl.kinds |= 1u << k;
          cl.numel = std::max(cl.numel, numel[size_t(k)]);
        }
      if (!cl.kinds) continue;
      cl.slots = held(cl.kinds);
      if (cl.slots > 0) classes.push_back(cl);
    }
    const uint64_t n = slot_numel(classes);
    if (best.empty() || n < best_numel || (n == best_numel && classes.size() < best.size())) {
      best = std::move(classes);
      best_numel = n;
    }
  }
  return best;
}

uint64_t Placement::slot_numel(const std::vector<SlotClass>& classes) {
  uint64_t n = 0;
  for (const auto& c : classes) n += uint64_t(c.slots) * c.numel;
  return n;
}

uint64_t Placement::chunk_bytes(uint64_t max_shard_elems, uint64_t align_elems) const {
  const uint64_t unit = align_elems * 4;  // shards are multiples of this
  return std::clamp<uint64_t>(optimizer_chunk / unit * unit, unit, max_shard_elems * 4);
}

int Placement::read_ahead_buffers(uint64_t max_shard_elems, uint64_t align_elems, uint64_t state_chunks) const {
  if (optimizer != Tier::nvme || !optimizer_read_ahead) return 0;
  const uint64_t per = uint64_t(read_ahead_buffers_per_chunk());
  const uint64_t chunks = std::min(optimizer_read_ahead / chunk_bytes(max_shard_elems, align_elems) / per, state_chunks);
  return int(std::min<uint64_t>(chunks, 1u << 20) * per);
}

}  // namespace strata
