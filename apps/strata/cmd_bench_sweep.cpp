// apps/strata/cmd_bench_sweep.cpp — `strata bench sweep [--config F] [--set k=v]...
// [--placements p,...] [--both-orders] [--out PREFIX] [--json]`: one short training per placement
// (bench/sweep_bench.h); rank 0 prints and writes PREFIX.json/.csv/.svg.
#include <cstdio>
#include <fstream>

#include "core/error.h"

#include "apps/strata/commands.h"
#include "apps/strata/common.h"
#include "bench/sweep_bench.h"
#include "core/size.h"
#include "report/metrics_report.h"

namespace strata::app {

void register_bench_sweep(CLI::App& bench) {
  struct Args {
    SweepOptions options;
    std::string io_bytes = "1G";
    std::string render;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "sweep", "a short training per placement: tokens/s, time split, bytes per tier and per link");
  cmd->add_option("--config,-c", args->options.config_path, "TOML config (default: built-in)");
  cmd->add_option("--set,-s", args->options.overrides, "override: --set section.key=value")->take_all();
  cmd->add_option("--placements", args->options.placements,
                  "params:optimizer[:grads] each device|host|nvme (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--both-orders", args->options.both_orders,
               "run each placement with the optimizer off the device twice: overlapped and "
               "serial (offload.overlap_optimizer true and false; row \"<placement> serial\")");
  cmd->add_option("--out", args->options.out_prefix, "write PREFIX.json, PREFIX.csv and PREFIX.svg");
  cmd->add_option("--io-bytes", args->io_bytes,
                  "bytes of each pass of the NVMe rate measurement: 3 pairs of passes, idle and "
                  "beside compute (at least io.block_size with NVMe placements; 0: none, "
                  "without them)")
      ->capture_default_str();
  cmd->add_option("--render", args->render, "re-render a saved PREFIX.json as CSV and SVG under --out");
  cmd->add_flag("--json", args->json, "print one JSON object on stdout");
  cmd->callback([args] {
    if (!args->render.empty()) {
      std::ifstream in(args->render);
      if (!in) fail("bench::sweep", str("cannot open '", args->render, "'"));
      nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("rows") || !j.contains("ranks"))
        fail("bench::sweep", str("'", args->render, "' is not the JSON of a sweep"),
             "pass the PREFIX.json that `strata bench sweep --out PREFIX` wrote");
      if (args->options.out_prefix.empty()) fail("bench::sweep", "--render needs --out PREFIX");
      report::write_output(args->options.out_prefix + ".csv", sweep_csv(j), "--out");
      report::write_output(args->options.out_prefix + ".svg", sweep_svg(j), "--out");
      return;
    }
    args->options.io_bench_bytes = parse_bytes(args->io_bytes, "--io-bytes");
    if (!args->options.out_prefix.empty())  // before the sweep's minutes, not after them
      for (const char* ext : {".json", ".csv", ".svg"})
        report::check_output(args->options.out_prefix + ext, "--out");
    auto world = make_world();
    nlohmann::json j = run_sweep(*world, args->options);
    if (world->rank() != 0) return;
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    const auto& rates = j["rates"];
    if (j["nvme_read_gbps"].get<double>() > 0)
      std::printf("strata bench sweep: %d rank(s); NVMe %.2f GB/s read, %.2f GB/s write; beside "
                  "compute %.2f / %.2f, steal %.3f CPU s per GB (same run)\n",
                  j["ranks"].get<int>(), j["nvme_read_gbps"].get<double>(),
                  j["nvme_write_gbps"].get<double>(), rates.value("nvme_read_busy_gbps", 0.0),
                  rates.value("nvme_write_busy_gbps", 0.0),
                  rates.value("nvme_steal_s_per_gb", 0.0));
    else  // no NVMe placement: the disk was not measured
      std::printf("strata bench sweep: %d rank(s); NVMe not measured (no NVMe placement)\n",
                  j["ranks"].get<int>());
    std::printf("%-20s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %7s %9s %9s  %s\n", "placement", "tok/s",
                "step ms", "compute", "wait io", "wait comm", "optim", "device", "host", "nvme", "io bound",
                "/bound", "predicted", "/pred", "predicted bottleneck");
    for (const auto& r : j["rows"]) {
      std::printf("%-20s %9.0f %9.1f %9.1f %9.1f %9.1f %9.1f %9s %9s %9s %9.1f %7.2f %9.1f %9.2f  %s\n",
                  r["placement"].get<std::string>().c_str(), r["tokens_per_s"].get<double>(),
                  r["step_ms"].get<double>(), r["time"]["compute_ms"].get<double>(),
                  r["time"]["wait_io_ms"].get<double>(), r["time"]["wait_comm_ms"].get<double>(),
                  r["time"]["optimizer_ms"].get<double>(),
                  format_bytes(r["peak_bytes"]["device"].get<uint64_t>()).c_str(),
                  format_bytes(r["peak_bytes"]["host_state"].get<uint64_t>() +
                               r["peak_bytes"]["pinned"].get<uint64_t>()).c_str(),
                  format_bytes(r["peak_bytes"]["nvme"].get<uint64_t>()).c_str(),
                  r["io_bound_ms"].get<double>(), r["step_over_bound"].get<double>(),
                  r["predicted_step_ms"].get<double>(), r["measured_over_predicted"].get<double>(),
                  r["predicted_bottleneck"].get<std::string>().c_str());
    }
    if (!args->options.out_prefix.empty())
      std::printf("wrote %s.json, .csv and .svg\n", args->options.out_prefix.c_str());
  });
}

}  // namespace strata::app
