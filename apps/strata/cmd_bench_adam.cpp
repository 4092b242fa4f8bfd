// apps/strata/cmd_bench_adam.cpp — `strata bench adam --numel N [--isa ...] [--threads T]
// [--repeats R] [--json]`: the CPU AdamW step against the machine's streaming bound, the fused
// bf16 step against separate passes, and the step with bf16 m and v (bench/adam_bench.h). With --json, one JSON object on
// stdout; otherwise a short table. Errors are thrown as strata::Error.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/strata/commands.h"
#include "bench/adam_bench.h"
#include "core/size.h"

namespace strata::app {

void register_bench_adam(CLI::App& bench) {
  struct Args {
    AdamBenchOptions options;
    std::string numel = "64M";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "adam", "CPU AdamW: step, fused bf16 step, unfused passes and bf16 m and v vs the streaming "
              "bound");
  cmd->add_option("--numel", args->numel,
                  "parameters to update: a count, or with a binary suffix (64M = 67108864)")
      ->capture_default_str();
  cmd->add_option("--isa", args->options.isa, "kernels to time: auto, scalar, avx2 or avx512")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512"}))
      ->capture_default_str();
  cmd->add_option("--threads", args->options.threads, "oneTBB threads (0: the process's limit)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_option("--repeats", args->options.repeats,
                  "timed repetitions of each kernel; the best is reported")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
    args->options.numel = parse_bytes(args->numel, "--numel");
    const nlohmann::json j = run_adam_bench(args->options);
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    const auto mps = [&](const char* key) { return j[key].get<double>() / 1e6; };
    std::printf("strata bench adam: numel %zu, isa %s, threads %d, best of %d, huge pages %s\n",
                j["numel"].get<size_t>(), j["isa"].get<std::string>().c_str(),
                j["threads"].get<int>(), j["repeats"].get<int>(),
                j["huge_pages"].get<bool>() ? "yes" : "no");
    std::printf("validated on %zu elements against the scalar reference: %zu wrong\n",
                j["validated_numel"].get<size_t>(), j["wrong"].get<size_t>());
    std::printf("  %-34s %10.1f Mparam/s  %6.1f GB/s\n", "bound (stream, no math, 28 B)",
                mps("bound_params_per_s"), j["gbps_bound"].get<double>());
    std::printf("  %-34s %10.1f Mparam/s  %6.1f GB/s  %.3f of bound\n", "step (f32, 28 B)",
                mps("params_per_s"), j["gbps"].get<double>(), j["ratio_to_bound"].get<double>());
    std::printf("  %-34s %10.1f Mparam/s  %6.1f GB/s\n", "fused (scale+step+bf16 copy, 30 B)",
                mps("params_per_s_fused"), j["gbps_fused"].get<double>());
    std::printf("  %-34s %10.1f Mparam/s  %6.1f GB/s\n", "unfused (3 passes, 42 B)",
                mps("params_per_s_unfused"), j["gbps_unfused"].get<double>());
    std::printf("  %-34s %10.1f Mparam/s  %6.1f GB/s\n", "bf16 m and v (step, 20 B)",
                mps("params_per_s_bf16_states"), j["gbps_bf16_states"].get<double>());
    std::printf("  fused / unfused: %.2fx\n", j["ratio_fused_to_unfused"].get<double>());
  });
}

}  // namespace strata::app
