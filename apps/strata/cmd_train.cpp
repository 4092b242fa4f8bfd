// apps/strata/cmd_train.cpp — `strata train`: run the training loop on the config (the built-in
// default when no arguments are given), print a summary, optionally write the final weights.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "apps/strata/auto_place.h"
#include "apps/strata/commands.h"
#include "apps/strata/common.h"
#include "bench/rate_probe.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "engine/checkpoint.h"
#include "engine/file_util.h"
#include "engine/trainer.h"

namespace strata::app {
namespace {

struct TrainArgs {
  ConfigArgs config;
  std::string resume;
  std::string out;
  std::string out_dtype = "f32";
  AutoArgs auto_args;
};

// A run stopped from outside: SIGTERM (a batch scheduler's preemption or time limit, srun,
// kill), SIGINT (Ctrl-C) or SIGUSR1 (what mpirun forwards to its ranks: it answers SIGTERM and
// SIGINT by killing the job within seconds). The first one asks the trainer to stop after the
// step in progress, saved when checkpoint.dir is set; the handler is reset by it, so a second one
// ends the process at once.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  const char* text =
      sig == SIGINT    ? "\nstrata: SIGINT: stopping after this step (a second one ends it now)\n"
      : sig == SIGTERM ? "strata: SIGTERM: stopping after this step (a second one ends it now)\n"
                       : "strata: SIGUSR1: stopping after this step (a second one ends it now)\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
}

// Installs on_stop_signal for the three signals while it lives; puts back what was there. A
// signal this process was started with ignored stays ignored (nohup's SIGHUP-like intent; a
// shell's background job ignores SIGINT).
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    // SA_RESETHAND: the second signal takes the default action, the process ends. SA_RESTART:
    // system calls the signal interrupts resume (the I/O paths handle EINTR as well).
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    for (size_t i = 0; i < 3; ++i) {
      ::sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &sa, nullptr);
    }
  }
  ~StopSignals() {
    for (size_t i = 0; i < 3; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGTERM, SIGINT, SIGUSR1};
  struct sigaction old_[3] {};
};

const char* signal_name(int sig) {
  return sig == SIGTERM   ? "SIGTERM"
         : sig == SIGINT  ? "SIGINT"
         : sig == SIGUSR1 ? "SIGUSR1"
                          : "a signal";
}

// --out, checked before training: a folder that can be created and written, whose files are
// none of the run's inputs; and the run's log files are not its config file.
void check_out(const TrainArgs& a, const Config& cfg) {
  namespace fs = std::filesystem;
  constexpr const char* where = "train::out";
  parse_dtype(a.out_dtype);
  std::error_code ec;
  if (fs::exists(a.out, ec) && !fs::is_directory(a.out, ec))
    fail(where, str("--out '", a.out, "' is a file, not a folder"),
         "--out names the folder that will hold config.json and model.safetensors");
  check_not_a_checkpoint_folder(a.out, "--out", where);
  if (!cfg.checkpoint.dir.empty() && fileutil::same_folder(a.out, cfg.checkpoint.dir))
    fail(where, str("--out '", a.out, "' is checkpoint.dir"),
         "write the weights to a folder of their own: there they would sit among the "
         "checkpoints");
  fs::create_directories(a.out, ec);
  if (ec) fail(where, str("cannot create --out '", a.out, "': ", ec.message()));
  for (const char* file : {"config.json", "model.safetensors", "model.safetensors.index.json"}) {
    const std::string out = (fs::path(a.out) / file).string();
    fileutil::check_output_file(out, "--out", where);
    for (const auto& [in, in_key] :
         {std::pair{a.config.config_path, "--config"}, std::pair{cfg.data.path, "data.path"},
          std::pair{cfg.eval.path, "eval.path"},
          std::pair{a.config.init_from.empty() ? std::string()
                                               : (fs::path(a.config.init_from) / file).string(),
                    "--init-from"}})
      fileutil::check_not_an_input(out, "--out", in, in_key, where);
  }
}

void run_train(const TrainArgs& a) {
  Config cfg = a.resume.empty() ? load(a.config) : load_for_resume(a.config, a.resume);
  for (const auto& [out, key] : {std::pair{cfg.log.metrics, "log.metrics"},
                                 std::pair{cfg.log.trace, "log.trace"}})
    fileutil::check_not_an_input(out, key, a.config.config_path, "--config", "train::outputs");
  watchdog_set_timeout(cfg.parallel.timeout);  // MPI's setup is watched too (comm/comm_mpi.cpp)
  auto world = make_world();
  // "auto" tiers are chosen before anything is allocated (apps/strata/auto_place.h).
  if (world->rank() == 0 && !cfg.offload.any_auto()) warn_unused_rate_args("train", a.auto_args);
  cfg = resolve_auto_placement(cfg, *world, a.auto_args);
  std::unique_ptr<Trainer> trainer;  // outlives the catch below: see end_job_if_peers
  int stopped_by = 0;                 // a stop signal's number (every rank the same)
  try {
    TrainerOptions opt;
    opt.init_from = a.config.init_from;
    opt.resume = a.resume;
    if (!a.out.empty()) opt.same_on_every_rank["--out"] = str(a.out, " (", a.out_dtype, ")");
    opt.peak_flops = cfg.log.peak_flops;
    if (opt.peak_flops <= 0) opt.peak_flops = measure_linear_flops(cfg, 0.3);
    if (!a.out.empty()) check_out(a, cfg);  // fail before training, not after
    apply_fault_hooks(world->rank(), opt);
    opt.stop_requested = [] { return g_stop_signal.load(); };
    trainer = std::make_unique<Trainer>(cfg, *world, opt);
    const bool lead = world->rank() == 0;
    const ModelConfig& model = trainer->config().model;  // --init-from's, when given
    if (lead) {
      std::printf("strata train: %lld parameters (%d layers, dim %d, %d heads / %d kv), data %s, "
                  "batch %d x %d x %d accum x %d ranks, %d steps, %s\n",
                  (long long)trainer->num_params(), model.n_layers, model.dim, model.n_heads,
                  model.n_kv_heads, cfg.data.path.c_str(), cfg.data.micro_batch,
                  cfg.data.seq_len, cfg.train.grad_accum, world->size(), cfg.train.steps,
                  std::string(precision_name(cfg.train.precision)).c_str());
      // measure_linear_flops: bf16 operands where the CUDA run multiplies with them
      const bool bf16_gemm = uses_cuda(cfg) && cuda_bf16_matmuls(cfg.train);
      std::printf("MFU is measured against %.1f GFLOP/s (%s)\n", opt.peak_flops / 1e9,
                  cfg.log.peak_flops > 0 ? "log.peak_flops"
                  : bf16_gemm            ? "GEMM with bf16 operands, measured now"
                                         : "f32 GEMM, measured now");
      std::fflush(stdout);
    }
    TrainSummary s;
    bool wrote_out = false;
    {
      // Through --out as well: a first signal there lets the weights finish; a second ends the
      // process, and the folder has no config.json (it is written last).
      StopSignals signals;
      s = trainer->train();
      stopped_by = s.stopped_by;
      // A stop in the final evaluation leaves every step done: the weights are written.
      if (!a.out.empty() && (!stopped_by || s.last_step == cfg.train.steps)) {
        trainer->save(a.out, a.out_dtype);  // into the folder check_out created
        wrote_out = true;
      }
    }
    if (lead && stopped_by) {
      std::printf("stopped by %s after step %lld of %lld", signal_name(stopped_by),
                  (long long)s.last_step, (long long)cfg.train.steps);
      if (s.last_step == cfg.train.steps)
        std::printf(", in the final evaluation: every step is done%s\n",
                    cfg.checkpoint.dir.empty() ? ""
                                               : str(" and saved in ", cfg.checkpoint.dir).c_str());
      else if (!cfg.checkpoint.dir.empty())
        std::printf("; its checkpoint is in %s: continue with strata train --resume %s\n",
                    cfg.checkpoint.dir.c_str(), cfg.checkpoint.dir.c_str());
      else
        std::printf("; no checkpoint.dir, so nothing was saved\n");
      if (!a.out.empty() && !wrote_out)
        std::printf("      --out %s not written: the run did not finish\n", a.out.c_str());
    }
    if (!lead) return;
    std::printf("done: %d steps in %.1f s | loss %.4f -> %.4f", int(s.losses.size()), s.seconds,
                s.losses.empty() ? 0.0 : s.losses.front(), s.losses.empty() ? 0.0 : s.losses.back());
    if (s.eval_loss >= 0) std::printf(" | eval loss %.4f", s.eval_loss);
    if (s.best_eval_step >= 0 && cfg.eval.every > 0)
      std::printf(" (best %.4f at step %lld)", s.best_eval_loss, (long long)s.best_eval_step);
    std::printf("\n      %.0f tokens/s | MFU %.1f%% | device peak %s | host peak RSS %s\n",
                s.tokens_per_s, 100.0 * s.mfu, format_bytes(s.device_peak_bytes).c_str(),
                format_bytes(s.host_peak_rss_bytes).c_str());
    if (wrote_out) std::printf("      weights written to %s\n", a.out.c_str());
    const CheckpointStats cs = trainer->checkpoint_stats();
    if (cs.step > 0)
      std::printf("      checkpoint step_%lld in %s: %s from this rank in %.1f s (%.2f GB/s), committed in %.2f s\n",
                  (long long)cs.step, cfg.checkpoint.dir.c_str(), format_bytes(cs.bytes).c_str(),
                  cs.write_ms / 1000.0, cs.write_ms > 0 ? double(cs.bytes) / (cs.write_ms * 1e6) : 0.0,
                  cs.commit_ms / 1000.0);
  } catch (const std::exception& e) {
    end_job_if_peers(e);
    throw;
  }
  // Every rank stopped after the same step: the exit status of a process a signal ended.
  if (stopped_by) throw CLI::RuntimeError(128 + stopped_by);
}

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "train a model (no arguments: the built-in default)");
  add_config_options(*cmd, args->config);
  auto not_empty = [](const char* what) {
    return CLI::Validator(
        [what](std::string& v) {
          return v.empty() ? str("needs ", what, ", not ''") : std::string();
        },
        "", "not empty");
  };
  cmd->add_option("--resume", args->resume,
                  "continue from a checkpoint: the checkpoint.dir root (its newest complete "
                  "checkpoint) or one step_N folder; the config is the checkpoint's unless --config "
                  "is given, with --set applied on top")
      ->check(not_empty("a checkpoint folder"));
  CLI::Option* out =
      cmd->add_option("--out,-o", args->out,
                      "write the final weights (Hugging Face safetensors + config.json) here")
          ->check(not_empty("a folder"));
  cmd->add_option("--out-dtype", args->out_dtype, "dtype of the written weights: f32, bf16 or f16")
      ->needs(out);
  cmd->add_option("--rates", args->auto_args.rates_path,
                  "with offload.* = \"auto\": the rate cache file (default $XDG_CACHE_HOME/strata/rates.json "
                  "or ~/.cache/strata/rates.json)");
  cmd->add_flag("--reprobe", args->auto_args.reprobe,
                "with offload.* = \"auto\": measure this machine's rates again before choosing");
  cmd->callback([args] { run_train(*args); });
}

}  // namespace strata::app
