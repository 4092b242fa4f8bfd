// bench/rate_probe.h — measures the rates the step model (engine/step_model.h) needs, in a few
// seconds, with the benchmarks' own validated code: the GEMM rate (bench/gemm_bench.h on the
// CPU device, bench/gpu_bench.h's f32 GEMM on CUDA), the device's attention kernels (forward and
// backward at a fixed shape), the CPU AdamW rate (bench/adam_bench.h on
// 32M parameters), host ⇄ device copies (stream copies; on the CPU device they are host memory
// copies), and NVMe read and write over offload.nvme_path (bench/io_bench.h, 256M by default).
// rates_for() reads them from the cache file (engine/rate_cache.h) or probes and stores them.
// It does not predict anything.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"
#include "engine/step_model.h"

namespace strata {

class Device;

struct RateProbeOptions {
  uint64_t io_bytes = 256ull << 20;  // NVMe bytes written, then read
  double min_seconds = 0.3;          // per GEMM and copy measurement
  int threads = 0;                   // oneTBB threads of the CPU measurements; 0 = all
};

// FLOP/s of the device's causal attention, forward and backward, at a fixed model-like shape,
// counted as LlamaModel::attention_flops_per_token counts them.
double measure_attention_flops(Device& dev, double min_seconds);

// Whether train.device means the CUDA device here (cuda, or auto with one present).
bool uses_cuda(const Config& config);
// The name of that device (the rate cache's key).
std::string rate_device_name(const Config& config);
// Probes every rate for this config's device and offload.nvme_path (NVMe rates only with one).
MachineRates probe_rates(const Config& config, const RateProbeOptions& options = {});

struct RatesLookup {
  MachineRates rates;
  bool probed = false;      // measured now (and stored), not read from the cache
  std::string cache_path;   // the file read or written
};
// From `cache_path` (empty: default_rate_cache_path()) under this machine's key, or probed now
// and stored there when absent or when `reprobe`. `on_probe` is called before probing (to say so).
RatesLookup rates_for(const Config& config, const std::string& cache_path, bool reprobe,
                      void (*on_probe)(const std::string& cache_path) = nullptr);

}  // namespace strata
