// bench/sweep_bench.cpp — run_sweep, and its CSV and SVG renderings (the SVG through report/chart.h).
#include "bench/sweep_bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <tbb/global_control.h>

#include "bench/comm_bench.h"
#include "bench/io_bench.h"
#include "bench/rate_probe.h"
#include "bench/stats.h"
#include "core/error.h"
#include "core/size.h"
#include "comm/comm.h"
#include "engine/config.h"
#include "engine/rate_cache.h"
#include "engine/step_model.h"
#include "engine/trainer.h"
#include "report/chart.h"
#include "report/metrics_report.h"  // write_output

namespace strata {
namespace {

Tier parse_tier(const std::string& s, const std::string& spec) {
  if (s == "device") return Tier::device;
  if (s == "host") return Tier::host;
  if (s == "nvme") return Tier::nvme;
  fail("bench::sweep", str("placement '", spec, "': unknown tier '", s, "'"),
       "write placements as params:optimizer[:grads] with device, host or nvme, e.g. host:nvme");
}

struct SweepPlacement {  // one --placements entry: its spelling and tiers
  std::string name;
  Tier params, optimizer, grads;
};

SweepPlacement parse_placement(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 3)
    fail("bench::sweep", str("placement '", spec, "' is not params:optimizer[:grads]"));
  SweepPlacement p{spec, parse_tier(parts[0], spec), parse_tier(parts[1], spec), Tier::device};
  p.grads = parts.size() == 3 ? parse_tier(parts[2], spec)
                              : (p.optimizer == Tier::device ? Tier::device : Tier::host);
  return p;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

void write_file(const std::string& path, const std::string& text) {
  report::write_output(path, text, "--out");
}

}  // namespace

nlohmann::json run_sweep(Communicator& world, const SweepOptions& o) {
  Config base = load_config(o.config_path, o.overrides);
  if (base.train.steps < 2)
    fail("bench::sweep", "train.steps must be at least 2 (the first step is warm-up)");
  std::vector<SweepPlacement> placements;
  for (const auto& s : o.placements) {
    placements.push_back(parse_placement(s));
    const SweepPlacement& p = placements.back();
    for (size_t i = 0; i + 1 < placements.size(); ++i)
      if (placements[i].params == p.params && placements[i].optimizer == p.optimizer &&
          placements[i].grads == p.grads)
        fail("bench::sweep", str("placement '", p.name, "' is listed twice (as '", placements[i].name,
                                 "' too): its rows would run the same configuration twice"),
             "list each placement once (--both-orders adds the serial order of each)");
  }
  bool any_nvme = false;
  for (const auto& p : placements) any_nvme |= p.params == Tier::nvme || p.optimizer == Tier::nvme;
  // Checked before any row runs: an NVMe row's prediction and io bound need the measured rates.
  if (any_nvme && o.io_bench_bytes < base.io.block_size)
    fail("bench::sweep",
         o.io_bench_bytes ? str("--io-bytes ", format_bytes(o.io_bench_bytes), " is less than one "
                                "io.block_size (", format_bytes(base.io.block_size), "): the NVMe "
                                "rates, which NVMe placements' predictions and io bound need, "
                                "cannot be measured with it")
                          : std::string("--io-bytes 0 skips the NVMe rate measurement, which NVMe "
                                        "placements' predictions and io bound need"),
         "give --io-bytes at least the NVMe bytes a step moves, e.g. --io-bytes 4G (on a virtual "
         "disk smaller passes can be served from the host's cache: docs/tuning.md)");
  if (any_nvme && base.offload.nvme_path.empty())
    fail("bench::sweep", "an NVMe placement needs offload.nvme_path", "--set offload.nvme_path=DIR");

  for (const auto& d : base.offload.nvme_path) {
    std::error_code ec;
    std::filesystem::create_directories(d, ec);  // as the engine does
  }
  NvmeRates nvme;  // zero (and a null report) when not measured
  if (any_nvme && o.io_bench_bytes > 0) {
    // Every rank measures at once, as they will share the disks during training: idle and
    // beside compute on every thread the rows train with (the step model's rates for the NVMe
    // traffic beside the CPU device's passes), alternating, kSweepIoRounds pairs.
    std::unique_ptr<tbb::global_control> limit;
    if (base.train.threads > 0)
      limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                    size_t(base.train.threads));
    nvme = measure_nvme_rates(base, nvme_bench_options(base, o.io_bench_bytes), kSweepIoRounds);
  }
  // The step model's other rates, measured now by every rank at once (as the NVMe rate is), so
  // each is this rank's share and the model divides them by no one (ranks_here = 1).
  RateProbeOptions probe;
  probe.io_bytes = 0;  // the NVMe rates are the ones above
  probe.threads = base.train.threads;  // as the rows will train
  MachineRates rates = probe_rates(base, probe);
  rates.nvme_read_gbps = nvme.read_gbps;
  rates.nvme_write_gbps = nvme.write_gbps;
  rates.nvme_read_busy_gbps = nvme.read_busy_gbps;
  rates.nvme_write_busy_gbps = nvme.write_busy_gbps;
  rates.nvme_steal_s_per_gb = nvme.steal_s_per_gb;
  // The data-parallel collectives' rate: an all-gather and a reduce-scatter of 64M, on the CPU
  // device only (bench comm runs MPI on host buffers, not NCCL). The median of five rounds of
  // eight calls each: one round's rate swung 0.45–1.9 GB/s between runs on a 2-core machine,
  // and the prediction of every row with it.
  if (world.size() > 1 && !uses_cuda(base)) {
    CommBenchOptions cb;
    cb.min_bytes = cb.max_bytes = 64ull << 20;
    cb.iters = 8;
    cb.all_reduce = false;  // the data-parallel step runs none
    std::vector<double> rounds;
    for (int round = 0; round < 5; ++round) {
      double bytes = 0, us = 0;
      const nlohmann::json comm = run_comm_bench(world, cb);
      for (const auto& row : comm["results"]) {  // an all-gather and a reduce-scatter
        bytes += row["size"].get<double>();
        us += row["time_us"].get<double>();
      }
      if (us > 0) rounds.push_back(bytes / (us * 1e-6) / 1e9);
    }
    rates.comm_gbps = median(rounds);
  }
  PlanMachine model_machine;
  model_machine.device_is_host_memory = !uses_cuda(base);
  model_machine.ranks_here = 1;
  const int dp = world.size() / (base.parallel.tp * base.parallel.pp);

  // One run per placement, or per placement and optimizer order.
  struct SweepRun {
    SweepPlacement placement;
    bool overlap;
    std::string name;
  };
  std::vector<SweepRun> runs;
  for (const auto& p : placements) {
    const bool off_device = p.optimizer != Tier::device;
    if (o.both_orders && off_device) {
      runs.push_back({p, true, p.name});
      runs.push_back({p, false, p.name + " serial"});
    } else {
      runs.push_back({p, base.offload.overlap_optimizer, p.name});
    }
  }

  nlohmann::json rows = nlohmann::json::array();
  for (const auto& run : runs) {
    const SweepPlacement& p = run.placement;
    Config c = base;
    c.offload.params = p.params;
    c.offload.optimizer = p.optimizer;
    c.offload.grads = p.grads;
    c.offload.overlap_optimizer = run.overlap;
    c.eval.batches = 0;
    clear_run_outputs(c);  // runs of one config: none saves
    c.log.trace.clear();
    validate(c);
    std::vector<double> step, compute, wait_comm, wait_io, optim, uwait, tps, h2d, d2h, nr, nw, comm;
    std::vector<double> cores, steal;  // the steps' CPU time (StepRecord::cpu)
    uint64_t device_peak = 0;
    TrainerOptions topt;
    topt.progress = false;
    topt.on_step = [&](const StepRecord& r) {
      if (r.step == 1) return;
      step.push_back(r.step_ms);
      compute.push_back(r.compute_ms);
      wait_comm.push_back(r.wait_comm_ms);
      wait_io.push_back(r.traffic.nvme_wait_ms);
      optim.push_back(r.optimizer_ms);
      uwait.push_back(r.traffic.update_wait_ms);
      tps.push_back(r.tokens_per_s);
      h2d.push_back(double(r.traffic.h2d_bytes));
      d2h.push_back(double(r.traffic.d2h_bytes));
      nr.push_back(double(r.traffic.nvme_read_bytes));
      nw.push_back(double(r.traffic.nvme_write_bytes));
      comm.push_back(double(r.traffic.comm_bytes));
      cores.push_back(r.cpu.process_cores(r.step_ms / 1000.0));
      if (const auto s = r.cpu.share(r.cpu.steal_s)) steal.push_back(*s);
    };
    ZeroMemory zmem;
    TrainSummary summary;
    {
      Trainer t(c, world, topt);
      summary = t.train();
      zmem = t.state_memory();
      device_peak = summary.device_peak_bytes;
    }
    const StepPrediction pred = predict_step(c, dp, model_machine, rates);
    const double nvme_bytes = mean(nr) + mean(nw);
    const double io_ms =
        (nvme.read_gbps > 0 && nvme.write_gbps > 0)
            ? (mean(nr) / (nvme.read_gbps * 1e9) + mean(nw) / (nvme.write_gbps * 1e9)) * 1e3
                             : 0.0;
    rows.push_back({{"placement", run.name},
                    {"params", tier_name(p.params)},
                    {"optimizer", tier_name(p.optimizer)},
                    {"grads", tier_name(p.grads)},
                    {"overlap_optimizer", run.overlap},
                    {"tokens_per_s", mean(tps)},
                    {"step_ms", mean(step)},
                    {"time", {{"compute_ms", mean(compute)}, {"wait_io_ms", mean(wait_io)},
                              {"wait_comm_ms", mean(wait_comm)}, {"optimizer_ms", mean(optim)},
                              {"update_wait_ms", mean(uwait)}}},
                    // This process's cores and the machine's time a hypervisor took (steal):
                    // on a VM the host's disk emulation can take it from the cores that compute.
                    {"cpu", {{"process_cores", mean(cores)},
                             {"steal_share", steal.empty() ? nlohmann::json(nullptr)
                                                           : nlohmann::json(mean(steal))}}},
                    {"peak_bytes", {{"device", device_peak}, {"pinned", zmem.pinned_bytes},
                                    {"host_state", zmem.host_bytes}, {"nvme", zmem.nvme_bytes},
                                    {"host_rss", summary.host_peak_rss_bytes}}},
                    {"bytes_per_step", {{"h2d", mean(h2d)}, {"d2h", mean(d2h)}, {"nvme_read", mean(nr)},
                                        {"nvme_write", mean(nw)}, {"comm", mean(comm)}}},
                    {"nvme_bytes_per_step", nvme_bytes},
                    {"io_bound_ms", io_ms},
                    {"predicted_step_ms", pred.step_ms},
                    {"predicted_bottleneck", pred.bottleneck},
                    {"measured_over_predicted", pred.step_ms > 0 ? mean(step) / pred.step_ms : 0.0},
                    {"predicted", {{"forward_ms", pred.forward_ms}, {"backward_ms", pred.backward_ms},
                                   {"comm_ms", pred.comm_ms},
                                   {"compute_ms", pred.compute_ms}, {"nvme_ms", pred.nvme_ms},
                                   {"copy_ms", pred.copy_ms}, {"optimizer_ms", pred.optimizer_ms},
                                   {"norm_ms", pred.norm_ms},
                                   {"exposed_optimizer_ms", pred.exposed_optimizer_ms},
                                   {"steal_ms", pred.steal_ms},
                                   {"bytes_per_step", {{"h2d", pred.bytes.h2d}, {"d2h", pred.bytes.d2h},
                                                       {"nvme_read", pred.bytes.nvme_read},
                                                       {"nvme_write", pred.bytes.nvme_write}}}}},
                    {"loss_last", summary.losses.empty() ? 0.0 : summary.losses.back()}});
  }
  // Overlap against the bounds: the all-device row (when present) is the compute bound.
  double compute_bound = 0;
  for (const auto& r : rows)
    if (r["params"] == "device" && r["optimizer"] == "device") compute_bound = r["step_ms"].get<double>();
  for (auto& r : rows) {
    double bound = std::max(compute_bound, r["io_bound_ms"].get<double>());
    r["bound_ms"] = bound;
    r["step_over_bound"] = bound > 0 ? r["step_ms"].get<double>() / bound : 0.0;
    r["throughput_vs_all_device"] = compute_bound > 0 ? compute_bound / r["step_ms"].get<double>() : 0.0;
  }
  nlohmann::json out = {{"config", config_to_json(base)},
                        {"ranks", world.size()},
                        {"io_bench", nvme.report},
                        {"nvme_read_gbps", nvme.read_gbps},
                        {"nvme_write_gbps", nvme.write_gbps},
                        {"rates", rates_json(rates)},
                        {"compute_bound_ms", compute_bound},
                        {"rows", rows}};
  if (world.rank() == 0 && !o.out_prefix.empty()) {
    write_file(o.out_prefix + ".json", out.dump(2) + "\n");
    write_file(o.out_prefix + ".csv", sweep_csv(out));
    write_file(o.out_prefix + ".svg", sweep_svg(out));
  }
  return out;
}

std::string sweep_csv(const nlohmann::json& s) {
  std::string out =
      "placement,params,optimizer,grads,tokens_per_s,step_ms,compute_ms,wait_io_ms,wait_comm_ms,"
      "optimizer_ms,device_peak_bytes,pinned_bytes,host_state_bytes,nvme_bytes,host_rss_bytes,"
      "h2d_bytes_per_step,d2h_bytes_per_step,nvme_read_bytes_per_step,nvme_write_bytes_per_step,"
      "comm_bytes_per_step,io_bound_ms,bound_ms,step_over_bound,predicted_step_ms,predicted_bottleneck,"
      "measured_over_predicted,update_wait_ms,overlap_optimizer,process_cores,steal_share\n";
  for (const auto& r : s["rows"]) {
    char line[1024];
    // Sweeps saved before the step model have no prediction: empty cells.
    std::string predicted = ",,";
    if (r.contains("predicted_step_ms")) {
      char cells[160];
      std::snprintf(cells, sizeof cells, "%.1f,%s,%.3f", r["predicted_step_ms"].get<double>(),
                    r["predicted_bottleneck"].get<std::string>().c_str(),
                    r["measured_over_predicted"].get<double>());
      predicted = cells;
    }
    // Sweeps saved before the overlapped optimizer step have no update waits: an empty cell.
    std::string update_wait;
    if (r["time"].contains("update_wait_ms")) update_wait = str(r["time"]["update_wait_ms"].get<double>());
    // Sweeps saved before rows said their optimizer order: an empty cell.
    std::string overlap;
    if (r.contains("overlap_optimizer")) overlap = r["overlap_optimizer"].get<bool>() ? "true" : "false";
    // Sweeps saved before rows had their CPU time, or a machine without /proc/stat: empty cells.
    std::string cores, steal;
    if (r.contains("cpu")) {
      cores = str(r["cpu"]["process_cores"].get<double>());
      if (r["cpu"]["steal_share"].is_number()) steal = str(r["cpu"]["steal_share"].get<double>());
    }
    std::snprintf(line, sizeof line,
                  "%s,%s,%s,%s,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%llu,%llu,%llu,%llu,%llu,%.0f,%.0f,%.0f,%.0f,%.0f,%.1f,%.1f,%.3f,%s,%s,%s,%s,%s\n",
                  r["placement"].get<std::string>().c_str(), r["params"].get<std::string>().c_str(),
                  r["optimizer"].get<std::string>().c_str(), r["grads"].get<std::string>().c_str(),
                  r["tokens_per_s"].get<double>(), r["step_ms"].get<double>(),
                  r["time"]["compute_ms"].get<double>(), r["time"]["wait_io_ms"].get<double>(),
                  r["time"]["wait_comm_ms"].get<double>(), r["time"]["optimizer_ms"].get<double>(),
                  (unsigned long long)r["peak_bytes"]["device"].get<uint64_t>(),
                  (unsigned long long)r["peak_bytes"]["pinned"].get<uint64_t>(),
                  (unsigned long long)r["peak_bytes"]["host_state"].get<uint64_t>(),
                  (unsigned long long)r["peak_bytes"]["nvme"].get<uint64_t>(),
                  (unsigned long long)r["peak_bytes"]["host_rss"].get<uint64_t>(),
                  r["bytes_per_step"]["h2d"].get<double>(), r["bytes_per_step"]["d2h"].get<double>(),
                  r["bytes_per_step"]["nvme_read"].get<double>(),
                  r["bytes_per_step"]["nvme_write"].get<double>(), r["bytes_per_step"]["comm"].get<double>(),
                  r["io_bound_ms"].get<double>(), r["bound_ms"].get<double>(),
                  r["step_over_bound"].get<double>(), predicted.c_str(), update_wait.c_str(),
                  overlap.c_str(), cores.c_str(), steal.c_str());
    out += line;
  }
  return out;
}

// Device memory (y) against throughput (x): one numbered point per placement, and a legend
// below the plot with each placement's host and NVMe bytes. Axes start at zero so distances
// read as ratios. Drawn with report/chart.h, as `strata report` is.
std::string sweep_svg(const nlohmann::json& s) {
  const int ranks = s["ranks"].get<int>();
  chart::Figure f;
  f.title = str("strata bench sweep: device memory against throughput (", ranks, " rank", ranks == 1 ? "" : "s", ")");
  f.columns = 1;
  f.panel_width = 860;  // room for the legend lines with their predictions
  f.panel_height = 370;
  f.legend_below = true;
  chart::Panel p;
  p.x.label = "tokens/s (all ranks)";
  p.x.from_zero = true;
  p.x.headroom = 0.15;
  p.y.label = "peak device bytes per rank";
  p.y.format = chart::Format::bytes;
  p.y.from_zero = true;
  p.y.headroom = 0.2;
  int i = 0;
  for (const auto& r : s["rows"]) {
    const std::string placement = r["placement"].get<std::string>();
    const double tps = r["tokens_per_s"].get<double>();
    const uint64_t device = r["peak_bytes"]["device"].get<uint64_t>();
    chart::Series pt;
    pt.name = placement;
    pt.color = chart::palette(size_t(i));
    pt.x = {tps};
    pt.y = {double(device)};
    pt.line = false;
    pt.markers = true;
    pt.marker_radius = 6;
    pt.label = std::to_string(i + 1);
    pt.label_dy = 10 + 12.0 * (i % 3);  // points that coincide keep each number legible
    p.series.push_back(std::move(pt));
    std::string predicted;
    if (r.contains("predicted_step_ms") && r["predicted_step_ms"].get<double>() > 0) {
      // A dashed line from the measured point to a small dot at the predicted throughput.
      const double ratio = r["measured_over_predicted"].get<double>();
      const double predicted_tps = tps * ratio;  // same tokens per step, predicted step time
      chart::Series pr;
      pr.name = str(placement, " predicted");
      pr.color = chart::palette(size_t(i));
      pr.x = {tps, predicted_tps};
      pr.y = {double(device), double(device)};
      pr.dashed = true;
      pr.markers = true;
      pr.marker_radius = 3;
      p.series.push_back(std::move(pr));
      char t[160];
      std::snprintf(t, sizeof t, "; predicted %.0f (step %.2fx)", predicted_tps, ratio);
      predicted = t;
    }
    char text[768];
    std::snprintf(text, sizeof text, "%d  %s (params:optimizer): %.0f tok/s, device %s, host %s, nvme %s%s",
                  i + 1, placement.c_str(), tps, format_bytes(device).c_str(),
                  format_bytes(r["peak_bytes"]["host_state"].get<uint64_t>() +
                               r["peak_bytes"]["pinned"].get<uint64_t>()).c_str(),
                  format_bytes(r["peak_bytes"]["nvme"].get<uint64_t>()).c_str(), predicted.c_str());
    f.legend.push_back({text, chart::palette(size_t(i)), false, false, true});
    ++i;
  }
  if (p.series.size() > s["rows"].size())
    f.legend.push_back({"to the small dot: predicted tok/s (step model, rates of this run); "
                        "step Nx = measured / predicted step time",
                        "#555555", true, true, false});
  f.panels.push_back(std::move(p));
  return chart::render_svg(f);
}

}  // namespace strata
