// apps/strata/cmd_plan.cpp — `strata plan [--config F] [--set k=v]... [--ranks N] [--json]`:
// the bytes each memory tier needs per rank for a config, against each limit, before anything
// is allocated (engine/plan.h). Prints the table and a verdict; exit status 0 either way.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/strata/commands.h"
#include "apps/strata/common.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/size.h"
#include "engine/plan.h"
#include "kernels/device.h"

namespace strata::app {

void register_plan(CLI::App& app) {
  struct Args {
    ConfigArgs config;
    int ranks = 1;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("plan", "bytes per memory tier for a config, and whether it fits");
  add_config_options(*cmd, args->config);
  cmd->add_option("--ranks", args->ranks, "ranks of the run, all on this machine")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args] {
    Config cfg = load(args->config);
    if (args->ranks < 1) fail("plan::args", str("--ranks ", args->ranks, " must be at least 1"));
    const int model_parallel = cfg.parallel.tp * cfg.parallel.pp;
    int dp = cfg.parallel.dp ? cfg.parallel.dp : args->ranks / model_parallel;
    if (dp < 1 || dp * model_parallel != args->ranks)
      fail("plan::args", str("--ranks ", args->ranks, " is not dp × tp × pp for this config"));
    PlanMachine machine;
    machine.ranks_here = args->ranks;
    const bool cuda = cfg.train.device == "cuda" || (cfg.train.device == "auto" && cuda_device_count() > 0);
    if (cuda) {
      machine.device_is_host_memory = false;
      if (cuda_device_count() > 0) {
        machine.device_capacity = make_device(DeviceKind::cuda)->memory().limit_bytes;
      } else if (cfg.offload.device_mem_limit) {
        machine.device_capacity = cfg.offload.device_mem_limit;
      } else {
        fail("plan::device", "train.device = cuda but this machine has no CUDA device to size",
             "set offload.device_mem_limit to the GPU memory to plan for");
      }
    } else {
      machine.device_is_host_memory = true;
      machine.device_capacity = physical_memory_bytes();
    }
    MemoryPlan p = plan_memory(cfg, dp, machine);
    if (args->json) {
      nlohmann::json rows = nlohmann::json::array(), checks = nlohmann::json::array();
      for (const auto& r : p.rows) rows.push_back({{"tier", r.tier}, {"what", r.what}, {"bytes", r.bytes}});
      for (const auto& c : p.checks)
        checks.push_back({{"what", c.what}, {"need", c.need}, {"limit", c.limit},
                          {"limit_name", c.limit_name}, {"ok", c.ok()}});
      nlohmann::json j = {{"params", p.params}, {"ranks", args->ranks}, {"dp", dp},
                          {"tp", cfg.parallel.tp}, {"pp", cfg.parallel.pp},
                          {"rows", rows}, {"checks", checks}, {"fits", p.fits()},
                          {"totals", {{"device", p.tier_bytes("device")}, {"pinned", p.tier_bytes("pinned")},
                                      {"host", p.tier_bytes("host")}, {"nvme", p.tier_bytes("nvme")}}}};
      std::printf("%s\n", j.dump().c_str());
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
    std::printf("%s", p.table().c_str());
    std::printf("%s\n", p.fits() ? "fits" : "does NOT fit: `strata train` would refuse this run");
  });
}

}  // namespace strata::app
