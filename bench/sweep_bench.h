// bench/sweep_bench.h — `strata bench sweep`: the same short training under several
// placements, one row each: tokens/s, step time split (compute, waiting on NVMe, waiting on
// communication, optimizer), peak bytes per tier, bytes moved per link per step. Written as
// JSON, CSV and an SVG chart of device memory against throughput (no plotting dependency).
//
// The NVMe rate of the same run (a `strata bench io` pass over offload.nvme_path) sets each
// row's I/O bound — the step's NVMe bytes at that rate — so overlap can be judged:
// step_ms / max(compute bound, I/O bound), where the compute bound is the all-device row's
// step time. Each row also carries the step model's prediction (engine/step_model.h) from the
// GEMM, AdamW, copy and NVMe rates measured in the same run by every rank at once (so each is a
// rank's share): predicted_step_ms, predicted_bottleneck and measured_over_predicted.
// The first step of each row is warm-up and not timed. Every row says its optimizer order
// (overlap_optimizer); with both_orders a placement whose optimizer is off the device has a row
// for each order. Collective under mpirun.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

class Communicator;

inline constexpr int kSweepIoRounds = 3;

struct SweepOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  // "params:optimizer[:grads]" each device|host|nvme, e.g. "device:device", "host:nvme".
  std::vector<std::string> placements = {"device:device", "host:host", "host:nvme", "nvme:nvme"};
  std::string out_prefix;         // PREFIX.json, PREFIX.csv, PREFIX.svg (rank 0); empty = none
  // Bytes written and read by each pass of the NVMe rate measurement (0: skip): kSweepIoRounds
  // pairs of passes, idle and beside compute (bench/rate_probe.h's measure_nvme_rates).
  uint64_t io_bench_bytes = 1ull << 30;
  // Each placement whose optimizer is off the device runs twice, overlapped and serial
  // (offload.overlap_optimizer true, then false; the serial row is named "<placement> serial"),
  // in the same run: which order is faster depends on the machine (docs/tuning.md).
  bool both_orders = false;
};

nlohmann::json run_sweep(Communicator& world, const SweepOptions& options);
std::string sweep_csv(const nlohmann::json& sweep);
std::string sweep_svg(const nlohmann::json& sweep);

}  // namespace strata
