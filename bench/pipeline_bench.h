// bench/pipeline_bench.h — `strata bench pipeline` (under mpirun -np pp): the bubble of the
// pipeline schedules measured in the trace. For each schedule and each number of micro-batches
// m, a run with parallel.pp = the job's ranks (balanced stages, train.threads as configured,
// 1 by default) runs 5 steps and traces steps 2..4; on each stage's "pipeline stage s" track the forward and
// backward spans of a step are its busy time, and the step's pipeline window runs from the
// first stage's first span to its last (the first stage starts first and ends last). A stage's
// idle share is 1 − busy / window, summed over the traced steps, beside the ideal
// (pp − 1) / (m + pp − 1). Also reported per run: the first stage's device peak and its
// activation bytes (the micro-batches its schedule holds), and tokens/s.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

struct PipelineBenchOptions {
  std::string config_path;               // empty: built-in config
  std::vector<std::string> overrides;    // --set section.key=value
  std::vector<int> micro_batches = {4, 8, 16};
  std::vector<std::string> schedules = {"1f1b", "gpipe"};
};

// Collective over the world; rank 0's result holds "runs" with the measurements, the other
// ranks' an empty "runs".
nlohmann::json run_pipeline_bench(const PipelineBenchOptions& options);

}  // namespace strata
