// optimizer/schedule.cpp — LrSchedule::at and clip_coefficient.
#include "optimizer/schedule.h"

#include <algorithm>
#include <cmath>

namespace strata {

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return static_cast<float>(double(lr) * double(step + 1) / double(warmup_steps));
  if (shape == LrShape::constant) return lr;
  int64_t span = total_steps - 1 - warmup_steps;
  if (span <= 0) return lr;
  double progress = std::clamp(double(step - warmup_steps) / double(span), 0.0, 1.0);
  double floor = double(lr) * min_ratio;
  return static_cast<float>(floor + (double(lr) - floor) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

float clip_coefficient(double grad_norm, float max_norm) {
  if (max_norm <= 0.0f || !std::isfinite(grad_norm)) return 1.0f;
  double c = double(max_norm) / (grad_norm + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0f;
}

}  // namespace strata
