// bench/rate_probe.h — measures the rates the step model (engine/step_model.h) needs, in a few
// seconds, with the benchmarks' own validated code: the GEMM rate (bench/gemm_bench.h's median
// call on the CPU device, bench/gpu_bench.h's f32 GEMM on CUDA), the device's attention kernels (forward and
// backward at a fixed shape), the CPU AdamW rate (bench/adam_bench.h on
// 32M parameters), host ⇄ device copies (stream copies; on the CPU device they are host memory
// copies), and NVMe read and write over offload.nvme_path (bench/io_bench.h, 256M by default),
// once on an idle machine and once while every CPU thread computes the config's MLP
// up-projection (a 2-core VM's virtio disk moved about half its idle rate beside memory-streaming
// threads: bench/results/cpu-epyc-avx2-2core-2026-12-05-disk-under-load.md), with the CPU time a
// hypervisor took as steal during the latter (its host emulated the disk on the guest's cores:
// bench/results/cpu-epyc-avx2-2core-2026-12-05d-steal.md).
// rates_for() reads them from the cache file (engine/rate_cache.h) or probes and stores them.
// It does not predict anything.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/io_bench.h"
#include "engine/config.h"
#include "engine/step_model.h"

namespace strata {

class Device;

struct RateProbeOptions {
  uint64_t io_bytes = 256ull << 20;  // NVMe bytes written, then read, per pass
  int io_rounds = 3;                 // pairs of NVMe passes, idle and beside compute
  double min_seconds = 0.3;          // per GEMM and copy measurement
  int threads = 0;                   // oneTBB threads of the CPU measurements; 0 = all
};

// FLOP/s of the device's causal attention, forward and backward, at a fixed model-like shape,
// counted as LlamaModel::attention_flops_per_token counts them.
double measure_attention_flops(Device& dev, double min_seconds);

// bench/io_bench.h's options for `config`'s offload.nvme_path and io.* (block size, queue depth,
// backend, stripe), `bytes` per pass; creates the directories, as the engine does.
IoBenchOptions nvme_bench_options(const Config& config, uint64_t bytes);

// bench/io_bench.h's pass over `io` while every CPU thread (the process's oneTBB limit) runs
// strata's GEMM on the shape of the config's MLP up-projection over one micro-batch (rows
// micro_batch × seq_len, at most 4096; dim and ffn_dim each at most 8192), as the CPU device's
// passes do beside the engine's NVMe traffic. The load starts before the pass and stops after it.
// Adds "steal_s": the machine's CPU seconds of steal during the pass (0 where /proc/stat is not
// read).
nlohmann::json run_io_bench_beside_compute(const Config& config, const IoBenchOptions& io);

// The NVMe rates over `io` idle and beside compute: `rounds` pairs of passes of io.size_bytes
// each, an idle pass then one beside compute, and the median of each rate. A virtual disk's rate
// drifts by 2-3x within minutes (bench/results/cpu-epyc-avx2-2core-2026-12-05.md); alternating
// keeps the two kinds in the same minutes, and the median drops a pass that caught a swing.
struct NvmeRates {
  double read_gbps = 0, write_gbps = 0;            // idle
  double read_busy_gbps = 0, write_busy_gbps = 0;  // beside compute
  // CPU seconds a hypervisor took as steal (all cores, /proc/stat) per GB a pass beside compute
  // moved: 0 on bare metal; on a VM whose host emulates the disk on the guest's cores, what the
  // disk's bytes cost compute.
  double steal_s_per_gb = 0;
  // {"rounds", "bytes_per_pass", the four medians, "passes": [run_io_bench's JSON + the bool
  // "beside_compute", in the order run]}
  nlohmann::json report;
};
NvmeRates measure_nvme_rates(const Config& config, const IoBenchOptions& io, int rounds);

// Whether train.device means the CUDA device here (cuda, or auto with one present).
bool uses_cuda(const Config& config);
// The name of that device (the rate cache's key).
std::string rate_device_name(const Config& config);
// The linear layers' GEMM rate on this config's device, as its matmuls run: the CPU's f32 GEMM
// (measure_gemm_flops), or on CUDA cuBLASLt's f32 GEMM, with bf16 operands where the config's
// matmuls take them. What MFU is measured against when log.peak_flops = 0.
double measure_linear_flops(const Config& config, double min_seconds);
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
