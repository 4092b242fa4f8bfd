// engine/rate_cache.cpp — the rate cache file of engine/rate_cache.h: JSON
// {"version": 1, "machines": {KEY: {rates...}}}, replaced atomically.
#include "engine/rate_cache.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/file_util.h"

namespace strata {
namespace {

constexpr const char* kWhere = "plan::rate_cache";
constexpr int kVersion = 1;
// The rates a usable entry must have (> 0); the NVMe ones only where it names a file system.
constexpr const char* kRates[] = {"gemm_flops",      "attention_flops", "adam_gbps",
                                  "device_mem_gbps", "h2d_gbps",        "d2h_gbps",
                                  "adam_bf16_gbps",  "norm_gbps"};
constexpr const char* kNvmeRates[] = {"nvme_read_gbps", "nvme_write_gbps", "nvme_read_busy_gbps",
                                      "nvme_write_busy_gbps"};
// CPU seconds of steal per GB beside compute (MachineRates::nvme_steal_s_per_gb); may be 0.
constexpr const char* kNvmeSteal = "nvme_steal_s_per_gb";
// The probe's revision, stored in each entry: an entry from an earlier one is measured again.
// 2: the CPU device's GEMM rate is the median call's, no longer the best call's (5-8 % above).
// 3: the AdamW with bf16 m and v, and the gradient norm's sum of squares, measured too.
constexpr int kProbeRevision = 3;

// A damaged entry: --reprobe measures it again and replaces it (store_rates reads the rest).
[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw Error(kWhere, str("the rate cache '", path, "' is not usable: ", what),
              {str("measure again with --reprobe, which replaces the entry, or delete the file (rm '",
                   path, "')")});
}

// A file that is not a rate cache at all is never overwritten (it may not be strata's: a wrong
// --rates), so --reprobe cannot mend it.
[[noreturn]] void not_a_cache(const std::string& path, const std::string& what) {
  throw Error(kWhere, str("the rate cache '", path, "' is not usable: ", what),
              {str("delete it (rm '", path, "'), and the rates are measured again; a file that is "
                   "not a rate cache is never overwritten, with --reprobe neither")});
}

// The key as the file holds it: JSON text is UTF-8 and a mount point's name may hold any byte, so
// the file stores each byte that is not UTF-8 as U+FFFD, and a lookup replaces them alike.
std::string file_key(const std::string& key) {
  const auto replace = nlohmann::json::error_handler_t::replace;
  const std::string text = nlohmann::json(key).dump(-1, ' ', false, replace);
  return nlohmann::json::parse(text).get<std::string>();
}

nlohmann::json read_cache(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nullptr;
  if (std::filesystem::is_directory(path, ec))
    fail(kWhere, str("the rate cache '", path, "' is a folder"),
         "name a file with --rates (the default: $XDG_CACHE_HOME/strata/rates.json)");
  const std::string text = fileutil::read_file(path, kWhere);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) not_a_cache(path, "it is not JSON");
  if (!j.is_object() || !j.contains("machines") || !j["machines"].is_object())
    not_a_cache(path, "no \"machines\" object");
  if (!j.contains("version") || j["version"] != kVersion)
    not_a_cache(path, str("version ", j.contains("version") ? j["version"].dump() : "missing", ", expected ", kVersion));
  return j;
}

// The mount point and type of the file system holding device `dev` (/proc/self/mountinfo).
std::string mount_of(dev_t dev) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  const std::string want = str(major(dev), ":", minor(dev));
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string id, parent, majmin, root, mount, opts, field;
    ls >> id >> parent >> majmin >> root >> mount >> opts;
    if (majmin != want) continue;
    while (ls >> field && field != "-") {}
    std::string type;
    ls >> type;
    return str(mount, " (", type, ")");
  }
  return "";
}

}  // namespace

std::string default_rate_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return str(xdg, "/strata/rates.json");
  const char* home = std::getenv("HOME");
  if (!home || !*home)
    fail(kWhere, "neither XDG_CACHE_HOME nor HOME is set: no place for the rate cache",
         "set XDG_CACHE_HOME to a writable directory");
  return str(home, "/.cache/strata/rates.json");
}

std::string nvme_filesystems(const std::vector<std::string>& nvme_path) {
  std::string out;
  for (const auto& d : nvme_path) {
    std::filesystem::path p(d);
    std::error_code ec;
    while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();  // nearest existing
    struct stat st {};
    std::string fs = "unknown";
    if (::stat(p.empty() ? "." : p.c_str(), &st) == 0) {
      fs = str(major(st.st_dev), ":", minor(st.st_dev));
      const std::string m = mount_of(st.st_dev);
      if (!m.empty()) fs += " " + m;
    }
    out += (out.empty() ? "" : ", ") + fs;
  }
  return out;
}

std::string rate_cache_key(const std::string& device, const std::string& nvme) {
  return str("device=", device, " nvme=", nvme.empty() ? "none" : nvme);
}

std::optional<MachineRates> load_rates(const std::string& path, const std::string& key) {
  const nlohmann::json j = read_cache(path);
  const std::string stored_key = file_key(key);
  if (j.is_null() || !j["machines"].contains(stored_key)) return std::nullopt;
  const nlohmann::json& e = j["machines"][stored_key];
  if (!e.is_object()) corrupt(path, str("the entry \"", key, "\" is not an object"));
  // An entry from a strata that did not measure attention yet, or measured a rate otherwise
  // (an earlier probe revision): measured again, and replaced.
  if (!e.contains("attention_flops")) return std::nullopt;
  if (!e.contains("probe") || !e["probe"].is_number_integer() ||
      e["probe"].get<int64_t>() < kProbeRevision)
    return std::nullopt;
  for (const char* name : {"device", "nvme"})
    if (e.contains(name) && !e[name].is_string())
      corrupt(path, str("the entry \"", key, "\" has ", name, " = ", e[name].dump(),
                        " (a string expected)"));
  // Or the NVMe rates beside compute, or the steal beside them: the same.
  if (e.value("nvme", "") != "" && (!e.contains(kNvmeRates[2]) || !e.contains(kNvmeSteal)))
    return std::nullopt;
  auto rate = [&](const char* name, bool required) {
    if (!e.contains(name)) {
      if (required) corrupt(path, str("the entry \"", key, "\" has no ", name));
      return 0.0;
    }
    if (!e[name].is_number() || !(e[name].get<double>() > 0) || !std::isfinite(e[name].get<double>()))
      corrupt(path, str("the entry \"", key, "\" has ", name, " = ", e[name].dump(), " (a rate > 0 expected)"));
    return e[name].get<double>();
  };
  MachineRates r;
  r.device = e.value("device", "");
  r.nvme = e.value("nvme", "");
  r.gemm_flops = rate(kRates[0], true);
  r.attention_flops = rate(kRates[1], true);
  r.adam_gbps = rate(kRates[2], true);
  r.device_mem_gbps = rate(kRates[3], true);
  r.h2d_gbps = rate(kRates[4], true);
  r.d2h_gbps = rate(kRates[5], true);
  r.adam_bf16_gbps = rate(kRates[6], true);
  r.norm_gbps = rate(kRates[7], true);
  // The NVMe rates only where the entry names a file system (as store_rates writes them).
  if (!r.nvme.empty()) {
    r.nvme_read_gbps = rate(kNvmeRates[0], true);
    r.nvme_write_gbps = rate(kNvmeRates[1], true);
    r.nvme_read_busy_gbps = rate(kNvmeRates[2], true);
    r.nvme_write_busy_gbps = rate(kNvmeRates[3], true);
    // 0 is a measurement here (no steal), not a missing rate
    const nlohmann::json& s = e[kNvmeSteal];
    if (!s.is_number() || !std::isfinite(s.get<double>()) || s.get<double>() < 0)
      corrupt(path, str("the entry \"", key, "\" has ", kNvmeSteal, " = ", s.dump(),
                        " (seconds >= 0 expected)"));
    r.nvme_steal_s_per_gb = s.get<double>();
  }
  r.comm_gbps = rate("comm_gbps", false);  // only a run with peers measures it
  if (!e.contains("cpu_threads") || !e["cpu_threads"].is_number_integer() || e["cpu_threads"].get<int64_t>() < 1 ||
      e["cpu_threads"].get<int64_t>() > 1 << 20)
    corrupt(path, str("the entry \"", key, "\" has no cpu_threads >= 1"));
  r.cpu_threads = e["cpu_threads"].get<int>();
  if (!e.contains("measured_at") || !e["measured_at"].is_string())
    corrupt(path, str("the entry \"", key, "\" has no measured_at"));
  r.measured_at = e["measured_at"].get<std::string>();
  r.source = path;
  return r;
}

void store_rates(const std::string& path, const std::string& key, const MachineRates& r) {
  nlohmann::json j = read_cache(path);  // a malformed file is an Error, not overwritten
  if (j.is_null()) j = {{"version", kVersion}, {"machines", nlohmann::json::object()}};
  nlohmann::json e = {{"device", r.device},           {"nvme", r.nvme},
                      {"gemm_flops", r.gemm_flops},   {"attention_flops", r.attention_flops},
                      {"adam_gbps", r.adam_gbps},    {"adam_bf16_gbps", r.adam_bf16_gbps},
                      {"norm_gbps", r.norm_gbps},
                      {"device_mem_gbps", r.device_mem_gbps}, {"h2d_gbps", r.h2d_gbps},
                      {"d2h_gbps", r.d2h_gbps},       {"cpu_threads", r.cpu_threads},
                      {"measured_at", r.measured_at}, {"probe", kProbeRevision}};
  if (r.comm_gbps > 0) e["comm_gbps"] = r.comm_gbps;
  if (!r.nvme.empty()) {
    e["nvme_read_gbps"] = r.nvme_read_gbps;
    e["nvme_write_gbps"] = r.nvme_write_gbps;
    e["nvme_read_busy_gbps"] = r.nvme_read_busy_gbps;
    e["nvme_write_busy_gbps"] = r.nvme_write_busy_gbps;
    e[kNvmeSteal] = r.nvme_steal_s_per_gb;
  }
  j["machines"][file_key(key)] = std::move(e);
  check_rate_cache_writable(path);
  // r.nvme may hold bytes that are not UTF-8 too (a mount point's name): stored as U+FFFD.
  const auto replace = nlohmann::json::error_handler_t::replace;
  fileutil::write_file_atomic(path, j.dump(2, ' ', false, replace) + "\n", kWhere);
}

void check_rate_cache_writable(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec)
    fail(kWhere, str("cannot create '", dir.string(), "' for the rate cache: ", ec.message()),
         "name a writable file with --rates, or set XDG_CACHE_HOME to a writable folder");
  fileutil::check_output_file(path, "the rate cache", kWhere);
}

nlohmann::json rates_json(const MachineRates& r) {
  return {{"source", r.source},       {"measured_at", r.measured_at},   {"device", r.device},
          {"nvme", r.nvme},           {"gemm_flops", r.gemm_flops},
          {"attention_flops", r.attention_flops}, {"adam_gbps", r.adam_gbps},
          {"adam_bf16_gbps", r.adam_bf16_gbps}, {"norm_gbps", r.norm_gbps},
          {"device_mem_gbps", r.device_mem_gbps}, {"h2d_gbps", r.h2d_gbps}, {"d2h_gbps", r.d2h_gbps},
          {"nvme_read_gbps", r.nvme_read_gbps}, {"nvme_write_gbps", r.nvme_write_gbps},
          {"nvme_read_busy_gbps", r.nvme_read_busy_gbps},
          {"nvme_write_busy_gbps", r.nvme_write_busy_gbps},
          {"nvme_steal_s_per_gb", r.nvme_steal_s_per_gb}, {"cpu_threads", r.cpu_threads},
          {"comm_gbps", r.comm_gbps}};
}

}  // namespace strata
