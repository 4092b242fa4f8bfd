// apps/strata/cmd_bench_checkpoint.cpp — `strata bench checkpoint --dir D [--config F]
// [--set k=v]... [--steps N] [--json]`: checkpoint write GB/s against `bench io` write GB/s on
// the same folder in the same run, the stall per save, and the time to resume
// (bench/checkpoint_bench.h).
#include <cstdio>

#include "apps/strata/commands.h"
#include "bench/checkpoint_bench.h"
#include "core/size.h"

namespace strata::app {

void register_bench_checkpoint(CLI::App& bench) {
  struct Args {
    CheckpointBenchOptions options;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "checkpoint", "checkpoint write GB/s vs the disk's (bench io, same folder, same run), stall per save, resume time");
  cmd->add_option("--dir", args->options.dir, "folder for the checkpoints and the io bench file")->required();
  cmd->add_option("--config,-c", args->options.config_path, "TOML config (default: built-in)");
  cmd->add_option("--set,-s", args->options.overrides, "override: --set section.key=value")->take_all();
  cmd->add_option("--steps", args->options.steps, "training steps (a save every 2)")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
    nlohmann::json j = run_checkpoint_bench(args->options);
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("strata bench checkpoint: %lld parameters, %s per rank file, async %s\n",
                j["params"].get<long long>(), format_bytes(j["checkpoint_file_bytes"].get<uint64_t>()).c_str(),
                j["async"].get<bool>() ? "on" : "off");
    std::printf("  disk (bench io, same folder): write %.2f GB/s\n", j["disk_write_gbps"].get<double>());
    std::printf("  checkpoint write %.2f GB/s (median over %zu saves) = %.2f of the disk\n",
                j["checkpoint_write_gbps"].get<double>(), j["saves"].size(), j["write_ratio"].get<double>());
    for (const auto& s : j["stalls"])
      std::printf("  save at step %lld: stall %.1f ms = %.1f%% of a %.0f ms step\n", s["step"].get<long long>(),
                  s["stall_ms"].get<double>(), 100.0 * s["share_of_step"].get<double>(),
                  j["step_ms_median"].get<double>());
    std::printf("  resume (verify + load): %.2f s\n", j["resume_seconds"].get<double>());
  });
}

}  // namespace strata::app
