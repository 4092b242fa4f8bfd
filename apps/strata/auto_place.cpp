// apps/strata/auto_place.cpp — printing the candidates of engine/step_model.h and resolving
// "auto" for `strata train` (apps/strata/auto_place.h).
#include "apps/strata/auto_place.h"

#include <cstdio>
#include <string_view>

#include "apps/strata/common.h"
#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "engine/rate_cache.h"
#include "engine/trainer.h"
#include "kernels/device.h"

namespace strata::app {

std::string rates_text(const MachineRates& r) {
  // The names (a path, a device, file systems) as they are, of any length; the numbers formatted.
  std::string t = str("rates: ", r.source, ", measured ", r.measured_at, " on ", r.device, " with ",
                      r.cpu_threads, " CPU thread(s): ");
  char line[512];
  std::snprintf(line, sizeof line,
                "GEMM %.1f GFLOP/s, attention %.1f GFLOP/s, CPU AdamW %.2f GB/s (bf16 m and v "
                "%.2f), gradient norm %.2f GB/s, device AdamW %.2f GB/s, host->device %.2f GB/s, "
                "device->host %.2f GB/s",
                r.gemm_flops / 1e9, r.attention_flops / 1e9, r.adam_gbps, r.adam_bf16_gbps,
                r.norm_gbps, r.device_mem_gbps, r.h2d_gbps, r.d2h_gbps);
  t += line;
  if (r.comm_gbps > 0) {
    std::snprintf(line, sizeof line, ", collectives %.2f GB/s", r.comm_gbps);
    t += line;
  }
  if (!r.nvme.empty()) {
    std::snprintf(line, sizeof line,
                  ", NVMe read %.2f GB/s, write %.2f GB/s (beside compute %.2f / %.2f, steal "
                  "%.3f CPU s per GB)",
                  r.nvme_read_gbps, r.nvme_write_gbps, r.nvme_read_busy_gbps,
                  r.nvme_write_busy_gbps, r.nvme_steal_s_per_gb);
    t += str(line, " (", r.nvme, ")");
  }
  return t;
}

std::string auto_plan_table(const AutoPlan& plan) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "  %-1s %-7s %-6s %-13s %-4s %9s %9s %9s %9s %10s %9s %9s %9s %9s  %s\n", "",
                "params", "grads", "optimizer", "fits", "device", "pinned", "host", "nvme", "step ms",
                "compute", "nvme", "copy", "optim", "bottleneck");
  out += line;
  for (int i = 0; i < int(plan.candidates.size()); ++i) {
    const PlacementCandidate& k = plan.candidates[size_t(i)];
    const StepPrediction& p = k.prediction;
    std::snprintf(line, sizeof line, "  %-1s %-7s %-6s %-13s %-4s %9s %9s %9s %9s %10.1f %9.1f %9.1f %9.1f %9.1f  %s\n",
                  i == plan.chosen ? "*" : "", std::string(tier_name(k.params)).c_str(),
                  std::string(tier_name(k.grads)).c_str(),
                  (std::string(tier_name(k.optimizer)) + (k.optimizer_host_bytes ? "+kept" : "") +
                   (k.optimizer_read_ahead ? " ra0" : "")).c_str(),
                  k.fits ? "yes" : "no", format_bytes(k.device_bytes).c_str(),
                  format_bytes(k.pinned_bytes).c_str(), format_bytes(k.host_bytes).c_str(),
                  format_bytes(k.nvme_bytes).c_str(), p.step_ms, p.compute_ms, p.nvme_ms, p.copy_ms,
                  p.optimizer_ms, p.bottleneck.c_str());
    out += line;
  }
  bool kept = false;
  for (const auto& k : plan.candidates)
    if (k.optimizer_host_bytes) {
      if (!kept)
        out += "  nvme+kept: the first units' master, m and v in host memory, whole units while "
               "they fit (ra0: the read-ahead's memory kept too):\n";
      kept = true;
      out += str("    ", k.name(), " (", format_bytes(k.optimizer_host_bytes), ")\n");
    }
  for (const auto& k : plan.candidates)
    if (!k.fits) out += str("  ", k.name(), " does not fit: ", k.why_not, "\n");
  return out;
}

nlohmann::json auto_plan_json(const AutoPlan& plan, const MachineRates& rates) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < int(plan.candidates.size()); ++i) {
    const PlacementCandidate& k = plan.candidates[size_t(i)];
    const StepPrediction& p = k.prediction;
    rows.push_back({{"params", tier_name(k.params)},
                    {"grads", tier_name(k.grads)},
                    {"optimizer", tier_name(k.optimizer)},
                    {"optimizer_host_bytes", k.optimizer_host_bytes},
                    {"optimizer_read_ahead",  // set where the planner replaced the key's value
                     k.optimizer_read_ahead ? nlohmann::json(*k.optimizer_read_ahead) : nlohmann::json()},
                    {"fits", k.fits},
                    {"why_not", k.why_not},
                    {"chosen", i == plan.chosen},
                    {"bytes", {{"device", k.device_bytes}, {"pinned", k.pinned_bytes},
                               {"host", k.host_bytes}, {"nvme", k.nvme_bytes}}},
                    {"bytes_per_step", {{"h2d", p.bytes.h2d}, {"d2h", p.bytes.d2h},
                                        {"nvme_read", p.bytes.nvme_read}, {"nvme_write", p.bytes.nvme_write},
                                        {"adam", p.bytes.adam}}},
                    {"predicted", {{"step_ms", p.step_ms}, {"forward_ms", p.forward_ms},
                                   {"backward_ms", p.backward_ms}, {"compute_ms", p.compute_ms},
                                   {"nvme_ms", p.nvme_ms}, {"copy_ms", p.copy_ms}, {"comm_ms", p.comm_ms},
                                   {"optimizer_ms", p.optimizer_ms}, {"norm_ms", p.norm_ms},
                                   {"exposed_optimizer_ms", p.exposed_optimizer_ms},
                                   {"steal_ms", p.steal_ms},
                                   {"bottleneck", p.bottleneck}}}});
  }
  nlohmann::json j = {{"rates", rates_json(rates)}, {"candidates", rows}, {"limits", plan.limits}};
  j["chosen"] = plan.chosen >= 0 ? nlohmann::json(plan.candidates[size_t(plan.chosen)].name()) : nlohmann::json();
  return j;
}

void warn_unused_rate_args(const char* who, const AutoArgs& args) {
  if (!args.reprobe && args.rates_path.empty()) return;
  const bool plan = std::string_view(who) == "plan";
  log_warn(who, "--rates and --reprobe are for ", plan ? "--auto or " : "",
           "offload tiers set to \"auto\", and none is: this ", plan ? "plan" : "run",
           " reads no rates");
}

Config resolve_auto_placement(const Config& cfg, Communicator& world, const AutoArgs& args) {
  // Every rank takes part in rank 0's choice below only if every rank has "auto" where it has:
  // a config that differs between ranks is refused here, before that broadcast (the trainer
  // checks the resolved config again).
  check_same_config_on_every_rank(cfg, world);
  if (!cfg.offload.any_auto()) return cfg;
  const int dp = cfg.parallel.dp ? cfg.parallel.dp : world.size() / (cfg.parallel.tp * cfg.parallel.pp);
  // params, grads, optimizer, optimizer_host_bytes (hi, lo), whether the planner set
  // optimizer_read_ahead, and its value (hi, lo)
  int32_t tiers[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::string error;
  if (world.rank() == 0) {
    try {
      const RatesLookup rl = rates_for(cfg, args.rates_path, args.reprobe, [](const std::string& path) {
        std::printf("auto placement: no measured rates for this machine in %s; measuring them now "
                    "(a few seconds)\n", path.c_str());
        std::fflush(stdout);
      });
      const AutoPlan plan = plan_placements(cfg, dp, plan_machine(cfg, world.size()), rl.rates);
      const PlacementCandidate& k = chosen_placement(plan);
      std::printf("auto placement: %s, predicted %.0f ms per step (bottleneck: %s)\n  %s\n",
                  k.name().c_str(), k.prediction.step_ms, k.prediction.bottleneck.c_str(),
                  rates_text(rl.rates).c_str());
      std::fflush(stdout);
      if (cfg.offload.optimizer_host_bytes && k.optimizer != Tier::nvme)
        std::printf("auto placement: offload.optimizer_host_bytes = %s is not used: it keeps part "
                    "of an NVMe optimizer in host memory, and the optimizer goes to %s\n",
                    format_bytes(cfg.offload.optimizer_host_bytes).c_str(),
                    std::string(tier_name(k.optimizer)).c_str());
      tiers[0] = int32_t(k.params), tiers[1] = int32_t(k.grads), tiers[2] = int32_t(k.optimizer);
      tiers[3] = int32_t(uint32_t(k.optimizer_host_bytes >> 32));
      tiers[4] = int32_t(uint32_t(k.optimizer_host_bytes));
      if (k.optimizer_read_ahead) {
        tiers[5] = 1;
        tiers[6] = int32_t(uint32_t(*k.optimizer_read_ahead >> 32));
        tiers[7] = int32_t(uint32_t(*k.optimizer_read_ahead));
      }
    } catch (const std::exception& e) {
      end_job_if_peers(e);  // ends every rank when there are peers
      throw;
    }
  }
  if (world.size() > 1) {  // every rank takes rank 0's choice
    auto dev = make_device(DeviceKind::cpu);
    auto s = dev->make_stream("auto placement");
    world.broadcast(*s, tiers, 8, CommType::i32, 0);
    s->synchronize();
  }
  PlacementCandidate k;
  k.params = Tier(tiers[0]), k.grads = Tier(tiers[1]), k.optimizer = Tier(tiers[2]);
  k.optimizer_host_bytes = uint64_t(uint32_t(tiers[3])) << 32 | uint32_t(tiers[4]);
  if (tiers[5]) k.optimizer_read_ahead = uint64_t(uint32_t(tiers[6])) << 32 | uint32_t(tiers[7]);
  return with_placement(cfg, k);
}

}  // namespace strata::app
