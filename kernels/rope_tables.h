// kernels/rope_tables.h — the rotary embedding's inverse frequencies and cos/sin tables, computed
// once on the host as Hugging Face transformers 5 computes them; the rope ops (kernels/ops.h)
// only read the tables.
//
// inv_freq follows modeling_rope_utils.py (rope types "default", "linear", "llama3") operation by
// operation in float32, the precision transformers computes it in; the tables follow
// LlamaRotaryEmbedding.forward: angle = float32(t) · inv_freq[i] rounded to float32, then its cos
// and sin rounded to float32. Types whose attention_scaling is not 1 (yarn, longrope) or that
// depend on the sequence length (dynamic) are not here: the config readers refuse them.
#pragma once

#include <vector>

namespace strata {

// transformers' rope_type: "default" (plain rotary), "linear", "llama3".
enum class RopeType { plain, linear, llama3 };

inline const char* rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::plain: return "default";
    case RopeType::linear: return "linear";
    case RopeType::llama3: return "llama3";
  }
  return "?";
}

struct RopeParams {
  RopeType type = RopeType::plain;
  float theta = 10000.0f;            // rope_theta (transformers computes with it as float32)
  double factor = 1.0;               // linear, llama3
  double low_freq_factor = 1.0;      // llama3
  double high_freq_factor = 4.0;     // llama3; > low_freq_factor
  int original_max_position = 8192;  // llama3: original_max_position_embeddings
};

// inv_freq (D/2) for an even head dim D > 0; throws Error on bad parameters.
//   default: inv_freq[i] = 1 / theta^(2i/D)
//   linear:  inv_freq[i] / factor
//   llama3:  with wavelen = 2π / inv_freq[i], O = original_max_position,
//            wavelen < O / high_freq_factor: unchanged; wavelen > O / low_freq_factor: / factor;
//            between: (1 − s) · inv_freq / factor + s · inv_freq,
//            s = (O / wavelen − low_freq_factor) / (high_freq_factor − low_freq_factor).
// Each step is the float32 operation transformers performs (2π / x is its x.reciprocal() · 2π,
// Python scalars enter as float32), so the result is bit-identical to transformers' wherever
// torch's float32 pow is correctly rounded; here pow is (double pow rounded once), which torch's
// SLEEF pow can miss by 1-2 ulp for some (theta, D) (tools/make_rope_golden.py measures it).
std::vector<float> rope_inv_freq(const RopeParams& params, int D);

// cos and sin (T, D/2) each, row t for position t: float(cos(double(float(t) · inv_freq[i]))).
struct RopeTables {
  int T = 0;
  int half = 0;  // D/2
  std::vector<float> cos, sin;
};
RopeTables rope_tables(const std::vector<float>& inv_freq, int T);

}  // namespace strata
