// bench/checkpoint_bench.cpp — run_checkpoint_bench.
#include "bench/checkpoint_bench.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "bench/io_bench.h"
#include "bench/stats.h"
#include "core/error.h"
#include "core/size.h"
#include "engine/checkpoint.h"
#include "comm/comm.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/trainer.h"

namespace strata {
namespace fs = std::filesystem;

nlohmann::json run_checkpoint_bench(const CheckpointBenchOptions& o) {
  if (o.dir.empty()) fail("bench::checkpoint", "no --dir given", "pass the folder to write checkpoints in");
  if (o.steps < 4) fail("bench::checkpoint", str("--steps ", o.steps), "use at least 4 steps (saves at 2 and 4)");
  Config cfg = load_config(o.config_path, o.overrides);
  const std::string root = (fs::path(o.dir) / "strata-bench-checkpoints").string();
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(root, ec);
  cfg.checkpoint.dir = root;
  cfg.checkpoint.every = 2;
  cfg.checkpoint.keep = 1;
  cfg.train.steps = o.steps;
  cfg.eval.batches = 0;
  cfg.log.metrics.clear();

  // What the disk gives: a write (and read) pass of the I/O engine on the same folder.
  LlamaModel model(cfg.model, 1);
  const uint64_t file_bytes = checkpoint_file_bytes(model, 0);
  IoBenchOptions io;
  io.dirs = {o.dir};
  io.size_bytes = o.io_size_bytes ? o.io_size_bytes : std::max<uint64_t>(file_bytes, 1ull << 30);
  io.block_bytes = cfg.io.block_size;
  io.size_bytes = round_up(io.size_bytes, io.block_bytes);  // whole blocks
  io.queue_depth = cfg.io.queue_depth;
  io.submit_batch = cfg.io.submit_batch;
  io.backend = cfg.io.backend;
  nlohmann::json disk = run_io_bench(io);
  if (disk.value("wrong", 0) != 0) fail("bench::checkpoint", "the io bench read back wrong bytes");
  const double disk_write_gbps = disk["write_gbps"].get<double>();

  // Training with a save every 2 steps.
  auto world = make_solo_communicator();
  TrainerOptions topt;
  topt.progress = false;
  struct Step {
    double ms, stall_ms;
    bool saved;
  };
  std::vector<Step> steps;
  std::vector<nlohmann::json> saves;
  std::unique_ptr<Trainer> trainer;
  topt.on_step = [&](const StepRecord& r) {
    steps.push_back(Step{r.step_ms, r.checkpoint_stall_ms, r.checkpoint_saved > 0});
    const CheckpointStats cs = trainer->checkpoint_stats();
    if (cs.step > 0 && (saves.empty() || saves.back()["step"].get<int64_t>() != cs.step))
      saves.push_back({{"step", cs.step},
                       {"bytes", cs.bytes},
                       {"write_ms", cs.write_ms},
                       {"write_gbps", cs.write_ms > 0 ? double(cs.bytes) / (cs.write_ms * 1e6) : 0.0},
                       {"commit_ms", cs.commit_ms}});
  };
  trainer = std::make_unique<Trainer>(cfg, *world, topt);
  auto t0 = std::chrono::steady_clock::now();
  trainer->train();
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const CheckpointStats last = trainer->checkpoint_stats();
  if (saves.empty() || saves.back()["step"].get<int64_t>() != last.step)
    saves.push_back({{"step", last.step},
                     {"bytes", last.bytes},
                     {"write_ms", last.write_ms},
                     {"write_gbps", last.write_ms > 0 ? double(last.bytes) / (last.write_ms * 1e6) : 0.0},
                     {"commit_ms", last.commit_ms}});
  trainer.reset();

  // The stall of each save: its own step's time on it plus the next step's wait, over the median
  // time of a step that neither saved nor waited (the first step is warm-up).
  std::vector<double> plain;
  for (size_t i = 1; i < steps.size(); ++i)
    if (!steps[i].saved && !(i > 0 && steps[i - 1].saved)) plain.push_back(steps[i].ms);
  if (plain.empty())
    for (size_t i = 1; i < steps.size(); ++i) plain.push_back(steps[i].ms - steps[i].stall_ms);
  const double step_ms = median(plain);
  nlohmann::json stalls = nlohmann::json::array();
  double worst_share = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].saved) continue;
    double ms = steps[i].stall_ms + (i + 1 < steps.size() ? steps[i + 1].stall_ms : 0.0);
    const double share = step_ms > 0 ? ms / step_ms : 0;
    worst_share = std::max(worst_share, i == 1 ? 0.0 : share);  // step 2's save follows warm-up
    stalls.push_back({{"step", i + 1}, {"stall_ms", ms}, {"share_of_step", share}});
  }

  // Resume: verify every file and load every shard, into a fresh trainer.
  auto t1 = std::chrono::steady_clock::now();
  {
    TrainerOptions ropt;
    ropt.progress = false;
    ropt.resume = root;
    Config rcfg = cfg;
    rcfg.checkpoint.dir.clear();
    rcfg.train.steps = cfg.train.steps + 1;  // one left to train (it is never trained)
    Trainer resumed(rcfg, *world, ropt);
  }
  const double resume_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  std::vector<double> gbps;
  for (const auto& s : saves) gbps.push_back(s["write_gbps"].get<double>());
  const double ckpt_gbps = median(gbps);
  nlohmann::json out = {
      {"config", config_to_json(cfg)},
      {"params", model.num_params()},
      {"checkpoint_file_bytes", file_bytes},
      {"disk", disk},
      {"disk_write_gbps", disk_write_gbps},
      {"checkpoint_write_gbps", ckpt_gbps},
      {"write_ratio", disk_write_gbps > 0 ? ckpt_gbps / disk_write_gbps : 0.0},
      {"saves", saves},
      {"step_ms_median", step_ms},
      {"stalls", stalls},
      {"worst_stall_share", worst_share},
      {"async", cfg.checkpoint.async},
      {"train_seconds", train_s},
      {"resume_seconds", resume_s},
  };
  fs::remove_all(root, ec);
  return out;
}

}  // namespace strata
