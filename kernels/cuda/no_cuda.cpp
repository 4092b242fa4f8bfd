// kernels/cuda/no_cuda.cpp — the stub compiled when strata is built without the CUDA backend.
#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"

namespace strata::cuda {

bool built() { return false; }
int device_count() { return 0; }
std::string describe() { return "not built with CUDA"; }

std::unique_ptr<Device> make_device(const DeviceOptions&) {
  fail("cuda::make_device", "this strata was not built with CUDA",
       "install the CUDA toolkit (nvcc) and rebuild with -DSTRATA_CUDA=AUTO or ON, or use "
       "train.device = cpu");
}

}  // namespace strata::cuda
