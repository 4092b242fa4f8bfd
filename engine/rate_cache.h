// engine/rate_cache.h — the measured rates of this machine (engine/step_model.h's MachineRates),
// kept in a JSON file so that `strata plan --auto` and `offload.* = "auto"` probe once.
//
// The file holds one entry per machine key — the device's name and the file systems of
// offload.nvme_path — so a change of GPU or disk probes again. Reading never guesses: a file that
// is not JSON of this shape, or an entry with a missing or non-positive rate, is an Error naming
// the file and the fix (a bad entry: --reprobe replaces it; a file that is not a rate cache:
// delete it — it is never overwritten). An entry from an older strata, without the attention
// rate or without the NVMe rates beside compute, is absent: measured again and replaced.
// Writing replaces the file atomically (a temporary file, then rename). It does not measure anything (bench/rate_probe.h does).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/step_model.h"

namespace strata {

// $XDG_CACHE_HOME/strata/rates.json, else $HOME/.cache/strata/rates.json.
std::string default_rate_cache_path();
// "device=NAME nvme=FS[,FS...]": FS names the file system of each directory of offload.nvme_path
// (its st_dev major:minor and, from /proc/self/mountinfo, mount point and type); "" without one.
std::string nvme_filesystems(const std::vector<std::string>& nvme_path);
std::string rate_cache_key(const std::string& device, const std::string& nvme);

// The entry for `key`; nullopt when the file or the entry does not exist. Sets `source` to the
// path. Error when the file exists but cannot be read or is malformed.
std::optional<MachineRates> load_rates(const std::string& path, const std::string& key);
// Adds or replaces the entry for `key` (other entries are kept; a malformed file is an Error,
// never overwritten silently), creating the directory.
void store_rates(const std::string& path, const std::string& key, const MachineRates& rates);
// Creates the cache's folder and checks that the file can be written: before a probe, so that
// its seconds of measurements are not thrown away for want of a place to keep them.
void check_rate_cache_writable(const std::string& path);

// Every rate, where it came from and when it was measured, as reports print them (`strata plan
// --auto --json`, `strata bench sweep`); not the cache entry's format.
nlohmann::json rates_json(const MachineRates& rates);

}  // namespace strata
