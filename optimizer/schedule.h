// optimizer/schedule.h — learning-rate schedules and the global-norm clipping coefficient.
//
// Steps are 0-based here. Warmup is linear: lr · (s + 1) / warmup for s < warmup. After it,
// `constant` keeps lr; `cosine` decays from lr to lr · min_ratio along half a cosine, reaching
// the floor at the last step. Clipping follows torch.nn.utils.clip_grad_norm_: the gradient is
// multiplied by min(1, max_norm / (norm + 1e-6)); max_norm = 0 turns clipping off.
#pragma once

#include <cstdint>

namespace strata {

enum class LrShape { constant, cosine };

struct LrSchedule {
  LrShape shape = LrShape::cosine;
  float lr = 1e-3f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  float min_ratio = 0.1f;

  float at(int64_t step) const;
};

float clip_coefficient(double grad_norm, float max_norm);

}  // namespace strata
