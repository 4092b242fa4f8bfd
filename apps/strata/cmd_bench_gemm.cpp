// apps/strata/cmd_bench_gemm.cpp — `strata bench gemm [--m M --n N --k K] [--threads T]
// [--seconds S] [--json]`: the f32 GEMM rate of strata's CPU linear path next to one
// multi-threaded OpenBLAS call (bench/gemm_bench.h), validated first. With --json, one JSON
// object on stdout; otherwise a short summary. Errors are thrown as strata::Error.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/strata/commands.h"
#include "bench/gemm_bench.h"

namespace strata::app {

void register_bench_gemm(CLI::App& bench) {
  struct Args {
    GemmBenchOptions options;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "gemm", "f32 GEMM out = a·b^T: strata's CPU linear path vs one multi-threaded OpenBLAS call");
  cmd->add_option("--m", args->options.m, "rows of a and out")->capture_default_str();
  cmd->add_option("--n", args->options.n, "rows of b, columns of out")->capture_default_str();
  cmd->add_option("--k", args->options.k, "columns of a and b (the reduction)")
      ->capture_default_str();
  cmd->add_option("--threads", args->options.threads, "threads (0: the process's oneTBB limit)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_option("--seconds", args->options.min_seconds,
                  "time each path at least this long (and at least 3 calls)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
    const nlohmann::json j = run_gemm_bench(args->options);
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("strata bench gemm: out (%d, %d) = a (%d, %d) · b^T, f32, %d threads\n",
                j["m"].get<int>(), j["n"].get<int>(), j["m"].get<int>(), j["k"].get<int>(),
                j["threads"].get<int>());
    std::printf("cpu: %s\nblas: %s\n", j["isa"].get<std::string>().c_str(),
                j["blas"].get<std::string>().c_str());
    std::printf("validated against the double reference (worst error %.2g of its f32 bound)\n",
                j["max_error_ratio"].get<double>());
    std::printf("  %-44s %8.1f GFLOP/s (median %.1f)\n",
                "strata linear path (oneTBB blocks of sgemm)", j["gflops"].get<double>(),
                j["gflops_median"].get<double>());
    std::printf("  %-44s %8.1f GFLOP/s (median %.1f)\n", "one cblas_sgemm call, OpenBLAS threads",
                j["gflops_cblas_single_call"].get<double>(),
                j["gflops_cblas_single_call_median"].get<double>());
    std::printf("  strata / cblas: %.2f   (%zu calls each, %.1f s)\n",
                j["ratio_to_cblas"].get<double>(), j["calls"].get<size_t>(),
                j["seconds"].get<double>());
  });
}

}  // namespace strata::app
