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
#include "optimizer/adamw_isa.h"

namespace strata {

void adamw_update_on_stream(Stream& stream, const AdamWHyper& hyper, int64_t step,
                            float grad_scale, const AdamWTensors& t,
                            std::optional<AdamIsa> cpu_isa) {
  const AdamWStepConsts c = adamw_step_constants(hyper, step, grad_scale);  // validates
  if (t.n == 0) return;
  adamw_check_tensors(t, "optimizer::adamw_update_on_stream");
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
