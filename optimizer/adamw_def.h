// optimizer/adamw_def.h — the one definition of strata's AdamW step: a fixed sequence of IEEE-754
// binary32 operations, written once as a template over the lane type. The scalar reference
// (V = float), the AVX2 kernel (V = __m256) and the AVX-512 kernel (V = __m512) instantiate this
// same template with operation sets that each round exactly once per operation, so every lane of
// every path performs the same roundings in the same order and all agree bit for bit.
// Not here: loads, stores, dtype conversions and threading (the kernels), the LR schedule and
// clipping (the trainer).
#pragma once

#include <cstdint>

#include "optimizer/adamw.h"

namespace strata {

// The formula (torch.optim.AdamW's documentation, https://pytorch.org/docs/stable/generated/
// torch.optim.AdamW.html), for step t ≥ 1, learning rate γ, weight decay λ:
//   θ ← θ − γλθ
//   m ← β1·m + (1−β1)·g            v ← β2·v + (1−β2)·g²
//   m̂ = m / (1−β1^t)               v̂ = v / (1−β2^t)
//   θ ← θ − γ · m̂ / (√v̂ + ε)
// Since √v̂ = √v / √(1−β2^t), the last line equals θ − s · m / (√v · r + ε) with
// s = γ / (1−β1^t) and r = 1 / √(1−β2^t): an exact rewriting (torch's own implementation uses
// the same split), so only the roundings differ from the formula. s and r, like every other
// per-step constant, are computed once per call in double precision and rounded once to float
// (AdamWStepConsts below); all paths receive the same floats.
//
// Per element, in binary32, with each line one correctly rounded operation:
//   (1) g  = grad · grad_scale                 mul   (the fused unscale/clip factor)
//   (2) θ  = θ · decay                         mul   decay = fl(1 − γλ); λ = 0 gives ·1, exact
//   (3) m  = fma(1−β1, g, β1·m)                mul, fma
//   (4) v  = fma((1−β2)·g, g, β2·v)            mul, mul, fma
//   (5) d  = fma(√v, r, ε)                     sqrt, fma
//   (6) θ  = fma(−s, m / d, θ)                 div, fma
// (1) is the same single multiply a separate scaling pass would do, so scaling the gradient
// first and calling with grad_scale = 1 (an exact ·1) gives bit-identical results. The sequence
// has no reassociation; the files that instantiate it build with -ffp-contract=off.
struct AdamWStepConsts {
  float grad_scale;       // g multiplier
  float decay;            // fl(1 − lr·wd)
  float beta1;            // β1
  float one_minus_beta1;  // fl(1 − β1)
  float beta2;            // β2
  float one_minus_beta2;  // fl(1 − β2)
  float neg_step_size;    // −fl(lr / (1 − β1^t))
  float rsqrt_bias2;      // fl(1 / √(1 − β2^t))
  float eps;              // ε
};

// Computes the constants in double (β^t by exponentiation by squaring — a fixed sequence of
// double multiplies, so any host or device computes the same value) and rounds each once to
// float. Validates as torch does: 0 ≤ lr, 0 ≤ eps, 0 ≤ β < 1, 0 ≤ wd, step ≥ 1, finite scale.
AdamWStepConsts adamw_step_constants(const AdamWHyper& hyper, int64_t step, float grad_scale);

// The constants broadcast to a lane type.
template <class V>
struct AdamWLaneConsts {
  V grad_scale, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, rsqrt_bias2,
      eps;
};

// Ops: using V; static V set1(float); mul(a, b); fma(a, b, c) = a·b + c rounded once;
// sqrt(a); div(a, b) — each IEEE-754 correctly rounded (round to nearest even).
template <class Ops>
AdamWLaneConsts<typename Ops::V> adamw_broadcast(const AdamWStepConsts& c) {
  return {Ops::set1(c.grad_scale),      Ops::set1(c.decay),       Ops::set1(c.beta1),
          Ops::set1(c.one_minus_beta1), Ops::set1(c.beta2),       Ops::set1(c.one_minus_beta2),
          Ops::set1(c.neg_step_size),   Ops::set1(c.rsqrt_bias2), Ops::set1(c.eps)};
}

// THE definition: steps (1)–(6) above, on one lane or one vector of lanes.
template <class Ops, class V>
inline void adamw_definition(const AdamWLaneConsts<V>& c, V grad, V& param, V& m, V& v) {
  const V g = Ops::mul(grad, c.grad_scale);                               // (1)
  param = Ops::mul(param, c.decay);                                       // (2)
  m = Ops::fma(c.one_minus_beta1, g, Ops::mul(c.beta1, m));               // (3)
  v = Ops::fma(Ops::mul(c.one_minus_beta2, g), g, Ops::mul(c.beta2, v));  // (4)
  const V denom = Ops::fma(Ops::sqrt(v), c.rsqrt_bias2, c.eps);           // (5)
  param = Ops::fma(c.neg_step_size, Ops::div(m, denom), param);           // (6)
}

}  // namespace strata
