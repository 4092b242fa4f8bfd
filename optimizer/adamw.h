// optimizer/adamw.h — AdamW as torch.optim.AdamW documents it (decoupled weight decay, bias
// correction, eps outside the square root), one pass over memory per element.
//
// For step t (1-based), with g = grad · grad_scale:
//   p = p − lr·wd·p;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;
//   p = p − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps)
// written once as a fixed sequence of IEEE-754 operations that every path (scalar, AVX2,
// AVX-512, CUDA) follows, so all agree bit for bit (see optimizer/adamw_def.h). This header is
// the whole interface the engine uses; the ISA is chosen once from the CPU's features.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

class Stream;

enum class AdamIsa { scalar, avx2, avx512 };
std::string_view adam_isa_name(AdamIsa isa);

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One shard's state. grad (f32) or grad_bf16 is given (exactly one); param_bf16, when not
// null, receives the updated parameter rounded to bf16 (nearest even) in the same pass.
// Arrays of n elements, any alignment, not overlapping; the call reads and writes each once.
struct AdamWTensors {
  float* param = nullptr;
  const float* grad = nullptr;
  const uint16_t* grad_bf16 = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  uint16_t* param_bf16 = nullptr;
  size_t n = 0;
  // Option: m and v kept in bf16 (rounded to nearest even after each step) — give m_bf16 and
  // v_bf16 and leave m and v null. It halves the bytes of m and v (a step touches 20 bytes per
  // parameter instead of 28) but is numerically a different optimizer: the moments lose 16 bits
  // of mantissa every step. All paths still agree bit for bit with each other, not with the
  // f32-state results. See docs/optimizer.md.
  uint16_t* m_bf16 = nullptr;
  uint16_t* v_bf16 = nullptr;
};

// Updates one shard for step `step` (1-based); the gradient is multiplied by grad_scale
// (loss-scale unscaling times the clipping coefficient) inside the same pass. Runs on the ISA
// chosen at start (STRATA_ISA=scalar|avx2|avx512 forces one), split by oneTBB.
void adamw_update(const AdamWHyper& hyper, int64_t step, float grad_scale, const AdamWTensors& t);
// The same on a given ISA (Error if this CPU or build lacks it).
void adamw_update_isa(AdamIsa isa, const AdamWHyper& hyper, int64_t step, float grad_scale,
                      const AdamWTensors& t);
// The ISA adamw_update runs on: STRATA_ISA when set (Error if unknown or not executable here),
// else the widest this CPU and build have. Chosen and logged on the first call.
AdamIsa adamw_active_isa();
// Built into this binary and executable on this CPU (cpuid + the OS saving the registers).
bool adamw_isa_available(AdamIsa isa);

// The same update enqueued on a stream, for states that live where the stream's device
// computes (optimizer/adamw_stream.cpp). On a CUDA stream it launches the device kernel
// (optimizer/adamw_cuda.cu: the same IEEE operation sequence, bit-identical to the CPU paths);
// on a CPU stream it enqueues adamw_update (or adamw_update_isa with cpu_isa) as a host task.
// The per-step constants (bias corrections included) are computed on the host, here, exactly as
// adamw_update computes them. Hyperparameters and tensors are checked at the call (Error);
// the arrays must stay alive and untouched until the stream has run the update.
void adamw_update_on_stream(Stream& stream, const AdamWHyper& hyper, int64_t step,
                            float grad_scale, const AdamWTensors& t,
                            std::optional<AdamIsa> cpu_isa = std::nullopt);
// True when this binary has the CUDA AdamW kernel.
bool adamw_cuda_built();

}  // namespace strata
