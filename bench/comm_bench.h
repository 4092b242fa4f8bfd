// bench/comm_bench.h — `strata bench comm` (run under mpirun): all-gather, reduce-scatter and
// all-reduce over sizes from 1K to 256M with nccl-tests' columns.
//
// For each operation and size: fill every rank's buffers with exact small integers, run once
// and count wrong elements (`wrong`, as nccl-tests' #wrong), then time `iters` calls after
// `warmup` (the largest per-rank time, in microseconds). size is nccl-tests' "size": the
// gathered output of all-gather, the full input of reduce-scatter, the buffer of all-reduce.
// algbw = size / time; busbw = algbw × (n−1)/n for all-gather and reduce-scatter and
// × 2(n−1)/n for all-reduce (nccl-tests' documented factors), in GB/s (1e9 bytes).
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace strata {

class Communicator;

struct CommBenchOptions {
  uint64_t min_bytes = 1024;
  uint64_t max_bytes = 256ull << 20;
  int step_factor = 4;     // sizes grow by this factor
  int warmup = 2;
  int iters = 0;           // 0: enough for ~0.2 s per size (at least 3)
  bool all_reduce = true;  // false: all-gather and reduce-scatter only (the sweep's probe)
};

// Collective over `world`; every rank returns the same JSON.
nlohmann::json run_comm_bench(Communicator& world, const CommBenchOptions& options);

}  // namespace strata
