// engine/plan.h — what a run needs of each memory tier, computed from the config alone before
// anything is allocated, and whether it fits. `strata train` refuses a run that does not fit,
// with the table in the error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"

namespace strata {

struct PlanRow {
  std::string tier;      // "device", "pinned host", "host", "nvme"
  std::string what;      // what the bytes are for
  uint64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<PlanRow> rows;
  uint64_t device_bytes = 0;
  uint64_t device_limit = 0;    // offload.device_mem_limit or the device's size
  int64_t params = 0;
  bool fits() const { return device_bytes <= device_limit; }
  std::string table() const;    // a readable table of the rows, totals and limits
};

// dp: data-parallel ranks sharing the states; device_capacity: the device's physical size.
MemoryPlan plan_memory(const Config& config, int dp, uint64_t device_capacity);

}  // namespace strata
