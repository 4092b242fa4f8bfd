// apps/strata/cmd_bench_train.cpp — `strata bench train [--config F] [--set k=v]...
// [--layouts tp2,dp2] [--json]`: training tokens/s and MFU against the f32 GEMM rate measured
// in the same run; with --layouts (under mpirun), the same config in each parallel layout, one
// after the other, in one JSON (bench/train_bench.h).
#include <cstdio>

#include "apps/strata/commands.h"
#include "bench/train_bench.h"
#include "core/size.h"

namespace strata::app {

void register_bench_train(CLI::App& bench) {
  struct Args {
    TrainBenchOptions options;
    std::vector<std::string> layouts;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "train", "training tokens/s and MFU, with the f32 GEMM peak measured in the same run");
  cmd->add_option("--config,-c", args->options.config_path, "TOML config (default: built-in)");
  cmd->add_option("--set,-s", args->options.overrides, "override: --set section.key=value")
      ->take_all();
  cmd->add_option("--gemm-seconds", args->options.gemm_seconds, "time of each GEMM measurement")
      ->capture_default_str();
  cmd->add_option("--layouts", args->layouts,
                  "parallel layouts to compare on this job's ranks (mpirun -np N), e.g. tp2,dp2")
      ->delimiter(',');
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
    if (!args->layouts.empty()) {
      nlohmann::json j = run_train_layouts_bench(args->options, args->layouts);
      if (j["layouts"].empty() || !j["layouts"][0].contains("tp_comm_share")) return;  // rank > 0
      if (args->json) {
        std::printf("%s\n", j.dump().c_str());
        return;
      }
      std::printf("strata bench train: %d ranks, %lld tokens/step\n", j["ranks"].get<int>(),
                  j["tokens_per_step"].get<long long>());
      for (const auto& r : j["layouts"])
        std::printf("  %-8s %8.0f tokens/s  %8.1f ms/step  comm %s/step (tp %s)  tp collectives "
                    "%.1f%% of step time, waiting on dp streams %.1f%%  device peak %s\n",
                    r["layout"].get<std::string>().c_str(), r["tokens_per_s"].get<double>(),
                    r["step_ms_median"].get<double>(),
                    format_bytes(r["comm_bytes_per_step"].get<uint64_t>()).c_str(),
                    format_bytes(r["tp_comm_bytes_per_step"].get<uint64_t>()).c_str(),
                    100 * r["tp_comm_share"].get<double>(), 100 * r["dp_wait_share"].get<double>(),
                    format_bytes(r["device_peak_bytes"].get<uint64_t>()).c_str());
      return;
    }
    nlohmann::json j = run_train_bench(args->options);
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("strata bench train: %lld parameters, %lld tokens/step, %zu timed steps\n",
                j["params"].get<long long>(), j["tokens_per_step"].get<long long>(),
                j["steps_timed"].get<size_t>());
    std::printf("  %.0f tokens/s (median), %.1f ms/step, %.1f GFLOP/s achieved\n",
                j["tokens_per_s"].get<double>(), j["step_ms_median"].get<double>(),
                j["achieved_gflops"].get<double>());
    std::printf("  f32 GEMM peak %.1f GFLOP/s (before %.1f, after %.1f) -> MFU %.1f%%\n",
                j["gemm_peak_gflops"].get<double>(), j["gemm_peak_gflops_before"].get<double>(),
                j["gemm_peak_gflops_after"].get<double>(), 100.0 * j["mfu"].get<double>());
    std::printf("  loss %.4f -> %.4f\n", j["loss_first"].get<double>(), j["loss_last"].get<double>());
  });
}

}  // namespace strata::app
