// apps/strata/commands.h — each subcommand registers itself on the CLI11 app. A command's
// callback throws strata::Error on failure; main() turns that into a message and exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace strata::app {

void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_info(CLI::App& app);
void register_config(CLI::App& app);
void register_plan(CLI::App& app);
void register_checkpoint(CLI::App& app);
void register_report(CLI::App& app);
void register_bench_gemm(CLI::App& bench);
void register_bench_io(CLI::App& bench);
void register_bench_adam(CLI::App& bench);
void register_bench_train(CLI::App& bench);
void register_bench_pipeline(CLI::App& bench);
void register_bench_comm(CLI::App& bench);
void register_bench_sweep(CLI::App& bench);
void register_bench_gpu(CLI::App& bench);
void register_bench_checkpoint(CLI::App& bench);

}  // namespace strata::app
