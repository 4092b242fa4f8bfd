// apps/strata/common.cpp — shared option handling for the subcommands.
#include "apps/strata/common.h"

#include "engine/comm_registry.h"

namespace strata::app {

void add_config_options(CLI::App& cmd, ConfigArgs& args) {
  cmd.add_option("--config,-c", args.config_path, "TOML config file (default: built-in defaults)");
  cmd.add_option("--set,-s", args.sets, "override one key: --set section.key=value (repeatable)")
      ->take_all();
  cmd.add_option("--init-from", args.init_from,
                 "Hugging Face directory (config.json + safetensors) to start from");
}

Config load(const ConfigArgs& args) { return load_config(args.config_path, args.sets); }

std::unique_ptr<Communicator> make_world() { return make_world_communicator(); }

}  // namespace strata::app
