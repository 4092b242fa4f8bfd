// bench/checkpoint_bench.h — `strata bench checkpoint`: checkpoint write GB/s against what the
// disk gives (`strata bench io` write GB/s, measured first in the same run on the same folder),
// the stall a save costs the training loop as a share of a step, the time to save, and the time
// to resume (verify every file, load every shard).
//
// The training run saves every 2 steps; a save's stall is the time its step and the next one
// spent on it (starting it; the next optimizer step waiting for it to read the states), over the
// median time of a step without a save. Checkpoint GB/s is one rank's file over its write time
// (first byte submitted to fsync done).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

struct CheckpointBenchOptions {
  std::string config_path;             // TOML; empty = built-in defaults
  std::vector<std::string> overrides;  // section.key=value
  std::string dir;                     // where the checkpoints (and the io bench file) go
  int steps = 6;                       // training steps (saves at 2, 4, 6, ...)
  uint64_t io_size_bytes = 0;          // bench io size; 0 = one rank file, at least 1 GiB
};

nlohmann::json run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace strata
