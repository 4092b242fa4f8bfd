// apps/strata/cmd_plan.cpp — `strata plan [--config F] [--set k=v]... [--ranks N] [--json]
// [--auto [--reprobe] [--rates FILE]]`: the bytes each memory tier needs per rank for a config,
// against each limit, before anything is allocated (engine/plan.h). Prints the table and a
// verdict; exit status 1 when it does not fit (the failed checks on stderr). With --auto (or
// "auto" in offload.*), every candidate placement with its bytes per tier and predicted step time
// (engine/step_model.h), and the fastest that fits; exit status 1 when none fits.
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/strata/auto_place.h"
#include "apps/strata/commands.h"
#include "apps/strata/common.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "engine/pipeline.h"
#include "engine/plan.h"
#include "kernels/device.h"

namespace strata::app {

void register_plan(CLI::App& app) {
  struct Args {
    ConfigArgs config;
    int ranks = 1;
    bool json = false;
    bool automatic = false;
    AutoArgs auto_args;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("plan", "bytes per memory tier for a config, and whether it fits");
  add_config_options(*cmd, args->config);
  cmd->add_option("--ranks", args->ranks, "ranks of the run, all on this machine")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_flag("--auto", args->automatic,
                "every placement of params, grads and optimizer (those set to \"auto\", else all): "
                "bytes per tier, predicted step time, bottleneck, and the fastest that fits");
  cmd->add_flag("--reprobe", args->auto_args.reprobe, "with --auto: measure the rates again (and cache them)");
  cmd->add_option("--rates", args->auto_args.rates_path,
                  "with --auto: the rate cache file (default $XDG_CACHE_HOME/strata/rates.json or "
                  "~/.cache/strata/rates.json)");
  cmd->callback([args] {
    Config cfg = load(args->config);
    if (args->ranks < 1) fail("plan::args", str("--ranks ", args->ranks, " must be at least 1"));
    const int model_parallel = cfg.parallel.tp * cfg.parallel.pp;
    int dp = cfg.parallel.dp ? cfg.parallel.dp : args->ranks / model_parallel;
    if (dp < 1 || dp * model_parallel != args->ranks)
      fail("plan::args", str("--ranks ", args->ranks, " is not dp × tp × pp for this config"));
    const PlanMachine machine = plan_machine(cfg, args->ranks);
    if (!args->automatic && !cfg.offload.any_auto()) warn_unused_rate_args("plan", args->auto_args);
    if (args->automatic || cfg.offload.any_auto()) {
      const RatesLookup rl = rates_for(cfg, args->auto_args.rates_path, args->auto_args.reprobe,
                                       [](const std::string& path) {
                                         std::fprintf(stderr, "strata plan: measuring this machine's rates "
                                                      "(a few seconds); they will be cached in %s\n", path.c_str());
                                       });
      const AutoPlan plan = plan_placements(cfg, dp, machine, rl.rates);
      if (args->json) {
        nlohmann::json j = auto_plan_json(plan, rl.rates);
        j["ranks"] = args->ranks;
        j["dp"] = dp;
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("strata plan --auto: %d rank(s) (mesh pp %d x dp %d x tp %d), %s, micro-batch %d x %d x %d accum%s\n",
                    args->ranks, cfg.parallel.pp, dp, cfg.parallel.tp,
                    std::string(precision_name(cfg.train.precision)).c_str(), cfg.data.micro_batch,
                    cfg.data.seq_len, cfg.train.grad_accum,
                    cfg.offload.overlap_optimizer ? ", optimizer overlapped with the next forward" : "");
        std::printf("%s\n  (the rate cache: %s; --reprobe measures again)\n", rates_text(rl.rates).c_str(),
                    rl.cache_path.c_str());
        if (dp > 1 && !(rl.rates.comm_gbps > 0))
          std::printf("  (the %d-rank collectives are not counted: a one-process probe cannot measure "
                      "them; `strata bench sweep` under mpirun does)\n", dp);
        std::printf("%s", auto_plan_table(plan).c_str());
      }
      const PlacementCandidate& k = chosen_placement(plan);  // an Error naming the limits when none fits
      if (!args->json)
        std::printf("chosen: %s, predicted %.1f ms per step (bottleneck: %s)\n", k.name().c_str(),
                    k.prediction.step_ms, k.prediction.bottleneck.c_str());
      return;
    }
    // One plan per pipeline stage (one stage without pipeline parallelism).
    std::vector<MemoryPlan> plans;
    for (int st = 0; st < cfg.parallel.pp; ++st) plans.push_back(plan_memory(cfg, dp, machine, st));
    const MemoryPlan& p = plans.front();
    bool fits = true;
    for (const auto& q : plans) fits = fits && q.fits();
    // The verdict as an exit status: 1 when a stage does not fit, its checks named on stderr.
    auto fail_unless_fits = [&] {
      std::fflush(stdout);
      for (const auto& q : plans)
        if (!q.fits())
          fail("plan",
               str("the run does not fit",
                   cfg.parallel.pp > 1 ? str(" (stage ", q.stage, ")") : std::string(), ": ",
                   q.failed_checks()),
               str(q.hint(), "; `strata plan --auto` lists the placements that fit"));
    };
    // "embedding + blocks 0-3", "blocks 4-7 + head": a stage's units in words.
    auto units_text = [&](const StageUnits& u) {
      const int L = cfg.model.n_layers;
      std::vector<std::string> parts;
      if (u.begin == 0) parts.push_back("embedding");
      const int b0 = std::max(u.begin, 1) - 1, b1 = std::min(u.end, L + 1) - 1;  // blocks [b0, b1)
      if (b1 > b0) parts.push_back(b1 - b0 == 1 ? str("block ", b0) : str("blocks ", b0, "-", b1 - 1));
      if (u.end == L + 2) parts.push_back("head");
      std::string text;
      for (const auto& part : parts) text += (text.empty() ? "" : " + ") + part;
      return text;
    };
    auto plan_json = [](const MemoryPlan& q) {
      nlohmann::json rows = nlohmann::json::array(), checks = nlohmann::json::array();
      for (const auto& r : q.rows) rows.push_back({{"tier", r.tier}, {"what", r.what}, {"bytes", r.bytes}});
      for (const auto& c : q.checks)
        checks.push_back({{"what", c.what}, {"need", c.need}, {"limit", c.limit},
                          {"limit_name", c.limit_name}, {"ok", c.ok()}});
      return nlohmann::json{{"rows", rows}, {"checks", checks}, {"fits", q.fits()},
                            {"totals", {{"device", q.tier_bytes("device")}, {"pinned", q.tier_bytes("pinned")},
                                        {"host", q.tier_bytes("host")}, {"nvme", q.tier_bytes("nvme")}}}};
    };
    if (args->json) {
      nlohmann::json j = plan_json(p);
      j["params"] = p.params;
      j["ranks"] = args->ranks;
      j["dp"] = dp;
      j["tp"] = cfg.parallel.tp;
      j["pp"] = cfg.parallel.pp;
      j["fits"] = fits;
      if (cfg.parallel.pp > 1) {
        nlohmann::json stages = nlohmann::json::array();
        for (const auto& q : plans) {
          nlohmann::json sj = plan_json(q);
          sj["stage"] = q.stage;
          sj["units"] = {q.units.begin, q.units.end};
          sj["holds"] = units_text(q.units);
          sj["micro_batches_held"] = q.micro_batches_held;
          stages.push_back(std::move(sj));
        }
        j["stages"] = std::move(stages);
        j["pp_schedule"] = cfg.parallel.pp_schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b";
      }
      std::printf("%s\n", j.dump().c_str());
      fail_unless_fits();
      return;
    }
    std::printf("strata plan: %lld parameters, %d rank(s) (mesh pp %d x dp %d x tp %d), %s, "
                "placement params=%s grads=%s optimizer=%s, micro-batch %d x %d%s\n",
                (long long)p.params, args->ranks, cfg.parallel.pp, dp, cfg.parallel.tp,
                std::string(precision_name(cfg.train.precision)).c_str(),
                std::string(tier_name(cfg.offload.params)).c_str(),
                std::string(tier_name(cfg.offload.grads)).c_str(),
                std::string(tier_name(cfg.offload.optimizer)).c_str(), cfg.data.micro_batch,
                cfg.data.seq_len, cfg.zero.activation_checkpointing ? ", activation checkpointing" : "");
    if (cfg.parallel.pp == 1) {
      std::printf("%s", p.table().c_str());
    } else {
      std::printf("pipeline: %d stages, schedule %s over %d micro-batches (train.grad_accum), "
                  "partition %s\n",
                  cfg.parallel.pp, cfg.parallel.pp_schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b",
                  cfg.train.grad_accum,
                  cfg.parallel.pp_layers.empty() ? "balanced by cost (FLOPs and bytes)" : "from parallel.pp_layers");
      for (const auto& q : plans)
        std::printf("stage %d: %s (%d units), %d micro-batch(es) held at once\n%s", q.stage,
                    units_text(q.units).c_str(), q.units.size(), q.micro_batches_held, q.table().c_str());
    }
    std::printf("%s\n", fits ? "fits" : "does NOT fit: `strata train` would refuse this run");
    fail_unless_fits();
  });
}

}  // namespace strata::app
