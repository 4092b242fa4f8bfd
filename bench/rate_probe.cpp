// bench/rate_probe.cpp — the short measurements behind engine/step_model.h's rates.
#include "bench/rate_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include <tbb/global_control.h>

#include "bench/adam_bench.h"
#include "bench/gemm_bench.h"
#include "bench/gpu_bench.h"
#include "bench/io_bench.h"
#include "bench/stats.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/size.h"
#include "engine/rate_cache.h"
#include "engine/trainer.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/device.h"
#include "kernels/ops.h"

namespace strata {
namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Seconds of the fastest of calls of `call` (each returning when its work is done), over at
// least `min_seconds` and at least 3 calls, after one untimed call.
template <class Fn>
double best_seconds(double min_seconds, const Fn& call) {
  using clock = std::chrono::steady_clock;
  call();
  double best = 1e30, total = 0;
  for (int calls = 0; calls < 3 || total < min_seconds; ++calls) {
    const auto t0 = clock::now();
    call();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
  }
  return best;
}

// The same for calls of `enqueue` on `s`, each waited for.
template <class Fn>
double best_seconds(Stream& s, double min_seconds, const Fn& enqueue) {
  return best_seconds(min_seconds, [&] {
    enqueue();
    s.synchronize();
  });
}

// Decimal GB/s of the gradient norm's sum of squares (cpu::fast::sum_squares, all the threads
// allowed) over 256 MB of f32 in host memory: the fastest of at least 3 calls and `min_seconds`.
double norm_gbps(double min_seconds) {
  std::vector<float> x(size_t{64} << 20, 0.01f);
  double sum = 0;
  const double best =
      best_seconds(min_seconds, [&] { cpu::fast::sum_squares(&sum, x.data(), x.size()); });
  if (!(sum > 0)) fail("bench::rate_probe", "the sum of squares of the norm probe is not > 0");
  return double(x.size() * sizeof(float)) / best / 1e9;
}

// Decimal GB/s of stream copies of `bytes` from `src` to `dst`.
double copy_gbps(Stream& s, void* dst, const void* src, size_t bytes, double min_seconds) {
  return double(bytes) / best_seconds(s, min_seconds, [&] { s.copy(dst, src, bytes); }) / 1e9;
}

// strata's CPU GEMM looped on a thread of its own (its oneTBB tasks on every allowed thread)
// from construction to destruction.
class ComputeLoad {
 public:
  ComputeLoad(int rows, int in, int out)
      : rows_(rows), in_(in), out_(out), a_(size_t(rows) * in, 0.01f),
        w_(size_t(out) * in, 0.02f), y_(size_t(rows) * out) {
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed))
        cpu::fast::linear_fwd(y_.data(), a_.data(), w_.data(), rows_, in_, out_);
    });
  }
  ComputeLoad(const ComputeLoad&) = delete;
  ComputeLoad& operator=(const ComputeLoad&) = delete;
  ~ComputeLoad() {
    stop_.store(true, std::memory_order_relaxed);
    thread_.join();
  }

 private:
  int rows_, in_, out_;
  std::vector<float> a_, w_, y_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// run_io_bench's pass with "steal_s": the machine's CPU seconds of steal during it (0 where
// /proc/stat is not read).
nlohmann::json io_pass_with_steal(const IoBenchOptions& io) {
  const CpuTimes before = cpu_times();
  nlohmann::json j = run_io_bench(io);
  const CpuTimes d = cpu_times() - before;
  j["steal_s"] = d.machine ? std::max(0.0, d.steal_s) : 0.0;
  return j;
}

}  // namespace

IoBenchOptions nvme_bench_options(const Config& c, uint64_t bytes) {
  IoBenchOptions io;
  for (const auto& d : c.offload.nvme_path) {
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    io.dirs.push_back(d);
  }
  io.size_bytes = round_up(bytes, c.io.block_size);  // a pass moves whole blocks
  io.block_bytes = c.io.block_size;
  io.queue_depth = c.io.queue_depth;
  io.submit_batch = c.io.submit_batch;
  io.backend = c.io.backend;
  io.stripe_bytes = c.io.stripe_size;
  return io;
}

nlohmann::json run_io_bench_beside_compute(const Config& c, const IoBenchOptions& io) {
  const int rows = std::clamp(c.data.micro_batch * c.data.seq_len, 1, 4096);
  const ComputeLoad load(rows, std::clamp(c.model.dim, 1, 8192),
                         std::clamp(c.model.ffn_dim, 1, 8192));
  return io_pass_with_steal(io);
}

NvmeRates measure_nvme_rates(const Config& c, const IoBenchOptions& io, int rounds) {
  STRATA_CHECK(rounds >= 1, "bench::rate_probe", "NVMe rounds ", rounds);
  std::vector<double> read, write, read_busy, write_busy, steal;
  nlohmann::json passes = nlohmann::json::array();
  for (int round = 0; round < rounds; ++round)
    for (bool beside : {false, true}) {
      // (An idle pass's steal too, for the report: a host may take it even then.)
      nlohmann::json j = beside ? run_io_bench_beside_compute(c, io) : io_pass_with_steal(io);
      (beside ? read_busy : read).push_back(j.value("read_gbps", 0.0));
      (beside ? write_busy : write).push_back(j.value("write_gbps", 0.0));
      // The steal beside compute per GB the pass moved (written, then read back).
      if (beside) steal.push_back(j.value("steal_s", 0.0) / (2.0 * double(io.size_bytes) / 1e9));
      j["beside_compute"] = beside;
      passes.push_back(std::move(j));
    }
  NvmeRates r;
  r.read_gbps = median(read);
  r.write_gbps = median(write);
  r.read_busy_gbps = median(read_busy);
  r.write_busy_gbps = median(write_busy);
  r.steal_s_per_gb = median(steal);
  r.report = {{"rounds", rounds},
              {"bytes_per_pass", io.size_bytes},
              {"read_gbps", r.read_gbps},
              {"write_gbps", r.write_gbps},
              {"read_busy_gbps", r.read_busy_gbps},
              {"write_busy_gbps", r.write_busy_gbps},
              {"steal_s_per_gb", r.steal_s_per_gb},
              {"passes", std::move(passes)}};
  return r;
}

double measure_attention_flops(Device& dev, double min_seconds) {
  // A model's shape: 16 heads of 64 (dim 1024) over T tokens, batch B — 4 x 1024 on a GPU, whose
  // kernel needs blocks to fill its SMs; 1 x 512 on the CPU, whose rate depends little on T
  // and whose probe should take a fraction of a second.
  const bool cpu = dev.kind() == DeviceKind::cpu;
  const int B = cpu ? 1 : 4, T = cpu ? 512 : 1024, H = 16, D = 64;
  const size_t n = size_t(B) * T * H * D, bytes = n * sizeof(float);
  std::vector<float> init(n);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (float& f : init) {  // uniform in [-1, 1): scores of a few units, a softmax far from one-hot
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(1 << 23);
  }
  auto s = dev.make_stream("rate probe attention");
  std::vector<Buffer> t;
  for (const char* what : {"q", "k", "v", "out", "dout", "dq", "dk", "dv"}) {
    t.push_back(dev.alloc(bytes, str("rate probe attention ", what)));
    s->copy(t.back().data(), init.data(), bytes);
  }
  Buffer lse = dev.alloc(size_t(B) * H * T * sizeof(float), "rate probe attention lse");
  s->synchronize();
  auto f = [&](int i) { return static_cast<float*>(t[size_t(i)].data()); };
  float* l = static_cast<float*>(lse.data());
  const int ld = H * D;
  const double seconds = best_seconds(*s, min_seconds, [&] {
    dev.ops().attention_fwd(*s, f(3), l, f(0), f(1), f(2), B, T, H, H, D, ld, ld);
    dev.ops().attention_bwd(*s, f(5), f(6), f(7), f(4), f(3), l, f(0), f(1), f(2), B, T, H, H, D,
                            ld, ld);
  });
  // As LlamaModel::attention_flops_per_token counts it: 6 x T x (H x D) per token, B x T tokens.
  return 6.0 * T * double(H) * D * double(B) * T / seconds;
}

bool uses_cuda(const Config& c) {
  return c.train.device == "cuda" || (c.train.device == "auto" && cuda_device_count() > 0);
}

// The name rates are cached under: the device's, and on CUDA with bf16 GEMM operands (a GEMM
// rate 8x the f32 one on an H200) that mode too, so the two modes never share a cached rate.
std::string rate_device_name(const Config& c) {
  if (!uses_cuda(c)) return make_device(DeviceKind::cpu)->name();
  const std::string name = make_device(DeviceKind::cuda)->name();
  return cuda_bf16_matmuls(c.train) ? name + ", bf16 GEMM operands" : name;
}

namespace {

// The linear's rate in a `strata bench gpu` report as config c runs it: f32, or with bf16
// operands on the tensor cores (0 when that GEMM did not run).
double linear_flops(const nlohmann::json& gpu_bench, const Config& c) {
  if (!cuda_bf16_matmuls(c.train)) return gpu_bench.value("peak_f32_tflops", 0.0) * 1e12;
  const auto& b = gpu_bench["gemm_f32_bf16_operands"];
  const bool ran = b.is_array() && !b.empty() && b[0].value("ran", false);
  return ran ? b[0].value("tflops", 0.0) * 1e12 : 0.0;
}

}  // namespace

double measure_linear_flops(const Config& c, double min_seconds) {
  if (!uses_cuda(c)) return measure_gemm_flops(min_seconds);
  // probe_rates' f32 GEMM, alone, on the GPU this rank trains on.
  return gpu_linear_flops(training_cuda_ordinal(), 4096, 4096, 4096, cuda_bf16_matmuls(c.train),
                          min_seconds);
}

MachineRates probe_rates(const Config& c, const RateProbeOptions& o) {
  MachineRates r;
  std::unique_ptr<tbb::global_control> limit;
  if (o.threads > 0)
    limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, size_t(o.threads));
  r.cpu_threads = int(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
  AdamBenchOptions adam;
  adam.numel = size_t{32} << 20;  // 0.9 GB per pass: far larger than the caches
  adam.repeats = 3;
  adam.validate_numel = (size_t{1} << 16) + 3;
  r.adam_gbps = measure_adam_gbps(adam);
  adam.bf16_states = true;
  r.adam_bf16_gbps = measure_adam_gbps(adam);
  r.norm_gbps = norm_gbps(o.min_seconds);
  if (uses_cuda(c)) {
    GpuBenchOptions g;
    g.device = training_cuda_ordinal();
    g.gemm_shapes = {{2048, 2048, 2048}};
    g.gemm_f32_shapes = {{4096, 4096, 4096}};
    g.adam_numel = size_t{32} << 20;
    g.copy_bytes = size_t{256} << 20;
    g.min_seconds = o.min_seconds;
    g.train = false;
    const nlohmann::json j = run_gpu_bench(g);
    r.device = j.value("device", std::string("cuda"));
    r.gemm_flops = linear_flops(j, c);
    if (j["adamw"].value("ran", false)) r.device_mem_gbps = j["adamw"].value("gbps", 0.0);
    if (j["pinned"].value("ran", false)) {
      r.h2d_gbps = j["pinned"].value("h2d_gbps", 0.0);
      r.d2h_gbps = j["pinned"].value("d2h_gbps", 0.0);
    }
    if (!(r.gemm_flops > 0 && r.device_mem_gbps > 0 && r.h2d_gbps > 0 && r.d2h_gbps > 0))
      fail("bench::rate_probe", str("the GPU probe did not measure every rate: ", j.dump()));
    DeviceOptions d;
    d.ordinal = g.device;
    r.attention_flops = measure_attention_flops(*make_device(DeviceKind::cuda, d), o.min_seconds);
  } else {
    auto dev = make_device(DeviceKind::cpu);
    r.device = dev->name();
    r.gemm_flops = measure_gemm_flops(o.min_seconds, GemmRate::median_call);
    r.attention_flops = measure_attention_flops(*dev, o.min_seconds);
    r.device_mem_gbps = r.adam_gbps;  // the CPU device's AdamW is the CPU AdamW
    const size_t bytes = size_t{64} << 20;
    Buffer host = dev->alloc_host(bytes, /*pinned=*/true, "rate probe host");
    Buffer devbuf = dev->alloc(bytes, "rate probe device");
    auto s = dev->make_stream("rate probe");
    s->fill_zero(host.data(), bytes);
    s->fill_zero(devbuf.data(), bytes);
    r.h2d_gbps = copy_gbps(*s, devbuf.data(), host.data(), bytes, o.min_seconds);
    r.d2h_gbps = copy_gbps(*s, host.data(), devbuf.data(), bytes, o.min_seconds);
  }
  r.nvme = nvme_filesystems(c.offload.nvme_path);
  if (!c.offload.nvme_path.empty() && o.io_bytes > 0) {
    const NvmeRates n = measure_nvme_rates(c, nvme_bench_options(c, o.io_bytes), o.io_rounds);
    r.nvme_read_gbps = n.read_gbps;
    r.nvme_write_gbps = n.write_gbps;
    r.nvme_read_busy_gbps = n.read_busy_gbps;
    r.nvme_write_busy_gbps = n.write_busy_gbps;
    r.nvme_steal_s_per_gb = n.steal_s_per_gb;
  }
  r.measured_at = utc_now();
  r.source = "measured now";
  return r;
}

RatesLookup rates_for(const Config& c, const std::string& cache_path, bool reprobe,
                      void (*on_probe)(const std::string&)) {
  RatesLookup out;
  out.cache_path = cache_path.empty() ? default_rate_cache_path() : cache_path;
  const std::string key = rate_cache_key(rate_device_name(c), nvme_filesystems(c.offload.nvme_path));
  if (!reprobe) {
    if (auto cached = load_rates(out.cache_path, key)) {
      out.rates = *cached;
      return out;
    }
  }
  check_rate_cache_writable(out.cache_path);
  if (on_probe) on_probe(out.cache_path);
  out.rates = probe_rates(c);
  out.probed = true;
  store_rates(out.cache_path, key, out.rates);
  out.rates.source = out.cache_path + " (measured now)";
  return out;
}

}  // namespace strata
