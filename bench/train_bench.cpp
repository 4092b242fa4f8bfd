// bench/train_bench.cpp — run_train_bench.
#include "bench/train_bench.h"

#include <algorithm>

#include "bench/gemm_bench.h"
#include "core/cpu.h"
#include "core/error.h"
#include "comm/comm.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/trainer.h"

namespace strata {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

}  // namespace strata
