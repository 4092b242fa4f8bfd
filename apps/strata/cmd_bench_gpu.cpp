// apps/strata/cmd_bench_gpu.cpp — `strata bench gpu [--device N] [--gemm MxNxK]...
// [--gemm-f32 MxNxK]... [--adam-numel N] [--adam-steps N] [--copy-bytes B] [--seconds S]
// [--no-train] [--train-config F] [--train-set k=v]... [--train-steps N] [--offload-set k=v]...
// [--offload-limit F] [--nvme-path DIR] [--json]`: the CUDA backend on the GPU present
// (bench/gpu_bench.h). With --json, one JSON object on stdout; otherwise a short table.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/strata/commands.h"
#include "bench/gpu_bench.h"
#include "core/error.h"
#include "core/size.h"

namespace strata::app {
namespace {

std::array<int, 3> parse_shape(const std::string& s) {
  int m = 0, n = 0, k = 0;
  char x1 = 0, x2 = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c%d", &m, &x1, &n, &x2, &k) != 5 || x1 != 'x' || x2 != 'x' ||
      m <= 0 || n <= 0 || k <= 0)
    fail("bench::gpu", str("bad GEMM shape '", s, "'"), "write it MxNxK, e.g. --gemm 8192x8192x8192");
  return {m, n, k};
}

void print_table(const nlohmann::json& j) {
  std::printf("strata bench gpu: %s (%.1f s)\n", j["device"].get<std::string>().c_str(), j["seconds"].get<double>());
  auto skipped = [](const nlohmann::json& s) { return !s.value("ran", false); };
  for (const auto& g : j["gemm_bf16"]) {
    if (skipped(g)) {
      std::printf("  bf16 GEMM %dx%dx%d: not run: %s\n", g["m"].get<int>(), g["n"].get<int>(), g["k"].get<int>(),
                  g["reason"].get<std::string>().c_str());
      continue;
    }
    std::printf("  bf16 GEMM %5dx%5dx%5d  strata %7.1f TFLOP/s  cuBLAS best %7.1f (candidate %d of %d)  %.3f\n",
                g["m"].get<int>(), g["n"].get<int>(), g["k"].get<int>(), g["strata_tflops"].get<double>(),
                g["cublas_best_tflops"].get<double>(), g["cublas_best_candidate"].get<int>(),
                g["candidates"].get<int>(), g["ratio_to_cublas_best"].get<double>());
  }
  for (const auto& f : j["gemm_f32"]) {
    if (skipped(f)) std::printf("  f32 GEMM %dx%dx%d: not run: %s\n", f["m"].get<int>(), f["n"].get<int>(),
                                f["k"].get<int>(), f["reason"].get<std::string>().c_str());
    else std::printf("  f32 GEMM %5dx%5dx%5d  strata %7.1f TFLOP/s\n", f["m"].get<int>(), f["n"].get<int>(),
                     f["k"].get<int>(), f["tflops"].get<double>());
  }
  const auto& a = j["adamw"];
  if (skipped(a)) std::printf("  AdamW: not run: %s\n", a["reason"].get<std::string>().c_str());
  else std::printf("  AdamW %zu params  %.3g params/s  %.0f GB/s (bf16 copy fused %.0f)  device copy %.0f GB/s  "
                   "ratio %.3f (goal %.2f); bit-identical to the CPU over %d steps\n",
                   a["numel"].get<size_t>(), a["params_per_s"].get<double>(), a["gbps"].get<double>(),
                   a["gbps_fused_bf16_copy"].get<double>(), a["copy_gbps"].get<double>(),
                   a["ratio_to_copy"].get<double>(), a["goal_ratio_to_copy"].get<double>(),
                   a["validated_steps"].get<int>());
  const auto& p = j["pinned"];
  if (skipped(p)) std::printf("  pinned copies: not run: %s\n", p["reason"].get<std::string>().c_str());
  else std::printf("  pinned host->device %.1f GB/s, device->host %.1f GB/s\n", p["h2d_gbps"].get<double>(),
                   p["d2h_gbps"].get<double>());
  const auto& t = j["train"];
  if (t.contains("ran")) {
    std::printf("  training: not run: %s\n", t["reason"].get<std::string>().c_str());
    return;
  }
  for (const char* run : {"device", "offload_host", "offload_nvme"}) {
    const auto& r = t[run];
    if (skipped(r)) std::printf("  train %-12s not run: %s\n", run, r["reason"].get<std::string>().c_str());
    else std::printf("  train %-12s %.0f tokens/s, MFU %.1f%% of f32 GEMM (%.1f%% of bf16), loss %.3f -> %.3f\n", run,
                     r["tokens_per_s"].get<double>(), 100 * r["mfu_vs_f32_gemm"].get<double>(),
                     100 * r["mfu_vs_bf16_gemm"].get<double>(), r["loss_first"].get<double>(),
                     r["loss_last"].get<double>());
  }
}

}  // namespace

void register_bench_gpu(CLI::App& bench) {
  struct Args {
    GpuBenchOptions options;
    std::vector<std::string> shapes, f32_shapes;
    std::string adam_numel = "256M", copy_bytes = "1G";
    bool no_train = false, json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "gpu", "CUDA: bf16 GEMM vs cuBLAS's best, AdamW vs a device copy, pinned copies, training");
  cmd->add_option("--device", args->options.device, "CUDA device ordinal")->capture_default_str();
  cmd->add_option("--gemm", args->shapes, "bf16 GEMM shape MxNxK (repeatable; default: 4 shapes)");
  cmd->add_option("--gemm-f32", args->f32_shapes, "f32 GEMM shape MxNxK (repeatable; default: 4096^3, 8192^3)");
  cmd->add_option("--adam-numel", args->adam_numel, "parameters of the timed AdamW step")->capture_default_str();
  cmd->add_option("--adam-steps", args->options.adam_steps, "steps of the bit-for-bit AdamW validation")
      ->capture_default_str();
  cmd->add_option("--copy-bytes", args->copy_bytes, "bytes of the device and pinned copies")->capture_default_str();
  cmd->add_option("--seconds", args->options.min_seconds, "time of each measurement")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_flag("--no-train", args->no_train, "skip the training runs");
  cmd->add_option("--train-config", args->options.train_config, "TOML config of the training runs");
  cmd->add_option("--train-set", args->options.train_overrides, "override for the training runs: section.key=value")
      ->take_all();
  cmd->add_option("--train-steps", args->options.train_steps, "steps of each training run (first is warm-up)")
      ->capture_default_str();
  cmd->add_option("--offload-set", args->options.offload_overrides,
                  "override for the offloaded run, on top of --train-set (default: params, grads and optimizer "
                  "on host)")
      ->take_all();
  cmd->add_option("--offload-limit", args->options.offload_limit_fraction,
                  "device_mem_limit of the offloaded run as a fraction of the all-device run's state bytes "
                  "(0: halfway between the two runs' planned device bytes)")
      ->capture_default_str();
  cmd->add_option("--nvme-path", args->options.nvme_path, "directory for the NVMe-offloaded run");
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
    args->options.adam_numel = parse_bytes(args->adam_numel, "--adam-numel");
    args->options.copy_bytes = parse_bytes(args->copy_bytes, "--copy-bytes");
    args->options.train = !args->no_train;
    for (const auto& s : args->shapes) args->options.gemm_shapes.push_back(parse_shape(s));
    for (const auto& s : args->f32_shapes) args->options.gemm_f32_shapes.push_back(parse_shape(s));
    const nlohmann::json j = run_gpu_bench(args->options);
    if (args->json) std::printf("%s\n", j.dump().c_str());
    else print_table(j);
  });
}

}  // namespace strata::app
