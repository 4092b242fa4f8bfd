// bench/adam_bench.cpp — `strata bench adam` (see adam_bench.h): validate, then time the AdamW
// step, its streaming bound, the fused bf16 step and the unfused passes, and report JSON.
//
// Bytes per parameter counted in `gbps` are the bytes of the arrays read plus written:
//   step (and its bound)   read θ g m v, write θ m v           16 + 12      = 28
//   fused (and its bound)  the step + write the bf16 copy      28 + 2       = 30
//   unfused                g·s pass 8, the step 28, copy pass 4 + 2         = 42
//   bf16 states            read θ g, bf16 m v; write θ, bf16 m v   12 + 8   = 20
// (not counted: the read-for-ownership the hardware may add for a write to a line not read).
#include "bench/adam_bench.h"

#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "bench/stats.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/size.h"
#include "optimizer/adamw.h"
#include "optimizer/adamw_isa.h"

namespace strata {
namespace {

constexpr const char* kWhere = "bench::adam";
constexpr size_t kHugePage = size_t{2} << 20;
constexpr double kBytesStep = 28, kBytesFused = 30, kBytesUnfused = 42, kBytesBf16States = 20;
// A loss-scale unscale times a clip factor, in the fused step.
constexpr float kFusedScale = 0.5f;

// n elements in memory aligned to 2 MiB and advised to use transparent huge pages (fewer TLB
// misses over gigabytes of streaming). Not touched here: the first touch is the caller's.
template <class T>
class HugeArray {
 public:
  explicit HugeArray(size_t n)
      : bytes_((std::max<size_t>(n, 1) * sizeof(T) + kHugePage - 1) / kHugePage * kHugePage) {
    ptr_ = static_cast<T*>(std::aligned_alloc(kHugePage, bytes_));
    if (!ptr_)
      fail(kWhere, str("cannot allocate ", format_bytes(bytes_), " for the benchmark arrays"),
           "pass a smaller --numel");
    huge_ = madvise(ptr_, bytes_, MADV_HUGEPAGE) == 0;
  }
  ~HugeArray() { std::free(ptr_); }
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;
  T* data() const { return ptr_; }
  bool huge() const { return huge_; }

 private:
  size_t bytes_;
  T* ptr_ = nullptr;
  bool huge_ = false;
};

// A deterministic value in [-1, 1) for element i of stream s (splitmix64), so the arrays can
// be filled in parallel, each page first touched by a thread that later streams it.
float unit(uint64_t i, uint64_t s) {
  uint64_t x = i * 0x9e3779b97f4a7c15ull + s * 0xbf58476d1ce4e5b9ull + 1;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 40) * 0x1p-23 - 1.0);
}

void fill(float* p, float* g, float* m, float* v, uint16_t* pb, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    p[i] = unit(i, 1);
    g[i] = 1e-2f * unit(i, 2);
    m[i] = 1e-3f * unit(i, 3);
    v[i] = 1e-6f * std::fabs(unit(i, 4));
    pb[i] = 0;
  }
}

// m and v in bf16 (train.optimizer_state_dtype = "bf16"), from the same values.
void fill_bf16_states(uint16_t* m, uint16_t* v, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    m[i] = f32_to_bf16_bits(1e-3f * unit(i, 3));
    v[i] = f32_to_bf16_bits(1e-6f * std::fabs(unit(i, 4)));
  }
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Samples {
  std::vector<double> s;
  double best() const { return *std::min_element(s.begin(), s.end()); }
  double median() const { return strata::median(s); }
};

// The chosen ISA against the scalar reference on `n` elements over three steps, for the plain
// step, the fused step (scale + bf16 copy), the unfused sequence, which must equal the fused
// one, and the step with bf16 m and v. Returns the number of differing elements (all arrays).
size_t validate(AdamIsa isa, size_t n, const AdamWHyper& h, float scale) {
  std::vector<float> p(n), g(n), m(n), v(n);
  std::vector<uint16_t> pb(n), m16(n), v16(n);
  fill(p.data(), g.data(), m.data(), v.data(), pb.data(), 0, n);
  fill_bf16_states(m16.data(), v16.data(), 0, n);
  struct Copy {
    std::vector<float> p, g, m, v;
    std::vector<uint16_t> pb, m16, v16;
    AdamWTensors t(bool copy, bool bf16_states = false) {
      AdamWTensors t;
      t.param = p.data();
      t.grad = g.data();
      if (bf16_states) {
        t.m_bf16 = m16.data();
        t.v_bf16 = v16.data();
      } else {
        t.m = m.data();
        t.v = v.data();
      }
      t.n = p.size();
      if (copy) t.param_bf16 = pb.data();
      return t;
    }
  };
  const Copy start{p, g, m, v, pb, m16, v16};
  Copy ref = start, plain = start, ref_fused = start, fused = start, unfused = start,
       ref_bf16 = start, bf16 = start;
  for (int64_t step = 1; step <= 3; ++step) {
    adamw_update_isa(AdamIsa::scalar, h, step, 1.0f, ref.t(false));
    adamw_update_isa(isa, h, step, 1.0f, plain.t(false));
    adamw_update_isa(AdamIsa::scalar, h, step, scale, ref_fused.t(true));
    adamw_update_isa(isa, h, step, scale, fused.t(true));
    unfused.g = g;  // the same gradient each step; the pass scales it in place
    scale_inplace_isa(isa, unfused.g.data(), n, scale);
    adamw_update_isa(isa, h, step, 1.0f, unfused.t(false));
    convert_f32_to_bf16_isa(isa, unfused.p.data(), unfused.pb.data(), n);
    adamw_update_isa(AdamIsa::scalar, h, step, 1.0f, ref_bf16.t(false, true));
    adamw_update_isa(isa, h, step, 1.0f, bf16.t(false, true));
  }
  auto diff = [](const auto& a, const auto& b) {
    size_t d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(a[i])) != 0;
    return d;
  };
  size_t wrong = diff(ref.p, plain.p) + diff(ref.m, plain.m) + diff(ref.v, plain.v);
  for (const Copy* c : {&fused, &unfused})
    wrong += diff(ref_fused.p, c->p) + diff(ref_fused.m, c->m) + diff(ref_fused.v, c->v) +
             diff(ref_fused.pb, c->pb);
  wrong += diff(ref_bf16.p, bf16.p) + diff(ref_bf16.m16, bf16.m16) + diff(ref_bf16.v16, bf16.v16);
  return wrong;
}

// The options checked, the memory `numel` needs, and the chosen ISA validated against the
// scalar reference: no wrong kernel is timed.
struct Setup {
  AdamIsa isa;
  AdamWHyper h;
  size_t validate_n;
};

Setup checked_setup(const AdamBenchOptions& o) {
  if (o.numel == 0) fail(kWhere, "--numel must be > 0");
  if (o.repeats < 1) fail(kWhere, str("--repeats must be >= 1: ", o.repeats));
  if (o.threads < 0) fail(kWhere, str("--threads must be >= 0: ", o.threads));
  Setup s;
  s.isa = o.isa == "auto" ? adamw_active_isa() : adamw_choose_isa(o.isa, cpu_features());
  // θ g m v in f32, the bf16 copy, and m v in bf16
  const uint64_t state_bytes = uint64_t(o.numel) * 22;
  if (state_bytes + (uint64_t{1} << 30) > available_memory_bytes())
    fail(kWhere,
         str("--numel ", o.numel, " needs ", format_bytes(state_bytes), " but only ",
             format_bytes(available_memory_bytes()), " is available"),
         "pass a smaller --numel");
  s.h.lr = 1e-3f;
  s.h.weight_decay = 0.01f;
  s.validate_n = std::min(o.validate_numel, o.numel);
  const size_t wrong = validate(s.isa, s.validate_n, s.h, kFusedScale);
  if (wrong != 0)
    fail(kWhere, str(wrong, " elements of the ", adam_isa_name(s.isa),
                     " path differ from the scalar reference on ", s.validate_n,
                     " elements; not timing a wrong kernel"));
  return s;
}

// The timed arrays, filled in parallel (each page first touched by a thread that later streams
// it), and the step's and the fused step's views of them.
struct Arrays {
  explicit Arrays(size_t n) : p(n), g(n), m(n), v(n), pb(n), m16(n), v16(n) {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, kAdamWGrainElems),
                      [&](const tbb::blocked_range<size_t>& r) {
                        fill(p.data(), g.data(), m.data(), v.data(), pb.data(), r.begin(), r.end());
                        fill_bf16_states(m16.data(), v16.data(), r.begin(), r.end());
                      });
    step.param = p.data();
    step.grad = g.data();
    step.m = m.data();
    step.v = v.data();
    step.n = n;
    fused = step;
    fused.param_bf16 = pb.data();
    bf16_states = step;
    bf16_states.m = bf16_states.v = nullptr;
    bf16_states.m_bf16 = m16.data();
    bf16_states.v_bf16 = v16.data();
  }
  bool huge() const { return p.huge() && g.huge() && m.huge() && v.huge(); }

  HugeArray<float> p, g, m, v;
  HugeArray<uint16_t> pb, m16, v16;
  AdamWTensors step, fused, bf16_states;  // bf16_states: θ and g shared with step
};

}  // namespace

double measure_adam_gbps(const AdamBenchOptions& o) {
  std::optional<tbb::global_control> limit;
  if (o.threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, o.threads);
  const Setup setup = checked_setup(o);
  Arrays a(o.numel);
  int64_t step = 0;
  const AdamWTensors& t_args = o.bf16_states ? a.bf16_states : a.step;
  auto run_step = [&] { adamw_update_isa(setup.isa, setup.h, ++step, 1.0f, t_args); };
  run_step();  // untimed
  Samples t;
  for (int r = 0; r < o.repeats; ++r) t.s.push_back(seconds(run_step));
  return double(o.numel) / t.best() * (o.bf16_states ? kBytesBf16States : kBytesStep) / 1e9;
}

nlohmann::json run_adam_bench(const AdamBenchOptions& o) {
  std::optional<tbb::global_control> limit;
  if (o.threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, o.threads);
  const Setup setup = checked_setup(o);
  const AdamIsa isa = setup.isa;
  const AdamWHyper& h = setup.h;
  const size_t n = o.numel;
  const float fused_scale = kFusedScale;
  Arrays a(n);
  AdamWTensors& step_t = a.step;
  AdamWTensors& fused_t = a.fused;

  int64_t step = 0;
  float pass_scale = 0.5f;  // the unfused scaling pass alternates ·0.5 and ·2: g comes back exact
  auto run_bound = [&] { stream_bound_isa(isa, step_t); };
  auto run_bound_fused = [&] { stream_bound_isa(isa, fused_t); };
  auto run_step = [&] { adamw_update_isa(isa, h, ++step, 1.0f, step_t); };
  auto run_fused = [&] { adamw_update_isa(isa, h, ++step, fused_scale, fused_t); };
  auto run_bf16_states = [&] { adamw_update_isa(isa, h, ++step, 1.0f, a.bf16_states); };
  auto run_unfused = [&] {
    scale_inplace_isa(isa, a.g.data(), n, pass_scale);
    adamw_update_isa(isa, h, ++step, 1.0f, step_t);
    convert_f32_to_bf16_isa(isa, a.p.data(), a.pb.data(), n);
    pass_scale = pass_scale == 0.5f ? 2.0f : 0.5f;
  };

  // Warm-up: one untimed call of each (the bound twice: it xors θ, m, v with g, and a second
  // pass restores them, so the steps always see real values).
  run_bound();
  run_bound();
  run_bound_fused();
  run_bound_fused();
  run_step();
  run_fused();
  run_unfused();
  run_unfused();
  run_bf16_states();

  Samples bound, bound_fused, t_step, t_fused, t_unfused, t_bf16_states;
  for (int r = 0; r < o.repeats; ++r) {
    bound.s.push_back(seconds(run_bound));
    run_bound();  // untimed: restores θ, m, v
    t_step.s.push_back(seconds(run_step));
    t_fused.s.push_back(seconds(run_fused));
    t_unfused.s.push_back(seconds(run_unfused));
    t_bf16_states.s.push_back(seconds(run_bf16_states));
    bound_fused.s.push_back(seconds(run_bound_fused));
    run_bound_fused();
  }
  if (o.repeats % 2) run_unfused();  // leave g as it was (even number of scaling passes)

  const double dn = static_cast<double>(n);
  auto rate = [&](const Samples& s) { return dn / s.best(); };
  const double pps = rate(t_step), pps_fused = rate(t_fused), pps_unfused = rate(t_unfused);
  const double pps_bf16_states = rate(t_bf16_states);
  const double pps_bound = rate(bound), pps_bound_fused = rate(bound_fused);
  auto med = [&](const Samples& s) { return dn / s.median(); };

  nlohmann::json j;
  j["bench"] = "adam";
  j["numel"] = n;
  j["isa"] = std::string(adam_isa_name(isa));
  j["threads"] = adamw_threads();
  j["repeats"] = o.repeats;
  j["statistic"] = "best of repeats (minimum time); median in \"median\"";
  j["grain_elems"] = kAdamWGrainElems;
  j["huge_pages"] = a.huge();
  j["cpu"] = cpu_features().model;
  j["validated_numel"] = setup.validate_n;
  j["wrong"] = 0;  // checked_setup throws otherwise
  j["hyper"] = {{"lr", h.lr},
                {"beta1", h.beta1},
                {"beta2", h.beta2},
                {"eps", h.eps},
                {"weight_decay", h.weight_decay},
                {"grad_scale", fused_scale}};
  j["bytes_per_param"] = {{"step", kBytesStep},
                          {"fused", kBytesFused},
                          {"unfused", kBytesUnfused},
                          {"bf16_states", kBytesBf16States}};
  j["params_per_s"] = pps;
  j["params_per_s_fused"] = pps_fused;
  j["params_per_s_unfused"] = pps_unfused;
  j["params_per_s_bf16_states"] = pps_bf16_states;
  j["bound_params_per_s"] = pps_bound;
  j["bound_fused_params_per_s"] = pps_bound_fused;
  j["gbps"] = pps * kBytesStep / 1e9;
  j["gbps_fused"] = pps_fused * kBytesFused / 1e9;
  j["gbps_unfused"] = pps_unfused * kBytesUnfused / 1e9;
  j["gbps_bf16_states"] = pps_bf16_states * kBytesBf16States / 1e9;
  j["gbps_bound"] = pps_bound * kBytesStep / 1e9;
  j["ratio_to_bound"] = pps / pps_bound;
  j["ratio_fused_to_unfused"] = pps_fused / pps_unfused;
  j["ratio_fused_to_bound_fused"] = pps_fused / pps_bound_fused;
  // The same ratios from samples taken side by side in one repetition (median over the
  // repetitions): robust when the machine's bandwidth shifts between repetitions, as it does
  // on a shared host, and a best-of catches a fast moment for one kernel but not the other.
  auto paired = [](const Samples& num_time, const Samples& den_time) {
    Samples r;
    for (size_t i = 0; i < num_time.s.size(); ++i) r.s.push_back(num_time.s[i] / den_time.s[i]);
    return r.median();
  };
  j["ratio_to_bound_paired_median"] = paired(bound, t_step);
  j["ratio_fused_to_unfused_paired_median"] = paired(t_unfused, t_fused);
  j["seconds"] = {{"step", t_step.best()},
                  {"fused", t_fused.best()},
                  {"unfused", t_unfused.best()},
                  {"bf16_states", t_bf16_states.best()},
                  {"bound", bound.best()},
                  {"bound_fused", bound_fused.best()}};
  j["median"] = {{"params_per_s", med(t_step)},
                 {"params_per_s_fused", med(t_fused)},
                 {"params_per_s_unfused", med(t_unfused)},
                 {"params_per_s_bf16_states", med(t_bf16_states)},
                 {"bound_params_per_s", med(bound)},
                 {"bound_fused_params_per_s", med(bound_fused)}};
  return j;
}

}  // namespace strata
