// apps/strata/cmd_config.cpp — `strata config`: prints the effective configuration (defaults,
// then --config FILE, then each --set) as TOML that `--config` accepts, or as JSON, or prints the
// reference of every key (docs/config.md is this output). It validates what it prints, so it also
// checks a config file without running anything.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/strata/commands.h"
#include "engine/config.h"

namespace strata::app {

namespace {

struct ConfigCommandArgs {
  std::string config_path;
  std::vector<std::string> sets;
  bool markdown = false;
  bool json = false;
};

}  // namespace

void register_config(CLI::App& app) {
  auto args = std::make_shared<ConfigCommandArgs>();
  CLI::App* cmd = app.add_subcommand(
      "config", "print the effective configuration as TOML (or every key's reference)");
  cmd->add_option("--config,-c", args->config_path, "TOML config file (default: built-in defaults)");
  cmd->add_option("--set,-s", args->sets, "override one key: --set section.key=value (repeatable)")
      ->take_all();
  CLI::Option* markdown =
      cmd->add_flag("--markdown", args->markdown,
                    "print the reference of every key (type, default, meaning): docs/config.md");
  cmd->add_flag("--json", args->json, "print the effective configuration as JSON")
      ->excludes(markdown);
  cmd->callback([args] {
    if (args->markdown) {
      std::fputs(config_reference_markdown().c_str(), stdout);
      return;
    }
    Config cfg = load_config(args->config_path, args->sets);
    if (args->json) std::printf("%s\n", config_to_json(cfg).dump(2).c_str());
    else std::fputs(config_to_toml(cfg).c_str(), stdout);
  });
}

}  // namespace strata::app
