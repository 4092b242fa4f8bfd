// engine/plan.cpp — the memory plan: per-rank bytes of every state, the gathered working set
// and the activations, from the same layout code the engine allocates with.
#include "engine/plan.h"

#include <algorithm>
#include <cstdio>

#include "core/size.h"
#include "engine/model.h"

namespace strata {

MemoryPlan plan_memory(const Config& c, int dp, uint64_t device_capacity) {
  LlamaModel model(c.model, dp);
  MemoryPlan p;
  p.params = model.num_params();
  p.device_limit = c.offload.device_mem_limit ? std::min(c.offload.device_mem_limit, device_capacity)
                                               : device_capacity;
  uint64_t shard = 0, full = 0;
  for (const auto& u : model.units()) {
    shard += u.layout.shard_numel();
    full = std::max<uint64_t>(full, u.layout.padded_numel());
  }
  const bool bf16 = c.train.precision == Precision::bf16;
  const bool keep_emb = c.model.tie_embeddings;
  auto add = [&](const char* what, uint64_t bytes) {
    p.rows.push_back(PlanRow{"device", what, bytes});
    p.device_bytes += bytes;
  };
  add("master weights (f32 shard)", shard * 4);
  add("AdamW m and v (f32 shards)", shard * 8);
  add("gradients (f32 shard)", shard * 4);
  if (bf16) add("bf16 compute copy (shard)", shard * 2);
  if (dp > 1 || bf16) {
    uint64_t slots = uint64_t(c.zero.prefetch + 1 + (keep_emb ? 1 : 0));
    add("gathered parameters (prefetch + 1 units)", slots * full * (bf16 ? 6 : 4));
  }
  if (dp > 1) {
    uint64_t slots = 2 + (keep_emb ? 1 : 0);
    add("full gradients being reduced (2 units)", slots * full * 4);
  }
  add("activations (one micro-batch)",
      activation_bytes(c.model, c.data.micro_batch, c.data.seq_len, c.zero.activation_checkpointing));
  return p;
}

std::string MemoryPlan::table() const {
  std::string out;
  char line[256];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "  %-8s %-44s %10s\n", r.tier.c_str(), r.what.c_str(),
                  format_bytes(r.bytes).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-8s %-44s %10s  (limit %s)%s\n", "device", "total",
                format_bytes(device_bytes).c_str(), format_bytes(device_limit).c_str(),
                fits() ? "" : "  DOES NOT FIT");
  out += line;
  return out;
}

}  // namespace strata
