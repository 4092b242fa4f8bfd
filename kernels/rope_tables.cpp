// kernels/rope_tables.cpp — transformers' rotary frequencies and the cos/sin tables (see
// rope_tables.h). Every float expression below is one float32 operation of transformers 5's
// modeling_rope_utils.py / modeling_llama.py, in the same order; this file is compiled with
// -ffp-contract=off so that no two of them fuse. It does not apply rotations (kernels do).
#include "kernels/rope_tables.h"

#include <cmath>

#include "core/error.h"

namespace strata {
namespace {

constexpr const char* kWhere = "rope::inv_freq";

// compute_default_rope_parameters: 1.0 / (base ** (torch.arange(0, D, 2, dtype=float32) / D)).
// `base ** t` casts the Python float base to float32; torch's float32 pow is replaced by the
// correctly rounded one (double pow, one rounding).
std::vector<float> default_inv_freq(float theta, int D) {
  std::vector<float> inv(size_t(D / 2));
  for (int i = 0; i < D / 2; ++i) {
    const float exponent = float(2 * i) / float(D);
    const float power = float(std::pow(double(theta), double(exponent)));
    inv[size_t(i)] = 1.0f / power;
  }
  return inv;
}

// _compute_llama3_parameters, after the default inv_freq. Python floats (factor, the
// thresholds) enter torch ops as float32; old_context_len / low_freq_factor and
// high_freq_factor − low_freq_factor are Python (double) arithmetic first.
void llama3_scale(std::vector<float>& inv, const RopeParams& p) {
  const double old_context_len = p.original_max_position;
  const float low_freq_wavelen = float(old_context_len / p.low_freq_factor);
  const float high_freq_wavelen = float(old_context_len / p.high_freq_factor);
  const float two_pi = float(2.0 * M_PI);
  const float factor = float(p.factor);
  const float low = float(p.low_freq_factor);
  const float span = float(p.high_freq_factor - p.low_freq_factor);
  const float old = float(old_context_len);
  for (float& f : inv) {
    const float wavelen = (1.0f / f) * two_pi;  // 2 * math.pi / inv_freq
    const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const float smooth = ((1.0f / wavelen) * old - low) / span;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : scaled;
  }
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeParams& p, int D) {
  if (D <= 0 || D % 2 != 0) fail(kWhere, str("head dim D=", D, " must be even and positive"));
  if (!(p.theta > 0) || !std::isfinite(p.theta))
    fail(kWhere, str("rope theta ", p.theta, " must be a positive number"));
  const bool scaled = p.type != RopeType::plain;
  if (scaled && (!(p.factor > 0) || !std::isfinite(p.factor)))
    fail(kWhere, str("rope factor ", p.factor, " must be a positive number"));
  if (p.type == RopeType::llama3) {
    if (!(p.low_freq_factor > 0) || !(p.high_freq_factor > p.low_freq_factor) ||
        !std::isfinite(p.high_freq_factor))
      fail(kWhere, str("llama3 rope: need 0 < low_freq_factor < high_freq_factor, got ",
                       p.low_freq_factor, " and ", p.high_freq_factor));
    if (p.original_max_position < 1)
      fail(kWhere, str("llama3 rope: original_max_position ", p.original_max_position,
                       " must be positive"));
  }
  std::vector<float> inv = default_inv_freq(p.theta, D);
  switch (p.type) {
    case RopeType::plain: break;
    case RopeType::linear:
      for (float& f : inv) f /= float(p.factor);  // inv_freq /= factor
      break;
    case RopeType::llama3: llama3_scale(inv, p); break;
  }
  return inv;
}

RopeTables rope_tables(const std::vector<float>& inv_freq, int T) {
  if (T < 0) fail("rope::tables", str("negative sequence length T=", T));
  RopeTables tables;
  tables.T = T;
  tables.half = int(inv_freq.size());
  tables.cos.resize(size_t(T) * inv_freq.size());
  tables.sin.resize(tables.cos.size());
  for (int t = 0; t < T; ++t)
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      // position_ids.float() * inv_freq: one float32 product, then cos / sin rounded to float32
      // (torch's float32 cos/sin; the double ones here are the correctly rounded values).
      const float angle = float(t) * inv_freq[i];
      tables.cos[size_t(t) * inv_freq.size() + i] = float(std::cos(double(angle)));
      tables.sin[size_t(t) * inv_freq.size() + i] = float(std::sin(double(angle)));
    }
  return tables;
}

}  // namespace strata
