// apps/strata/main.cpp — the `strata` command line: train, eval, info, config, plan, checkpoint,
// report, bench.
// The only place that turns a strata::Error into a message on stderr and an exit code.
#include <cstdio>
#include <exception>

#include "apps/strata/commands.h"
#include "apps/strata/common.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"strata — train transformer models larger than the memory of your GPUs"};
  app.require_subcommand(1);
  app.fallthrough();
  strata::app::register_train(app);
  strata::app::register_eval(app);
  strata::app::register_info(app);
  strata::app::register_config(app);
  strata::app::register_plan(app);
  strata::app::register_checkpoint(app);
  strata::app::register_report(app);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (validate, then time; --json for JSON)");
  bench->require_subcommand(1);
  strata::app::register_bench_gemm(*bench);
  strata::app::register_bench_io(*bench);
  strata::app::register_bench_adam(*bench);
  strata::app::register_bench_train(*bench);
  strata::app::register_bench_pipeline(*bench);
  strata::app::register_bench_comm(*bench);
  strata::app::register_bench_sweep(*bench);
  strata::app::register_bench_gpu(*bench);
  strata::app::register_bench_checkpoint(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const strata::Error& e) {
    strata::app::end_job_if_peers(e);  // returns only in a job without peers
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    strata::app::end_job_if_peers(e);
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
