// apps/strata/common.h — what several subcommands share: the config options (--config, --set)
// and the communicator of this process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/comm.h"
#include "engine/config.h"

namespace strata::app {

struct ConfigArgs {
  std::string config_path;
  std::vector<std::string> sets;
  std::string init_from;
};

// Adds --config, --set (repeatable) and --init-from to a subcommand.
void add_config_options(CLI::App& cmd, ConfigArgs& args);
Config load(const ConfigArgs& args);
// Solo for a single process; MPI when launched by mpirun.
std::unique_ptr<Communicator> make_world();

}  // namespace strata::app
