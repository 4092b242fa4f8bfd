// bench/train_bench.cpp — run_train_bench.
#include "bench/train_bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

#include "bench/gemm_bench.h"
#include "bench/stats.h"
#include "core/cpu.h"
#include "core/error.h"
#include "comm/comm.h"
#include "comm/comm_registry.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/trainer.h"

namespace strata {
namespace {

double gemm_peak(double seconds, nlohmann::json& record) {
  GemmBenchOptions g;
  g.min_seconds = seconds;
  nlohmann::json j = run_gemm_bench(g);
  record = j;
  return std::max(j["gflops"].get<double>(), j["gflops_cblas_single_call"].get<double>()) * 1e9;
}

}  // namespace

nlohmann::json run_train_bench(const TrainBenchOptions& o) {
  Config cfg = load_config(o.config_path, o.overrides);
  if (cfg.train.steps < 2)
    fail("bench::train", str("train.steps = ", cfg.train.steps, ": the first step is warm-up"),
         "use at least 2 steps (5 or more for a stable median)");
  nlohmann::json gemm_before, gemm_after;
  double peak_before = gemm_peak(o.gemm_seconds, gemm_before);

  auto world = make_solo_communicator();
  TrainerOptions topt;
  topt.progress = false;
  std::vector<double> step_tokens_per_s, step_ms;
  topt.on_step = [&](const StepRecord& r) {
    if (r.step == 1) return;  // warm-up
    step_tokens_per_s.push_back(r.tokens_per_s);
    step_ms.push_back(r.step_ms);
  };
  cfg.eval.batches = 0;
  clear_run_outputs(cfg);  // a benchmark saves nothing and logs no metrics file
  TrainSummary s;
  int64_t params;
  double flops_per_token;
  {
    Trainer trainer(cfg, *world, topt);
    params = trainer.num_params();
    s = trainer.train();
    LlamaModel model(cfg.model);
    flops_per_token = model.train_flops_per_token(cfg.data.seq_len);
  }
  double peak_after = gemm_peak(o.gemm_seconds, gemm_after);
  double peak = std::max(peak_before, peak_after);
  double tps = median(step_tokens_per_s);
  double achieved = tps * flops_per_token;
  return {
      {"config", config_to_json(cfg)},
      {"params", params},
      {"steps_timed", step_ms.size()},
      {"tokens_per_step", int64_t(cfg.data.micro_batch) * cfg.data.seq_len * cfg.train.grad_accum},
      {"tokens_per_s", tps},
      {"step_ms_median", median(step_ms)},
      {"flops_per_token", flops_per_token},
      {"achieved_gflops", achieved / 1e9},
      {"gemm_peak_gflops", peak / 1e9},
      {"gemm_peak_gflops_before", peak_before / 1e9},
      {"gemm_peak_gflops_after", peak_after / 1e9},
      {"mfu", achieved / peak},
      {"loss_first", s.losses.empty() ? 0.0 : s.losses.front()},
      {"loss_last", s.losses.empty() ? 0.0 : s.losses.back()},
      {"device_peak_bytes", s.device_peak_bytes},
      {"host_peak_rss_bytes", s.host_peak_rss_bytes},
      {"threads", hardware_threads()},
      {"cpu", cpu_features().model},
      {"gemm_before", gemm_before},
      {"gemm_after", gemm_after},
  };
}

namespace {

// "tp2", "dp2", "dp2xtp2" (either order): the tp and dp sizes; Error naming the layout otherwise.
std::pair<int, int> parse_layout(const std::string& layout, int world) {
  int dp = 0, tp = 1;
  size_t at = 0;
  while (at < layout.size()) {
    const size_t end = std::min(layout.find('x', at), layout.size());
    const std::string part = layout.substr(at, end - at);
    int n = 0;
    if (part.size() > 2 && (part.rfind("tp", 0) == 0 || part.rfind("dp", 0) == 0) &&
        std::sscanf(part.c_str() + 2, "%d", &n) == 1 && n >= 1 && std::to_string(n) == part.substr(2))
      (part[0] == 't' ? tp : dp) = n;
    else
      fail("bench::train", str("layout '", layout, "': '", part, "' is not tpN or dpN"),
           "layouts look like tp2, dp2 or dp2xtp2");
    at = end + 1;
  }
  if (dp == 0) dp = world / tp;
  if (dp * tp != world)
    fail("bench::train", str("layout '", layout, "' needs ", dp * tp, " ranks; this job has ", world),
         str("run it with mpirun -np ", dp * tp));
  return {tp, dp};
}

// Milliseconds of tensor-parallel collectives on the compute track of a Chrome trace.
double traced_tp_comm_ms(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("bench::train", str("cannot read the trace '", path, "'"));
  const nlohmann::json j = nlohmann::json::parse(f);
  std::map<int64_t, std::string> tracks;
  for (const auto& e : j["traceEvents"])
    if (e.value("ph", "") == "M" && e.contains("args")) tracks[e["tid"].get<int64_t>()] = e["args"].value("name", "");
  double us = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const std::string name = e.value("name", "");
    if (tracks[e["tid"].get<int64_t>()] == "compute" &&
        (name == "all_reduce" || name == "all_gather" || name == "reduce_scatter"))
      us += e["dur"].get<double>();
  }
  return us / 1000.0;
}

}  // namespace

nlohmann::json run_train_layouts_bench(const TrainBenchOptions& o,
                                       const std::vector<std::string>& layouts) {
  auto world = make_world_communicator();
  nlohmann::json runs = nlohmann::json::array();
  Config base = load_config(o.config_path, o.overrides);
  if (base.train.steps < 4)
    fail("bench::train", str("train.steps = ", base.train.steps, ": layouts need at least 4"),
         "steps 2..4 are traced; use 6 or more for a stable median");
  const std::string trace_dir = std::filesystem::temp_directory_path().string();
  for (const std::string& layout : layouts) {
    Config cfg = base;
    auto [tp, dp] = parse_layout(layout, world->size());
    cfg.parallel.tp = tp;
    cfg.parallel.dp = dp;
    cfg.eval.batches = 0;
    clear_run_outputs(cfg);  // a benchmark saves nothing and logs no metrics file
    cfg.log.trace = str(trace_dir, "/strata-bench-", layout, "-", getpid(), ".json");
    TrainerOptions topt;
    topt.progress = false;
    std::vector<double> tps, ms, traced_ms, wait_ms;
    uint64_t tp_bytes = 0, comm_bytes = 0;
    topt.on_step = [&](const StepRecord& r) {
      if (r.step >= 2 && r.step <= 4) {
        traced_ms.push_back(r.step_ms);
        wait_ms.push_back(r.wait_comm_ms);
      }
      if (r.step == 1) return;  // warm-up
      tps.push_back(r.tokens_per_s);
      ms.push_back(r.step_ms);
      tp_bytes = r.tp_comm_bytes;
      comm_bytes = r.comm_bytes;
    };
    TrainSummary s;
    {
      Trainer trainer(cfg, *world, topt);
      s = trainer.train();
    }
    double traced = 0, waited = 0;
    for (double v : traced_ms) traced += v;
    for (double v : wait_ms) waited += v;
    nlohmann::json run = {{"layout", layout},
                          {"tp", tp},
                          {"dp", dp},
                          {"tokens_per_s", median(tps)},
                          {"step_ms_median", median(ms)},
                          {"comm_bytes_per_step", comm_bytes},
                          {"tp_comm_bytes_per_step", tp_bytes},
                          {"device_peak_bytes", s.device_peak_bytes},
                          {"loss_first", s.losses.empty() ? 0.0 : s.losses.front()},
                          {"loss_last", s.losses.empty() ? 0.0 : s.losses.back()},
                          {"dp_wait_share", traced > 0 ? waited / traced : 0.0}};
    if (world->rank() == 0) {
      const double tp_ms = traced_tp_comm_ms(cfg.log.trace);
      run["traced_ms"] = traced;
      run["tp_comm_ms"] = tp_ms;
      run["tp_comm_share"] = traced > 0 ? tp_ms / traced : 0.0;
    }
    std::error_code ec;
    std::filesystem::remove(world->rank() == 0 ? cfg.log.trace : str(cfg.log.trace, ".rank", world->rank()), ec);
    runs.push_back(run);
  }
  return {{"config", config_to_json(base)},
          {"ranks", world->size()},
          {"tokens_per_step", int64_t(base.data.micro_batch) * base.data.seq_len * base.train.grad_accum},
          {"threads", hardware_threads()},
          {"cpu", cpu_features().model},
          {"layouts", runs}};
}

}  // namespace strata
