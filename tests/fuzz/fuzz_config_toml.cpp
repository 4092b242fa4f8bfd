// tests/fuzz/fuzz_config_toml.cpp — fuzz target: the TOML run configuration with --set overrides
// (parse_config, as load_config reads a file).
//
// Input: TOML text; optionally a line "%%" after it, then one `--set` assignment per line
// ("section.key=value"). An accepted configuration must print as TOML that loads back to the
// same configuration, and as JSON that serializes.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/config.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {

void config_toml(Bytes input) {
  std::string_view text = as_text(input);
  std::string_view toml = text;
  std::vector<std::string> overrides;
  constexpr std::string_view kMark = "\n%%\n";
  if (size_t at = text.find(kMark); at != std::string_view::npos) {
    toml = text.substr(0, at + 1);
    for (std::string_view line : split(text.substr(at + kMark.size()), "\n"))
      if (!line.empty()) overrides.emplace_back(line);
  }
  const Config config = parse_config(toml, "fuzz.toml", overrides);
  const std::string printed = config_to_toml(config);
  std::string again;
  try {
    again = config_to_toml(parse_config(printed, "printed.toml", {}));
  } catch (const Error& e) {
    broken(str("the printed configuration does not load: ", e.what(), "\n", printed));
  }
  if (again != printed)
    broken(str("the printed configuration loads differently:\n", printed, "\nvs\n", again));
  (void)config_to_json(config).dump();
}

}  // namespace strata::fuzz
