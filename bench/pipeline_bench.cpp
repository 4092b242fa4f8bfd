// bench/pipeline_bench.cpp — the pipeline bubble measured in the trace (bench/pipeline_bench.h).
#include "bench/pipeline_bench.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "comm/comm_registry.h"
#include "core/cpu.h"
#include "core/error.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/pipeline.h"
#include "engine/plan.h"
#include "engine/trainer.h"
#include "kernels/device.h"

namespace strata {
namespace {

struct Span {
  double start = 0, end = 0;
};

// The forward / backward spans of a stage's track in a trace file, in time order.
std::vector<Span> stage_spans(const std::string& path, int stage) {
  std::ifstream f(path);
  if (!f) fail("bench::pipeline", str("cannot read the trace '", path, "'"));
  const nlohmann::json j = nlohmann::json::parse(f);
  const std::string track = str("pipeline stage ", stage);
  int64_t tid = -1;
  for (const auto& e : j["traceEvents"])
    if (e.value("ph", "") == "M" && e.contains("args") && e["args"].value("name", "") == track)
      tid = e["tid"].get<int64_t>();
  std::vector<Span> spans;
  for (const auto& e : j["traceEvents"])
    if (e.value("ph", "") == "X" && e["tid"].get<int64_t>() == tid) {
      const double ts = e["ts"].get<double>();
      spans.push_back({ts, ts + e["dur"].get<double>()});
    }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  return spans;
}

}  // namespace

nlohmann::json run_pipeline_bench(const PipelineBenchOptions& o) {
  auto world = make_world_communicator();
  const int pp = world->size();
  if (pp < 2)
    fail("bench::pipeline", "the pipeline bench needs at least 2 ranks (one per stage)",
         "run it under mpirun -np 2 (or more)");
  Config base = load_config(o.config_path, o.overrides);
  base.parallel.pp = pp;
  base.parallel.dp = 1;
  base.parallel.tp = 1;
  base.eval.batches = 0;
  base.train.steps = 5;  // steps 2..4 are traced (after the warm-up step)
  if (base.train.threads == 0) base.train.threads = 1;
  base.model.tie_embeddings = false;
  const std::string trace_dir = std::filesystem::temp_directory_path().string();
  // One trace name for the job (rank r > 0 writes NAME.rank<r>): rank 0's process id.
  int32_t job = int32_t(getpid());
  auto cpu = make_device(DeviceKind::cpu);
  auto stream = cpu->make_stream("bench pipeline");
  world->broadcast(*stream, &job, 1, CommType::i32, 0);
  stream->synchronize();
  // Every point's config is checked before the first one runs: a point the engine refuses
  // (1f1b with fewer micro-batches than stages) ends the bench before its minutes of work.
  struct Point {
    std::string sched;
    int m;
    Config cfg;
  };
  std::vector<Point> points;
  for (const std::string& sched : o.schedules) {
    if (sched != "1f1b" && sched != "gpipe")
      fail("bench::pipeline", str("schedule '", sched, "'"), "schedules: 1f1b, gpipe");
    for (int m : o.micro_batches) {
      if (sched == "1f1b" && m < pp)
        fail("bench::pipeline", str("1f1b with --micro ", m, ": 1f1b needs at least pp = ", pp,
                                    " micro-batches per step"),
             str("drop ", m, " from --micro, or measure it with --schedules gpipe only"));
      Config cfg = base;
      clear_run_outputs(cfg);  // a benchmark saves nothing and logs no metrics file
      cfg.parallel.pp_schedule =
          sched == "gpipe" ? PipelineSchedule::gpipe : PipelineSchedule::one_f_one_b;
      cfg.train.grad_accum = m;
      cfg.log.trace = str(trace_dir, "/strata-bench-pipeline-", sched, "-", m, "-", job, ".json");
      validate(cfg);
      points.push_back({sched, m, std::move(cfg)});
    }
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const Point& point : points) {
    const std::string& sched = point.sched;
    const int m = point.m;
    const Config& cfg = point.cfg;
    TrainerOptions topt;
    topt.progress = false;
    std::vector<double> tps;
    topt.on_step = [&](const StepRecord& r) {
      if (r.step > 1) tps.push_back(r.tokens_per_s);
    };
    TrainSummary s;
    {
      Trainer trainer(cfg, *world, topt);
      s = trainer.train();  // ends with a collective: every rank's trace is written
    }
    if (world->rank() == 0) {
      std::vector<std::vector<Span>> spans;
      for (int st = 0; st < pp; ++st)
        spans.push_back(stage_spans(st == 0 ? cfg.log.trace : str(cfg.log.trace, ".rank", st), st));
      const size_t per_step = size_t(2 * m);
      const size_t steps = spans[0].size() / per_step;
      nlohmann::json stages = nlohmann::json::array();
      double window = 0;
      for (size_t k = 0; k < steps; ++k)
        window += spans[0][(k + 1) * per_step - 1].end - spans[0][k * per_step].start;
      for (int st = 0; st < pp; ++st) {
        if (spans[size_t(st)].size() != steps * per_step)
          fail("bench::pipeline", str("stage ", st, " traced ", spans[size_t(st)].size(),
                                      " spans, stage 0 ", spans[0].size()));
        double busy = 0;
        for (const Span& x : spans[size_t(st)]) busy += x.end - x.start;
        stages.push_back(
            {{"stage", st}, {"busy_ms", busy / 1000}, {"idle_share", 1 - busy / window}});
      }
      std::sort(tps.begin(), tps.end());
      PlanMachine machine;
      machine.device_capacity = uint64_t(1) << 50;
      const MemoryPlan plan = plan_memory(cfg, 1, machine, 0);
      uint64_t acts = 0;
      for (const auto& r : plan.rows)
        if (r.what.rfind("activations", 0) == 0) acts = r.bytes;
      const auto partition = pipeline_partition(cfg);
      nlohmann::json units = nlohmann::json::array();
      for (const auto& p : partition) units.push_back({p.begin, p.end});
      runs.push_back({{"schedule", sched},
                      {"micro_batches", m},
                      {"ideal_idle_share", ideal_bubble(pp, m)},
                      {"window_ms", window / 1000},
                      {"traced_steps", steps},
                      {"stages", stages},
                      {"partition", units},
                      {"first_stage_micro_batches_held", plan.micro_batches_held},
                      {"first_stage_activation_bytes", acts},
                      {"first_stage_device_peak_bytes", s.device_peak_bytes_here},
                      {"tokens_per_s", tps.empty() ? 0.0 : tps[tps.size() / 2]}});
    }
    world->barrier(*stream);  // rank 0 has read every trace
    stream->synchronize();
    std::error_code ec;
    const int rank = world->rank();
    std::filesystem::remove(rank == 0 ? cfg.log.trace : str(cfg.log.trace, ".rank", rank), ec);
  }
  return {{"config", config_to_json(base)},
          {"pp", pp},
          {"threads", base.train.threads},
          {"cpu", cpu_features().model},
          {"runs", runs}};
}

}  // namespace strata
