// apps/strata/cmd_bench_pipeline.cpp — `strata bench pipeline [--config F] [--set k=v]...
// [--micro 4,8,16] [--schedules 1f1b,gpipe] [--json]` under mpirun -np pp: each stage's idle
// share measured in the trace against (pp − 1) / (m + pp − 1), and the first stage's memory
// (bench/pipeline_bench.h).
#include <cstdio>
#include <string>

#include "apps/strata/commands.h"
#include "bench/pipeline_bench.h"
#include "core/size.h"

namespace strata::app {

void register_bench_pipeline(CLI::App& bench) {
  struct Args {
    PipelineBenchOptions options;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "pipeline", "pipeline bubble per stage from the trace, for each schedule and micro-batch count "
                  "(mpirun -np pp)");
  cmd->add_option("--config,-c", args->options.config_path, "TOML config (default: built-in)");
  cmd->add_option("--set,-s", args->options.overrides, "override: --set section.key=value")->take_all();
  cmd->add_option("--micro", args->options.micro_batches, "micro-batches per step to measure")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--schedules", args->options.schedules, "schedules: 1f1b, gpipe")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object on stdout (rank 0)");
  cmd->callback([args] {
    nlohmann::json j = run_pipeline_bench(args->options);
    if (j["runs"].empty()) return;  // rank > 0
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("strata bench pipeline: %d stages, %d thread(s) each\n", j["pp"].get<int>(),
                j["threads"].get<int>());
    std::printf("  %-6s %4s %8s  %s  %12s %12s %10s\n", "sched", "m", "ideal", "idle share per stage",
                "1st acts", "1st peak", "tokens/s");
    for (const auto& r : j["runs"]) {
      std::string idle;
      for (const auto& s : r["stages"]) {
        char b[32];
        std::snprintf(b, sizeof b, " %.3f", s["idle_share"].get<double>());
        idle += b;
      }
      std::printf("  %-6s %4d %8.3f %s  %12s %12s %10.0f\n", r["schedule"].get<std::string>().c_str(),
                  r["micro_batches"].get<int>(), r["ideal_idle_share"].get<double>(), idle.c_str(),
                  format_bytes(r["first_stage_activation_bytes"].get<uint64_t>()).c_str(),
                  format_bytes(r["first_stage_device_peak_bytes"].get<uint64_t>()).c_str(),
                  r["tokens_per_s"].get<double>());
    }
  });
}

}  // namespace strata::app
