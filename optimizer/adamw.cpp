// optimizer/adamw.cpp — AdamW's dispatcher: validates a call, computes its per-step constants
// once, picks the ISA (once per process, logged; STRATA_ISA forces one) and splits the elements
// over oneTBB. The arithmetic is in adamw_def.h and the loops in adamw_{scalar,avx2,avx512}.cpp;
// nothing here touches an element. This file is built for the baseline target, so it can run
// the CPU check before any ISA-specific code.
#include "optimizer/adamw.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/cpu.h"
#include "core/error.h"
#include "core/log.h"
#include "optimizer/adamw_def.h"
#include "optimizer/adamw_isa.h"

namespace strata {
namespace {

constexpr AdamIsa kWidestFirst[] = {AdamIsa::avx512, AdamIsa::avx2, AdamIsa::scalar};

// base^e by squaring: a fixed sequence of double multiplies, the same on every host and device
// (std::pow is only required to be close).
double pow_int(double base, int64_t e) {
  double result = 1.0;
  while (e > 0) {
    if (e & 1) result *= base;
    base *= base;
    e >>= 1;
  }
  return result;
}

const AdamWKernels& table(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::avx2:
      return kAdamWKernelsAvx2;
    case AdamIsa::avx512:
      return kAdamWKernelsAvx512;
    case AdamIsa::scalar:
      break;
  }
  return kAdamWKernelsScalar;
}

bool cpu_runs(AdamIsa isa, const CpuFeatures& cpu) {
  switch (isa) {
    case AdamIsa::avx2:
      return cpu.has_avx2_fma();
    case AdamIsa::avx512:
      return cpu.has_avx512();
    case AdamIsa::scalar:
      break;
  }
  return true;
}

const char* isa_needs(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::avx2:
      return "avx2 fma";
    case AdamIsa::avx512:
      return "avx512f avx512bw avx512vl avx512dq";
    case AdamIsa::scalar:
      break;
  }
  return "nothing";
}

// Calls f(begin, end) over [0, n) in pieces cut at multiples of kAdamWBlockElems; oneTBB splits
// a range only while it is longer than kAdamWGrainElems, so a piece holds more than half of that.
// A call of at most one grain runs on the calling thread.
template <class F>
void parallel_over(size_t n, const F& f) {
  if (n <= kAdamWGrainElems) {
    f(size_t{0}, n);
    return;
  }
  const size_t blocks = (n + kAdamWBlockElems - 1) / kAdamWBlockElems;
  const size_t grain_blocks = kAdamWGrainElems / kAdamWBlockElems;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, blocks, grain_blocks),
                    [&](const tbb::blocked_range<size_t>& r) {
                      f(r.begin() * kAdamWBlockElems, std::min(r.end() * kAdamWBlockElems, n));
                    });
}

}  // namespace

void adamw_check_tensors(const AdamWTensors& t, const char* kWhere) {
  if (!t.param) fail(kWhere, str("param is null (n = ", t.n, ")"));
  if ((t.grad != nullptr) == (t.grad_bf16 != nullptr))
    fail(kWhere,
         t.grad ? "both grad and grad_bf16 are given" : "neither grad nor grad_bf16 is given",
         "give exactly one gradient: grad (f32) or grad_bf16");
  const bool f32_state = t.m && t.v && !t.m_bf16 && !t.v_bf16;
  const bool bf16_state = !t.m && !t.v && t.m_bf16 && t.v_bf16;
  if (!f32_state && !bf16_state)
    fail(kWhere,
         str("optimizer state is inconsistent: m ", t.m ? "set" : "null", ", v ",
             t.v ? "set" : "null", ", m_bf16 ", t.m_bf16 ? "set" : "null", ", v_bf16 ",
             t.v_bf16 ? "set" : "null"),
         "give m and v (f32 state) or m_bf16 and v_bf16 (bf16 state), not a mix");
}

std::string_view adam_isa_name(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::scalar:
      return "scalar";
    case AdamIsa::avx2:
      return "avx2";
    case AdamIsa::avx512:
      return "avx512";
  }
  return "?";
}

AdamIsa parse_adam_isa(std::string_view name) {
  for (AdamIsa isa : kWidestFirst)
    if (name == adam_isa_name(isa)) return isa;
  fail("optimizer::parse_adam_isa", str("unknown AdamW ISA '", name, "'"),
       "use one of: scalar, avx2, avx512 (or auto for the widest this CPU runs)");
}

AdamWStepConsts adamw_step_constants(const AdamWHyper& h, int64_t step, float grad_scale) {
  constexpr const char* kWhere = "optimizer::adamw_step_constants";
  if (step < 1) fail(kWhere, str("step must be >= 1 (1-based): step = ", step));
  if (!(h.lr >= 0.0f)) fail(kWhere, str("invalid learning rate: lr = ", h.lr), "lr must be >= 0");
  if (!(h.eps >= 0.0f)) fail(kWhere, str("invalid eps: eps = ", h.eps), "eps must be >= 0");
  if (!(h.beta1 >= 0.0f && h.beta1 < 1.0f) || !(h.beta2 >= 0.0f && h.beta2 < 1.0f))
    fail(kWhere, str("invalid betas: beta1 = ", h.beta1, ", beta2 = ", h.beta2),
         "each beta must be in [0, 1)");
  if (!(h.weight_decay >= 0.0f))
    fail(kWhere, str("invalid weight decay: weight_decay = ", h.weight_decay),
         "weight_decay must be >= 0");
  if (!std::isfinite(grad_scale))
    fail(kWhere, str("gradient scale is not finite: grad_scale = ", grad_scale),
         "skip the step when the unscaled gradients overflow (dynamic loss scaling)");

  const double lr = h.lr, beta1 = h.beta1, beta2 = h.beta2;
  const double bias1 = 1.0 - pow_int(beta1, step);  // 1 − β1^t, > 0 for t ≥ 1 and β1 < 1
  const double bias2 = 1.0 - pow_int(beta2, step);
  AdamWStepConsts c;
  c.grad_scale = grad_scale;
  c.decay = static_cast<float>(1.0 - lr * double(h.weight_decay));
  c.beta1 = h.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = h.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.neg_step_size = static_cast<float>(-(lr / bias1));
  c.rsqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  c.eps = h.eps;
  return c;
}

AdamIsa adamw_choose_isa(std::string_view forced, const CpuFeatures& cpu) {
  constexpr const char* kWhere = "optimizer::adamw_choose_isa";
  if (forced.empty() || forced == "auto") {
    for (AdamIsa isa : kWidestFirst)
      if (table(isa).built && cpu_runs(isa, cpu)) return isa;
    return AdamIsa::scalar;
  }
  const AdamIsa isa = parse_adam_isa(forced);
  if (!table(isa).built)
    fail(kWhere,
         str("AdamW ISA ", forced, " was requested but this build has no ", forced,
             " kernels (they are built only for x86-64)"),
         "unset STRATA_ISA (or pass --isa auto) to use the widest ISA this build runs");
  if (!cpu_runs(isa, cpu))
    fail(kWhere,
         str("AdamW ISA ", forced, " was requested but this CPU cannot run it: it needs ",
             isa_needs(isa), "; the CPU has: ", cpu.describe()),
         str("unset STRATA_ISA (or pass --isa auto) to use the widest ISA this CPU runs (",
             adam_isa_name(adamw_choose_isa("", cpu)), ")"));
  return isa;
}

bool adamw_isa_available(AdamIsa isa) { return table(isa).built && cpu_runs(isa, cpu_features()); }

const AdamWKernels& adamw_kernels(AdamIsa isa) {
  if (!table(isa).built || !cpu_runs(isa, cpu_features()))
    adamw_choose_isa(adam_isa_name(isa), cpu_features());  // throws, saying why
  return table(isa);
}

AdamIsa adamw_active_isa() {
  static const AdamIsa active = [] {
    const char* env = std::getenv("STRATA_ISA");
    const std::string forced = env ? env : "";
    const AdamIsa isa = adamw_choose_isa(forced, cpu_features());
    log_info(
        "optimizer", "AdamW kernels: ", adam_isa_name(isa),
        forced.empty() || forced == "auto" ? " (widest this CPU runs)" : " (forced by STRATA_ISA)",
        "; CPU: ", cpu_features().describe(), "; oneTBB threads ", adamw_threads(), ", grain ",
        kAdamWGrainElems, " elements");
    return isa;
  }();
  return active;
}

int adamw_threads() {
  const size_t limit =
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  const size_t arena = static_cast<size_t>(tbb::this_task_arena::max_concurrency());
  return static_cast<int>(std::min(limit, arena));
}

void adamw_update_isa(AdamIsa isa, const AdamWHyper& hyper, int64_t step, float grad_scale,
                      const AdamWTensors& t) {
  const AdamWKernels& k = adamw_kernels(isa);
  const AdamWStepConsts c = adamw_step_constants(hyper, step, grad_scale);
  if (t.n == 0) return;
  adamw_check_tensors(t, "optimizer::adamw_update");
  parallel_over(t.n, [&](size_t begin, size_t end) { k.update(c, t, begin, end); });
}

void adamw_update(const AdamWHyper& hyper, int64_t step, float grad_scale, const AdamWTensors& t) {
  adamw_update_isa(adamw_active_isa(), hyper, step, grad_scale, t);
}

void scale_inplace_isa(AdamIsa isa, float* x, size_t n, float scale) {
  const AdamWKernels& k = adamw_kernels(isa);
  if (n == 0) return;
  STRATA_CHECK(x != nullptr, "optimizer::scale_inplace", "x is null, n = ", n);
  parallel_over(n, [&](size_t begin, size_t end) { k.scale(x, scale, begin, end); });
}

void convert_f32_to_bf16_isa(AdamIsa isa, const float* x, uint16_t* out, size_t n) {
  const AdamWKernels& k = adamw_kernels(isa);
  if (n == 0) return;
  STRATA_CHECK(x != nullptr && out != nullptr, "optimizer::convert_f32_to_bf16",
               "null array, n = ", n);
  parallel_over(n, [&](size_t begin, size_t end) { k.to_bf16(x, out, n, begin, end); });
}

void stream_bound_isa(AdamIsa isa, const AdamWTensors& t) {
  const AdamWKernels& k = adamw_kernels(isa);
  if (t.n == 0) return;
  STRATA_CHECK(t.param && t.grad && t.m && t.v && !t.grad_bf16 && !t.m_bf16,
               "optimizer::stream_bound", "the streaming bound takes f32 param, grad, m and v");
  parallel_over(t.n, [&](size_t begin, size_t end) { k.stream(t, begin, end); });
}

}  // namespace strata
