// tests/fuzz/fuzz_rate_cache.cpp — fuzz target: the rate cache file (load_rates, then store_rates
// as `strata plan --auto` and `offload.* = "auto"` use them).
//
// Input: the machine key (rate_cache_key's "device=NAME nvme=FS"), a newline, then the file; an
// input without a newline is the key alone, and there is no file.
// An entry load_rates accepts must store into the same file (as --reprobe stores it, keeping the
// other entries) and load back equal. Where it finds none (no entry, or one of an older
// strata), strata measures and stores: that measurement must store into the file and load back
// equal. A file load_rates read is a rate cache, so neither store may be refused.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "engine/rate_cache.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {
namespace {

// What a probe of a machine with NVMe could measure.
MachineRates measured() {
  MachineRates r;
  r.device = "NVIDIA H100 80GB HBM3";
  r.nvme = "259:0 /mnt/nvme (ext4)";
  r.gemm_flops = 1.25e12;
  r.attention_flops = 3e11;
  r.adam_gbps = 20.5;
  r.adam_bf16_gbps = 18.25;
  r.norm_gbps = 9.75;
  r.device_mem_gbps = 1500;
  r.h2d_gbps = 24;
  r.d2h_gbps = 25.5;
  r.nvme_read_gbps = 6.5;
  r.nvme_write_gbps = 4;
  r.nvme_read_busy_gbps = 5.25;
  r.nvme_write_busy_gbps = 3.5;
  r.nvme_steal_s_per_gb = 0.125;
  r.comm_gbps = 80;
  r.cpu_threads = 16;
  r.measured_at = "2025-01-02T03:04:05Z";
  return r;
}

bool same(const MachineRates& a, const MachineRates& b) {
  return a.device == b.device && a.nvme == b.nvme && a.gemm_flops == b.gemm_flops &&
         a.attention_flops == b.attention_flops && a.adam_gbps == b.adam_gbps &&
         a.adam_bf16_gbps == b.adam_bf16_gbps && a.norm_gbps == b.norm_gbps &&
         a.device_mem_gbps == b.device_mem_gbps && a.h2d_gbps == b.h2d_gbps &&
         a.d2h_gbps == b.d2h_gbps && a.nvme_read_gbps == b.nvme_read_gbps &&
         a.nvme_write_gbps == b.nvme_write_gbps &&
         a.nvme_read_busy_gbps == b.nvme_read_busy_gbps &&
         a.nvme_write_busy_gbps == b.nvme_write_busy_gbps &&
         a.nvme_steal_s_per_gb == b.nvme_steal_s_per_gb && a.comm_gbps == b.comm_gbps &&
         a.cpu_threads == b.cpu_threads && a.measured_at == b.measured_at &&
         a.source == b.source;
}

}  // namespace

void rate_cache(Bytes input) {
  static const std::string path = scratch_dir() + "/rates.json";
  const std::string_view text = as_text(input);
  const size_t eol = text.find('\n');
  const std::string key(text.substr(0, eol));
  if (eol != std::string_view::npos) {
    write_file(path, text.substr(eol + 1));
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    std::perror(("strata fuzz: removing " + path).c_str());
    std::abort();  // the environment, not the parser
  }

  const std::optional<MachineRates> loaded = load_rates(path, key);
  const MachineRates stored = loaded ? *loaded : measured();
  std::optional<MachineRates> again;
  try {
    store_rates(path, key, stored);
    again = load_rates(path, key);
  } catch (const Error& e) {
    broken(str(loaded ? "an accepted entry" : "a measurement", " does not store and load back: ",
               e.what()));
  }
  if (!again) broken(str("the stored entry \"", key, "\" is not found"));
  MachineRates want = stored;
  want.source = path;
  if (!same(*again, want))
    broken(str("the entry \"", key, "\" loads back other rates than were stored"));
}

}  // namespace strata::fuzz
