// apps/strata/cmd_bench_train.cpp — `strata bench train [--config F] [--set k=v]... [--json]`:
// training tokens/s and MFU against the f32 GEMM rate measured in the same run
// (bench/train_bench.h).
#include <cstdio>

#include "apps/strata/commands.h"
#include "bench/train_bench.h"

namespace strata::app {

void register_bench_train(CLI::App& bench) {
  struct Args {
    TrainBenchOptions options;
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
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
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
