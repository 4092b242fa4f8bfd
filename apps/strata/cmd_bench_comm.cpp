// apps/strata/cmd_bench_comm.cpp — `mpirun -np N strata bench comm [--min 1K --max 256M]
// [--step-factor F] [--iters I] [--json]`: collectives with nccl-tests' columns
// (bench/comm_bench.h). Rank 0 prints.
#include <cstdio>

#include "apps/strata/commands.h"
#include "apps/strata/common.h"
#include "bench/comm_bench.h"
#include "core/size.h"

namespace strata::app {

void register_bench_comm(CLI::App& bench) {
  struct Args {
    CommBenchOptions options;
    std::string min = "1K", max = "256M";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "comm", "all-gather, reduce-scatter, all-reduce: time, algbw, busbw, #wrong (under mpirun)");
  cmd->add_option("--min", args->min, "smallest size")->capture_default_str();
  cmd->add_option("--max", args->max, "largest size")->capture_default_str();
  cmd->add_option("--step-factor", args->options.step_factor, "size multiplier")->capture_default_str();
  cmd->add_option("--iters", args->options.iters, "timed calls per size (0: ~0.2 s)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
    args->options.min_bytes = parse_bytes(args->min, "--min");
    args->options.max_bytes = parse_bytes(args->max, "--max");
    auto world = make_world();
    nlohmann::json j = run_comm_bench(*world, args->options);
    if (world->rank() != 0) return;
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("strata bench comm: %d ranks, %s, float32\n", j["ranks"].get<int>(),
                j["backend"].get<std::string>().c_str());
    std::printf("%-15s %12s %12s %10s %10s %10s %7s\n", "op", "size(B)", "count", "time(us)",
                "algbw", "busbw", "#wrong");
    for (const auto& r : j["results"])
      std::printf("%-15s %12llu %12llu %10.1f %10.3f %10.3f %7llu\n", r["op"].get<std::string>().c_str(),
                  (unsigned long long)r["size"].get<uint64_t>(), (unsigned long long)r["count"].get<uint64_t>(),
                  r["time_us"].get<double>(), r["algbw"].get<double>(), r["busbw"].get<double>(),
                  (unsigned long long)r["wrong"].get<uint64_t>());
  });
}

}  // namespace strata::app
