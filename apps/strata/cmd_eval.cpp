// apps/strata/cmd_eval.cpp — `strata eval`: the mean loss of a model over eval.batches
// micro-batches; the last line on stdout is a JSON object with eval_loss.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/strata/commands.h"
#include "apps/strata/common.h"
#include "engine/trainer.h"

namespace strata::app {

void register_eval(CLI::App& app) {
  auto args = std::make_shared<ConfigArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "evaluate a model's loss on eval.batches micro-batches");
  add_config_options(*cmd, *args);
  cmd->callback([args] {
    Config cfg = load(*args);
    // Evaluation trains nothing and writes none of a run's files: a training config's
    // checkpoint.dir is not claimed, and its log.metrics is not truncated.
    clear_run_outputs(cfg);
    cfg.log.trace.clear();
    auto world = make_world();
    std::unique_ptr<Trainer> trainer;  // outlives the catch below: see end_job_if_peers
    try {
      TrainerOptions opt;
      opt.init_from = args->init_from;
      opt.progress = false;
      trainer = std::make_unique<Trainer>(cfg, *world, opt);
      double loss = trainer->evaluate();
      if (world->rank() != 0) return;
      nlohmann::json j = {{"eval_loss", loss},
                          {"batches", cfg.eval.batches},
                          {"tokens", int64_t(cfg.eval.batches) * cfg.data.micro_batch * cfg.data.seq_len},
                          {"data", cfg.eval.path.empty() ? cfg.data.path : cfg.eval.path},
                          {"params", trainer->num_params()}};
      std::printf("%s\n", j.dump().c_str());
    } catch (const std::exception& e) {
      end_job_if_peers(e);
      throw;
    }
  });
}

}  // namespace strata::app
