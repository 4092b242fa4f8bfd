// apps/strata/auto_place.h — the command line's side of `offload.* = "auto"`: the rates (cached
// or probed, bench/rate_probe.h), the candidates (engine/step_model.h), their table and JSON, and
// the resolution `strata train` runs before anything is allocated. The model itself lives in
// engine/step_model.h; this file only prints and decides who probes.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "bench/rate_probe.h"
#include "comm/comm.h"
#include "engine/step_model.h"

namespace strata::app {

struct AutoArgs {
  std::string rates_path;  // --rates FILE; empty: default_rate_cache_path()
  bool reprobe = false;    // --reprobe
};

// One line: where the rates came from, when they were measured, and each rate.
std::string rates_text(const MachineRates& rates);
// The candidates' table: placement, fits, bytes per tier, predicted step and its parts,
// bottleneck; the chosen one marked.
std::string auto_plan_table(const AutoPlan& plan);
nlohmann::json auto_plan_json(const AutoPlan& plan, const MachineRates& rates);

// --rates or --reprobe given where no rates are read (no offload tier is "auto" and, for `strata
// plan`, no --auto): a warning from `who` ("train", "plan") saying so; nothing otherwise.
void warn_unused_rate_args(const char* who, const AutoArgs& args);

// `strata train` with "auto" in offload.params, grads or optimizer: rank 0 reads (or probes and
// caches) the rates, plans every candidate, logs the chosen placement and its predicted step,
// and every rank takes its tiers (broadcast). An Error naming the limits when nothing fits.
// A config without "auto" is returned as it is.
Config resolve_auto_placement(const Config& config, Communicator& world, const AutoArgs& args);

}  // namespace strata::app
