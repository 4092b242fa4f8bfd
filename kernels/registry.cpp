// kernels/registry.cpp — makes a Device of the asked kind. The only place in kernels/ that
// knows which backends exist; CMake links the real CUDA backend or its stub.
#include "core/error.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device.h"

namespace strata {

std::unique_ptr<Device> make_device(DeviceKind kind, const DeviceOptions& options) {
  switch (kind) {
    case DeviceKind::cpu: return make_cpu_device(options);
    case DeviceKind::cuda: return cuda::make_device(options);
  }
  fail("kernels::make_device", "unknown device kind");
}

bool cuda_built() { return cuda::built(); }
int cuda_device_count() { return cuda::device_count(); }
std::string cuda_describe() { return cuda::describe(); }

}  // namespace strata
