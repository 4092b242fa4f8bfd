// engine/plan.h — what a run needs of each memory tier, computed from the config alone before
// anything is allocated, and whether it fits. `strata plan` prints it; `strata train` refuses a
// run that does not fit, with the table in the error.
//
// Bytes are per rank, from the same layout code the engine allocates with: device (device
// shards, the gathered working set, activations), pinned host (staging pools, host-resident
// compute copy and gradients), pageable host (host-resident optimizer states), NVMe (swap-space
// extents). Limits: offload.device_mem_limit (or the device's size), offload.pinned_mem_limit
// for the staging pools, the machine's RAM for all host memory of the ranks on this machine
// (on the CPU device its "device memory" is RAM too), and the free space of offload.nvme_path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/pipeline.h"

namespace strata {

struct PlanRow {
  std::string tier;      // "device", "pinned", "host", "nvme"
  std::string what;      // what the bytes are for
  uint64_t bytes = 0;    // per rank
};

struct PlanCheck {
  std::string what;      // e.g. "device memory per rank"
  uint64_t need = 0;
  uint64_t limit = 0;
  std::string limit_name;  // the key or resource that sets the limit
  bool ok() const { return need <= limit; }
};

struct MemoryPlan {
  std::vector<PlanRow> rows;
  std::vector<PlanCheck> checks;
  int64_t params = 0;
  int ranks_here = 1;
  // Pipeline parallelism: the stage this plan is for, its global units and the micro-batches
  // its schedule holds at once.
  int stage = 0;
  StageUnits units;
  int micro_batches_held = 1;
  // The host memory check's figures: this machine's ranks' host and pinned bytes (and the CPU
  // device's memory), and the machine's RAM.
  uint64_t host_need = 0, host_limit = 0;
  uint64_t tier_bytes(const std::string& tier) const;
  uint64_t device_bytes() const { return tier_bytes("device"); }
  bool fits() const;
  // The checks that fail, one clause each: "device memory per rank needs 3 GiB but
  // offload.device_mem_limit allows 2 GiB; ..." (empty when the run fits).
  std::string failed_checks() const;
  // What to change (kDoesNotFitHint; where the NVMe swap does not fit, its folders first).
  std::string hint() const;
  std::string table() const;  // rows, per-tier totals and every check with its verdict
};

// What a user can change when a plan does not fit (train's error and plan's verdict say it).
inline constexpr const char* kDoesNotFitHint =
    "offload states (offload.params / optimizer = host or nvme, or \"auto\"), raise "
    "offload.device_mem_limit or offload.pinned_mem_limit, shrink the model or "
    "data.micro_batch, turn on zero.activation_checkpointing, or use more ranks";

struct PlanMachine {
  bool device_is_host_memory = true;   // the CPU device: its memory is the machine's RAM
  uint64_t device_capacity = 0;        // the device's size
  uint64_t host_memory = 0;            // RAM of this machine (0: read /proc/meminfo)
  int ranks_here = 0;                  // ranks sharing this machine (0: dp × tp × pp)
};

// dp: data-parallel ranks sharing the states; parallel.tp splits every unit first (the bytes are
// those of tp rank 0, which holds the largest vocabulary part).
// The plan of one rank of pipeline stage `stage` (tp rank 0's slice, the largest).
MemoryPlan plan_memory(const Config& config, int dp, const PlanMachine& machine, int stage = 0);

}  // namespace strata
