// optimizer/adamw_stream.cpp — adamw_update_on_stream: one entry point for states resident on
// either device. The call validates, computes the step constants once on the host (the same
// function adamw_update uses), then launches the CUDA kernel on a CUDA stream or enqueues the
// CPU update as a host task on a CPU stream. Nothing here touches an element.
#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device.h"
#include "optimizer/adamw.h"
#include "optimizer/adamw_cuda.h"
#include "optimizer/adamw_def.h"

namespace strata {
namespace {

// The same rules as adamw_update's own check (optimizer/adamw.cpp), at the call.
void check_tensors(const AdamWTensors& t) {
  constexpr const char* kWhere = "optimizer::adamw_update_on_stream";
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

}  // namespace

void adamw_update_on_stream(Stream& stream, const AdamWHyper& hyper, int64_t step,
                            float grad_scale, const AdamWTensors& t,
                            std::optional<AdamIsa> cpu_isa) {
  const AdamWStepConsts c = adamw_step_constants(hyper, step, grad_scale);  // validates
  if (t.n == 0) return;
  check_tensors(t);
  if (stream.device().kind() == DeviceKind::cuda) {
    adamw_cuda_launch(cuda::native_stream(stream), c, t);
    return;
  }
  const AdamWTensors copy = t;
  stream.host_task("adamw", [hyper, step, grad_scale, copy, cpu_isa] {
    if (cpu_isa) adamw_update_isa(*cpu_isa, hyper, step, grad_scale, copy);
    else adamw_update(hyper, step, grad_scale, copy);
  });
}

}  // namespace strata
