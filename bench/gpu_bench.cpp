// bench/gpu_bench.cpp — run_gpu_bench (see gpu_bench.h). The CUDA backend is reached only through
// plain C++ headers: kernels/device.h, kernels/ops.h, kernels/cuda/cuda_backend.h and
// optimizer/adamw.h.
#include "bench/gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "bench/stats.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/size.h"
#include "comm/comm.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/trainer.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "optimizer/adamw.h"

namespace strata {
namespace {

constexpr double kU32 = 1.0 / (1 << 24);
constexpr int kSamples = 64;           // elements of each GEMM checked in double
constexpr double kBatchSeconds = 2e-3;  // calls are batched so a timed batch lasts this long
const std::array<int, 3> kDefaultGemmShapes[] = {
    {4096, 4096, 4096}, {8192, 8192, 8192},
    {8192, 14336, 4096},  // tokens × ffn × dim: a Llama-3-8B MLP up-projection
    {8192, 4096, 14336},  // its down-projection
};
const std::array<int, 3> kDefaultF32Shapes[] = {{4096, 4096, 4096}, {8192, 8192, 8192}};
constexpr double kAdamGoalRatioToCopy = 0.8;  // the device AdamW's GB/s against a device copy's
constexpr double kTrainGoalMfuBf16 = 0.45;     // the all-device run's MFU against the bf16 peak

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Timing {
  double best_s = 0, median_s = 0;  // per call
  int calls = 0;
};

// Times `enqueue` (which enqueues one call on s): one warm-up call, then batches of calls until
// min_seconds have passed (at least 3 batches).
Timing time_calls(Stream& s, double min_seconds, const std::function<void()>& enqueue) {
  enqueue();
  s.synchronize();
  auto t0 = Clock::now();
  enqueue();
  s.synchronize();
  const double one = seconds_since(t0);
  const int batch = std::clamp(int(kBatchSeconds / std::max(one, 1e-7)), 1, 1000);
  std::vector<double> per_call;
  double total = 0;
  Timing t;
  while (total < min_seconds || per_call.size() < 3) {
    t0 = Clock::now();
    for (int i = 0; i < batch; ++i) enqueue();
    s.synchronize();
    const double dt = seconds_since(t0);
    per_call.push_back(dt / batch);
    total += dt;
    t.calls += batch;
  }
  t.best_s = *std::min_element(per_call.begin(), per_call.end());
  t.median_s = median(per_call);
  return t;
}

// A value in [-1, 1) that is a pure function of (seed, i): the tensors need no host copy to be
// checked, the checker recomputes any element.
float value(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(int64_t(z >> 40) - (int64_t(1) << 23)) / float(1 << 23);
}
float bf16_value(uint64_t seed, uint64_t i) { return bf16_bits_to_f32(f32_to_bf16_bits(value(seed, i))); }

// A device tensor of n elements filled with value(seed, ·) (as bf16 bits or f32).
template <class T>
Buffer upload_values(Device& dev, Stream& s, size_t n, uint64_t seed, const char* what) {
  Buffer d = dev.alloc(n * sizeof(T), what);
  Buffer h = dev.alloc_host(n * sizeof(T), true, "benchmark staging");
  T* p = h.as<T>();
  for (size_t i = 0; i < n; ++i) {
    if constexpr (sizeof(T) == 2) p[i] = f32_to_bf16_bits(value(seed, i));
    else p[i] = value(seed, i);
  }
  s.copy(d.data(), h.data(), n * sizeof(T));
  s.synchronize();
  return d;
}

template <class F>
nlohmann::json section(F&& body) {
  try {
    nlohmann::json j = body();
    j["ran"] = true;
    return j;
  } catch (const std::exception& e) {
    return {{"ran", false}, {"reason", e.what()}};
  }
}

struct BenchGpu {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> s;
  explicit BenchGpu(int ordinal, bool bf16_matmuls = false) {
    DeviceOptions o;
    o.ordinal = ordinal;
    o.bf16_matmuls = bf16_matmuls;
    dev = make_device(DeviceKind::cuda, o);
    s = dev->make_stream("bench");
  }
  ~BenchGpu() {
    s.reset();
    dev.reset();
  }
};

// ---- GEMMs ----------------------------------------------------------------------------------

// Largest |error| / bound over kSamples elements of out (m, n) = a (m, k) · b^T (n, k) in device
// memory (bf16 or f32); a and b hold value(seed_a / seed_b, ·), rounded to bf16 when bf16. The
// bound is the f32 dot-product bound (k + 2)·u·Σ|a b| plus the output's rounding (half an ulp of
// bf16 is 2^-9 relative: 2^-8 allowed; u for f32: 2u allowed). bf16_operands: f32 data whose
// operands the GEMM rounds to bf16 (each product then off by up to ~2^-8 of |a b|: 2^-7 Σ|a b|
// allowed on top).
double check_gemm(Device& dev, Stream& s, const void* out, int m, int n, int k, bool bf16,
                  uint64_t seed_a, uint64_t seed_b, bool bf16_operands = false) {
  std::mt19937 rng(uint32_t(m * 31 + n * 7 + k));
  std::vector<std::pair<int, int>> at(kSamples);
  for (auto& [i, j] : at) {
    i = std::uniform_int_distribution<int>(0, m - 1)(rng);
    j = std::uniform_int_distribution<int>(0, n - 1)(rng);
  }
  const size_t elem = bf16 ? 2 : 4;
  Buffer h = dev.alloc_host(kSamples * elem, true, "benchmark check");
  for (int t = 0; t < kSamples; ++t)
    s.copy(static_cast<char*>(h.data()) + t * elem,
           static_cast<const char*>(out) + (size_t(at[t].first) * n + at[t].second) * elem, elem);
  s.synchronize();
  double worst = 0;
  for (int t = 0; t < kSamples; ++t) {
    const auto [i, j] = at[t];
    double want = 0, mag = 0;
    for (int kk = 0; kk < k; ++kk) {
      const double x = bf16 ? bf16_value(seed_a, uint64_t(i) * k + kk) : value(seed_a, uint64_t(i) * k + kk);
      const double y = bf16 ? bf16_value(seed_b, uint64_t(j) * k + kk) : value(seed_b, uint64_t(j) * k + kk);
      want += x * y;
      mag += std::fabs(x * y);
    }
    const double got = bf16 ? bf16_bits_to_f32(h.as<uint16_t>()[t]) : h.as<float>()[t];
    const double out_rounding = bf16 ? std::ldexp(1.0, -8) : 2 * kU32;
    const double bound = (k + 2) * kU32 * mag + out_rounding * std::fabs(want) +
                         (bf16_operands ? std::ldexp(mag, -7) : 0.0) + 1e-30;
    worst = std::max(worst, std::isfinite(got) ? std::fabs(got - want) / bound : INFINITY);
  }
  return worst;
}

nlohmann::json gemm_bf16_shape(BenchGpu& g, int m, int n, int k, double min_seconds) {
  Device& dev = *g.dev;
  Stream& s = *g.s;
  Buffer a = upload_values<uint16_t>(dev, s, size_t(m) * k, 1, "gemm a");
  Buffer b = upload_values<uint16_t>(dev, s, size_t(n) * k, 2, "gemm b");
  Buffer c = dev.alloc(size_t(m) * n * 2, "gemm out");
  auto* pa = a.as<uint16_t>();
  auto* pb = b.as<uint16_t>();
  auto* pc = c.as<uint16_t>();
  const int candidates = cuda::gemm_bf16_candidates(s, pc, pa, pb, m, n, k);
  const double flops = 2.0 * m * n * k;
  nlohmann::json per = nlohmann::json::array();
  double strata_err = 0, best_tflops = 0;
  int best = -1;
  Timing strata;
  for (int cand = 0; cand < candidates; ++cand) {
    cuda::gemm_bf16(s, pc, pa, pb, m, n, k, cand);
    const double err = check_gemm(dev, s, pc, m, n, k, true, 1, 2);
    if (!(err <= 1.0)) {  // a wrong candidate is reported, never timed
      if (cand == 0)
        fail("bench::gpu", str("strata's bf16 GEMM ", m, "x", n, "x", k, " is wrong: error ", err,
                               " times its bound"));
      per.push_back({{"candidate", cand}, {"valid", false}, {"max_error_ratio", err}});
      continue;
    }
    const Timing t = time_calls(s, cand == 0 ? min_seconds : min_seconds / 2,
                                [&] { cuda::gemm_bf16(s, pc, pa, pb, m, n, k, cand); });
    if (cand == 0) {
      strata = t;
      strata_err = err;
    }
    const double tflops = flops / t.best_s / 1e12;
    per.push_back({{"candidate", cand}, {"valid", true}, {"tflops", tflops}, {"max_error_ratio", err}});
    if (tflops > best_tflops) {
      best_tflops = tflops;
      best = cand;
    }
  }
  const double strata_tflops = flops / strata.best_s / 1e12;
  return {{"m", m},
          {"n", n},
          {"k", k},
          {"strata_tflops", strata_tflops},
          {"strata_tflops_median", flops / strata.median_s / 1e12},
          {"strata_calls", strata.calls},
          {"cublas_best_tflops", best_tflops},
          {"cublas_best_candidate", best},
          {"ratio_to_cublas_best", strata_tflops / best_tflops},
          {"candidates", candidates},
          {"per_candidate", per},
          {"validated_samples", kSamples},
          {"max_error_ratio", strata_err}};
}

// strata's f32 linear: out (m, n) = in (m, k) · w^T, w (n, k), through Ops::linear_fwd; on a
// device made with bf16_matmuls, the operands go to the tensor cores rounded to bf16.
nlohmann::json gemm_f32(BenchGpu& g, int m, int n, int k, double min_seconds, bool bf16_operands) {
  const int N = m, IC = k, OC = n;
  Device& dev = *g.dev;
  Stream& s = *g.s;
  Buffer in = upload_values<float>(dev, s, size_t(N) * IC, 3, "linear in");
  Buffer w = upload_values<float>(dev, s, size_t(OC) * IC, 4, "linear w");
  Buffer out = dev.alloc(size_t(N) * OC * 4, "linear out");
  auto run = [&] { dev.ops().linear_fwd(s, out.as<float>(), in.as<float>(), w.as<float>(), N, IC, OC); };
  run();
  const double err = check_gemm(dev, s, out.data(), N, OC, IC, false, 3, 4, bf16_operands);
  if (!(err <= 1.0)) fail("bench::gpu", str("strata's f32 linear is wrong: error ", err, " times its bound"));
  const Timing t = time_calls(s, min_seconds, run);
  const double flops = 2.0 * N * IC * OC;
  return {{"m", N}, {"n", OC}, {"k", IC}, {"tflops", flops / t.best_s / 1e12},
          {"tflops_median", flops / t.median_s / 1e12}, {"calls", t.calls}, {"max_error_ratio", err},
          {"note", bf16_operands ? "f32 inputs rounded to bf16, tensor cores, f32 accumulation "
                                   "(train.matmul_precision = bf16)"
                                 : "f32 inputs, f32 accumulation, CUDA cores (no TF32)"}};
}

// ---- AdamW, copies --------------------------------------------------------------------------

AdamWHyper bench_hyper() {
  AdamWHyper h;
  h.lr = 1e-3f;
  h.beta2 = 0.95f;
  h.weight_decay = 0.1f;
  return h;
}

// The CUDA step against the CPU scalar path on n elements (f32 state, bf16 copy), `steps` steps
// in a row: the values that differ in any bit after the last.
size_t validate_adamw(BenchGpu& g, size_t n, int steps) {
  std::vector<float> p(n), gr(n), m(n), v(n);
  std::vector<uint16_t> pb(n, 0);
  for (size_t i = 0; i < n; ++i) {
    p[i] = value(11, i);
    gr[i] = 1e-2f * value(12, i);
    m[i] = 1e-3f * value(13, i);
    v[i] = 1e-6f * std::fabs(value(14, i));
  }
  auto up = [&](const void* src, size_t bytes, const char* what) {
    Buffer d = g.dev->alloc(bytes, what);
    Buffer h = g.dev->alloc_host(bytes, true, "staging");
    std::memcpy(h.data(), src, bytes);
    g.s->copy(d.data(), h.data(), bytes);
    g.s->synchronize();
    return d;
  };
  Buffer dp = up(p.data(), n * 4, "p"), dg = up(gr.data(), n * 4, "g"), dm = up(m.data(), n * 4, "m"),
         dv = up(v.data(), n * 4, "v"), dpb = up(pb.data(), n * 2, "pb");
  AdamWTensors t{p.data(), gr.data(), nullptr, m.data(), v.data(), pb.data(), n};
  AdamWTensors td{dp.as<float>(), dg.as<float>(), nullptr, dm.as<float>(), dv.as<float>(), dpb.as<uint16_t>(), n};
  for (int64_t step = 1; step <= steps; ++step) {
    adamw_update_isa(AdamIsa::scalar, bench_hyper(), step, 0.5f, t);
    adamw_update_on_stream(*g.s, bench_hyper(), step, 0.5f, td);
  }
  Buffer h = g.dev->alloc_host(n * 4, true, "check");
  size_t wrong = 0;
  for (auto [dev_buf, host_ptr] : {std::pair{&dp, (const void*)p.data()}, {&dm, m.data()}, {&dv, v.data()}}) {
    g.s->copy(h.data(), dev_buf->data(), n * 4);
    g.s->synchronize();
    for (size_t i = 0; i < n; ++i) wrong += std::memcmp(h.as<float>() + i, static_cast<const float*>(host_ptr) + i, 4) != 0;
  }
  g.s->copy(h.data(), dpb.data(), n * 2);
  g.s->synchronize();
  for (size_t i = 0; i < n; ++i) wrong += h.as<uint16_t>()[i] != pb[i];
  return wrong;
}

nlohmann::json adamw(BenchGpu& g, size_t numel, size_t copy_bytes, int steps, double min_seconds) {
  if (steps < 1) fail("bench::gpu", str("adam_steps must be at least 1, not ", steps));
  const size_t validate_n = (size_t{1} << 20) + 3;
  const size_t wrong = validate_adamw(g, validate_n, steps);
  if (wrong) fail("bench::gpu", str("the CUDA AdamW differs from the CPU scalar path in ", wrong, " values"));
  Device& dev = *g.dev;
  Stream& s = *g.s;
  Buffer p = dev.alloc(numel * 4, "adamw param"), gr = dev.alloc(numel * 4, "adamw grad");
  Buffer m = dev.alloc(numel * 4, "adamw m"), v = dev.alloc(numel * 4, "adamw v"), pb = dev.alloc(numel * 2, "adamw bf16");
  for (Buffer* b : {&p, &gr, &m, &v}) s.fill_zero(b->data(), numel * 4);
  {  // realistic values in param and grad: a random block tiled over them
    const size_t block = std::min(numel, size_t{1} << 22);
    Buffer src = upload_values<float>(dev, s, block, 15, "adamw init");
    for (Buffer* b : {&p, &gr})
      for (size_t off = 0; off < numel; off += block)
        s.copy(b->as<float>() + off, src.data(), std::min(block, numel - off) * 4);
    s.synchronize();
  }
  AdamWTensors t{p.as<float>(), gr.as<float>(), nullptr, m.as<float>(), v.as<float>(), nullptr, numel};
  const Timing step = time_calls(s, min_seconds, [&] { adamw_update_on_stream(s, bench_hyper(), 10, 0.5f, t); });
  AdamWTensors tf = t;
  tf.param_bf16 = pb.as<uint16_t>();
  const Timing fused = time_calls(s, min_seconds, [&] { adamw_update_on_stream(s, bench_hyper(), 10, 0.5f, tf); });
  p.reset(), gr.reset(), m.reset(), v.reset(), pb.reset();
  Buffer src = dev.alloc(copy_bytes, "copy src"), dst = dev.alloc(copy_bytes, "copy dst");
  s.fill_zero(src.data(), copy_bytes);
  const Timing copy = time_calls(s, min_seconds, [&] { s.copy(dst.data(), src.data(), copy_bytes); });
  const double gbps = 28.0 * numel / step.best_s / 1e9;
  const double copy_gbps = 2.0 * copy_bytes / copy.best_s / 1e9;  // read + write
  return {{"numel", numel},
          {"params_per_s", numel / step.best_s},
          {"gbps", gbps},
          {"gbps_median", 28.0 * numel / step.median_s / 1e9},
          {"gbps_fused_bf16_copy", 30.0 * numel / fused.best_s / 1e9},
          {"copy_bytes", copy_bytes},
          {"copy_gbps", copy_gbps},
          {"ratio_to_copy", gbps / copy_gbps},
          {"goal_ratio_to_copy", kAdamGoalRatioToCopy},
          {"meets_goal", gbps / copy_gbps >= kAdamGoalRatioToCopy},
          {"bytes_per_param", 28},
          {"validated_numel", validate_n},
          {"validated_steps", steps},
          {"wrong", wrong}};
}

nlohmann::json pinned(BenchGpu& g, size_t bytes, double min_seconds) {
  Buffer h = g.dev->alloc_host(bytes, true, "pinned"), d = g.dev->alloc(bytes, "device");
  std::memset(h.data(), 1, bytes);
  const Timing h2d = time_calls(*g.s, min_seconds, [&] { g.s->copy(d.data(), h.data(), bytes); });
  const Timing d2h = time_calls(*g.s, min_seconds, [&] { g.s->copy(h.data(), d.data(), bytes); });
  return {{"bytes", bytes},
          {"h2d_gbps", bytes / h2d.best_s / 1e9},
          {"d2h_gbps", bytes / d2h.best_s / 1e9},
          {"h2d_gbps_median", bytes / h2d.median_s / 1e9},
          {"d2h_gbps_median", bytes / d2h.median_s / 1e9}};
}

// ---- training -------------------------------------------------------------------------------

Config train_config(const GpuBenchOptions& o) {
  Config c;
  if (!o.train_config.empty()) {
    c = load_config(o.train_config, {});
  } else {  // ~100M parameters: large enough that GEMMs, not launches, set the pace
    c = load_config("", {});
    c.model.dim = 1024;
    c.model.n_layers = 8;
    c.model.n_heads = 16;
    c.model.n_kv_heads = 8;
    c.model.ffn_dim = 2816;
    c.model.max_seq_len = 1024;
    c.data.seq_len = 1024;
    c.data.micro_batch = 8;
    c.train.warmup_steps = 2;
  }
  c.train.steps = o.train_steps;
  c.train.device = "cuda";
  c.eval.batches = 0;
  c.log.every = 1000000;
  for (const auto& kv : o.train_overrides) apply_override(c, kv);
  clear_run_outputs(c);  // a benchmark saves nothing and logs no metrics file
  validate(c);
  return c;
}

nlohmann::json train_run(const Config& cfg, double peak_f32, double peak_bf16) {
  if (cfg.train.steps < 2) fail("bench::gpu", "train_steps must be at least 2 (the first is warm-up)");
  auto world = make_solo_communicator();
  TrainerOptions topt;
  topt.progress = false;
  topt.peak_flops = peak_f32;
  std::vector<double> tps, ms;
  topt.on_step = [&](const StepRecord& r) {
    if (r.step == 1) return;
    tps.push_back(r.tokens_per_s);
    ms.push_back(r.step_ms);
  };
  TrainSummary s;
  int64_t params = 0;
  {
    Trainer trainer(cfg, *world, topt);
    params = trainer.num_params();
    s = trainer.train();
  }
  const double fpt = LlamaModel(cfg.model).train_flops_per_token(cfg.data.seq_len);
  const double tokens_per_s = median(tps);
  const double achieved = tokens_per_s * fpt;
  return {{"params", params},
          {"placement",
           {{"params", tier_name(cfg.offload.params)},
            {"grads", tier_name(cfg.offload.grads)},
            {"optimizer", tier_name(cfg.offload.optimizer)}}},
          {"device_mem_limit", cfg.offload.device_mem_limit},
          {"precision", precision_name(cfg.train.precision)},
          {"matmul_precision", cuda_bf16_matmuls(cfg.train) ? "bf16" : "f32"},
          {"tokens_per_step", int64_t(cfg.data.micro_batch) * cfg.data.seq_len * cfg.train.grad_accum},
          {"steps_timed", ms.size()},
          {"tokens_per_s", tokens_per_s},
          {"step_ms_median", median(ms)},
          {"flops_per_token", fpt},
          {"achieved_tflops", achieved / 1e12},
          {"mfu_vs_f32_gemm", peak_f32 > 0 ? achieved / peak_f32 : 0.0},
          {"mfu_vs_bf16_gemm", peak_bf16 > 0 ? achieved / peak_bf16 : 0.0},
          {"loss_first", s.losses.empty() ? 0.0 : s.losses.front()},
          {"loss_last", s.losses.empty() ? 0.0 : s.losses.back()},
          {"device_peak_bytes", s.device_peak_bytes}};
}

// Bytes of the states in a plan, wherever they live: compute copy, gradients, master, m and v
// (the rows engine/plan.cpp names so), not the working set or the activations.
uint64_t state_bytes(const MemoryPlan& plan) {
  uint64_t sum = 0;
  for (const auto& r : plan.rows)
    for (const char* prefix : {"compute copy", "gradients", "master weights", "AdamW m and v"})
      if (r.what.rfind(prefix, 0) == 0) sum += r.bytes;
  if (sum == 0) fail("bench::gpu", "the memory plan names no state rows (compute copy, gradients, master, m, v)");
  return sum;
}

struct Offloaded {
  Config config;
  std::string limit_rule;
  uint64_t state_bytes_all_device = 0;
};

// The offloaded config: `overrides` on the base (empty: params, grads and optimizer on `tier`),
// under a device limit of `fraction` × the all-device run's state bytes, or, when fraction is 0,
// halfway between what it and the all-device run need (so the all-device run would not fit).
Offloaded offloaded(const Config& base, Tier tier, const std::vector<std::string>& overrides, double fraction,
                    const std::string& nvme, uint64_t capacity) {
  Offloaded o;
  Config& c = o.config;
  c = base;
  if (overrides.empty()) {
    c.offload.params = tier;
    c.offload.grads = Tier::host;
    c.offload.optimizer = tier;
  } else {
    for (const auto& kv : overrides) apply_override(c, kv);
  }
  if (!nvme.empty()) c.offload.nvme_path = {nvme};
  validate(c);
  PlanMachine machine;
  machine.device_is_host_memory = false;
  machine.device_capacity = capacity;
  machine.ranks_here = 1;
  const MemoryPlan all_plan = plan_memory(base, 1, machine);
  const uint64_t all = all_plan.device_bytes();
  const uint64_t off = plan_memory(c, 1, machine).device_bytes();
  o.state_bytes_all_device = state_bytes(all_plan);
  if (fraction > 0) {
    c.offload.device_mem_limit = uint64_t(fraction * double(o.state_bytes_all_device));
    o.limit_rule = str(fraction, " x the all-device run's state bytes (", format_bytes(o.state_bytes_all_device), ")");
    validate(c);
    const MemoryPlan plan = plan_memory(c, 1, machine);
    if (!plan.fits()) fail("bench::gpu", str("the offloaded run does not fit its device limit:\n", plan.table()));
    return o;
  }
  if (off >= all)
    fail("bench::gpu", str("offloading does not lower the planned device bytes (", format_bytes(all),
                           " all on the device, ", format_bytes(off), " offloaded)"));
  c.offload.device_mem_limit = off + (all - off) / 2;
  o.limit_rule = "halfway between the offloaded and the all-device run's planned device bytes";
  return o;
}

nlohmann::json offloaded_run(const Offloaded& o, double peak_f32, double peak_bf16) {
  nlohmann::json j = train_run(o.config, peak_f32, peak_bf16);
  j["device_mem_limit_rule"] = o.limit_rule;
  j["state_bytes_all_device"] = o.state_bytes_all_device;
  return j;
}

void need_cuda() {
  if (cuda_device_count() == 0)
    fail("bench::gpu", str("no CUDA device: ", cuda_describe()),
         "run on a machine with an NVIDIA GPU");
}

}  // namespace

double gpu_linear_flops(int device, int m, int n, int k, bool bf16_operands, double min_seconds) {
  need_cuda();
  BenchGpu g(device, bf16_operands);
  return gemm_f32(g, m, n, k, min_seconds, bf16_operands)["tflops"].get<double>() * 1e12;
}

nlohmann::json run_gpu_bench(const GpuBenchOptions& o) {
  need_cuda();
  const auto t0 = Clock::now();
  nlohmann::json j;
  double peak_f32 = 0, peak_bf16 = 0;
  uint64_t capacity = 0;
  {
    BenchGpu g(o.device);
    capacity = g.dev->memory().limit_bytes;
    j["device"] = g.dev->name();
    j["describe"] = cuda_describe();
    j["memory_limit_bytes"] = capacity;
    nlohmann::json shapes = nlohmann::json::array();
    std::vector<std::array<int, 3>> list(o.gemm_shapes.begin(), o.gemm_shapes.end());
    if (list.empty()) list.assign(std::begin(kDefaultGemmShapes), std::end(kDefaultGemmShapes));
    for (const auto& [m, n, k] : list) {
      nlohmann::json r = section([&] { return gemm_bf16_shape(g, m, n, k, o.min_seconds); });
      if (!r["ran"].get<bool>()) r.update({{"m", m}, {"n", n}, {"k", k}});
      else peak_bf16 = std::max(peak_bf16, r["cublas_best_tflops"].get<double>() * 1e12);
      shapes.push_back(r);
    }
    j["gemm_bf16"] = shapes;
    nlohmann::json f32 = nlohmann::json::array();
    std::vector<std::array<int, 3>> f32_list(o.gemm_f32_shapes.begin(), o.gemm_f32_shapes.end());
    if (f32_list.empty()) f32_list.assign(std::begin(kDefaultF32Shapes), std::end(kDefaultF32Shapes));
    for (const auto& [m, n, k] : f32_list) {
      nlohmann::json r = section([&] { return gemm_f32(g, m, n, k, o.min_seconds, false); });
      if (!r["ran"].get<bool>()) r.update({{"m", m}, {"n", n}, {"k", k}});
      else peak_f32 = std::max(peak_f32, r["tflops"].get<double>() * 1e12);
      f32.push_back(r);
    }
    j["gemm_f32"] = f32;
    // The same linear with bf16 operands: what train.matmul_precision = bf16 runs.
    nlohmann::json f32_bf16 = nlohmann::json::array();
    {
      BenchGpu g16(o.device, true);
      for (const auto& [m, n, k] : f32_list) {
        nlohmann::json r = section([&] { return gemm_f32(g16, m, n, k, o.min_seconds, true); });
        if (!r["ran"].get<bool>()) r.update({{"m", m}, {"n", n}, {"k", k}});
        f32_bf16.push_back(r);
      }
    }
    j["gemm_f32_bf16_operands"] = f32_bf16;
    j["adamw"] = section([&] { return adamw(g, o.adam_numel, o.copy_bytes, o.adam_steps, o.min_seconds); });
    j["pinned"] = section([&] { return pinned(g, o.copy_bytes, o.min_seconds); });
  }
  nlohmann::json train;
  if (!o.train) {
    train = {{"ran", false}, {"reason", "skipped (--no-train)"}};
  } else {
    Config base;
    try {
      base = train_config(o);
    } catch (const std::exception& e) {
      train = {{"ran", false}, {"reason", e.what()}};
    }
    if (train.is_null()) {
      train["device"] = section([&] {
        nlohmann::json r = train_run(base, peak_f32, peak_bf16);
        r["goal_mfu_vs_bf16_gemm"] = kTrainGoalMfuBf16;
        r["meets_goal"] = r["mfu_vs_bf16_gemm"].get<double>() >= kTrainGoalMfuBf16;
        return r;
      });
      // The same run with f32 GEMMs on the CUDA cores, for comparison: what precision = bf16
      // computed before its GEMMs took bf16 operands. (A run that multiplies in f32 already is
      // that run: not repeated.)
      if (cuda_bf16_matmuls(base.train))
        train["device_f32_matmuls"] = section([&] {
          Config c = base;
          c.train.matmul_precision = "f32";
          return train_run(c, peak_f32, peak_bf16);
        });
      train["offload_host"] = section([&] {
        return offloaded_run(offloaded(base, Tier::host, o.offload_overrides, o.offload_limit_fraction, "", capacity),
                             peak_f32, peak_bf16);
      });
      train["offload_nvme"] =
          o.nvme_path.empty()
              ? nlohmann::json{{"ran", false}, {"reason", "no --nvme-path given"}}
              : section([&] {
                  return offloaded_run(offloaded(base, Tier::nvme, {}, 0, o.nvme_path, capacity), peak_f32,
                                       peak_bf16);
                });
    }
  }
  j["train"] = train;
  j["peak_f32_tflops"] = peak_f32 / 1e12;
  j["peak_bf16_tflops"] = peak_bf16 / 1e12;
  j["settings"] = {{"device", o.device},
                   {"adam_numel", o.adam_numel},
                   {"copy_bytes", o.copy_bytes},
                   {"adam_steps", o.adam_steps},
                   {"offload_overrides", o.offload_overrides},
                   {"offload_limit_fraction", o.offload_limit_fraction},
                   {"min_seconds", o.min_seconds},
                   {"train_steps", o.train_steps},
                   {"train_config", o.train_config.empty() ? "built-in GPU default" : o.train_config},
                   {"train_overrides", o.train_overrides},
                   {"timing", "host wall clock around stream synchronize; calls batched to >= 2 ms; best batch"}};
  j["seconds"] = seconds_since(t0);
  return j;
}

}  // namespace strata
