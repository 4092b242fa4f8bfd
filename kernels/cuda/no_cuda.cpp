// kernels/cuda/no_cuda.cpp — the stub compiled when strata is built without the CUDA backend.
#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"

namespace strata::cuda {
namespace {

[[noreturn]] void not_built(const char* where) {
  fail(where, "this strata was not built with CUDA",
       "install the CUDA toolkit (nvcc) and rebuild with -DSTRATA_CUDA=AUTO or ON, or use "
       "train.device = cpu");
}

}  // namespace

bool built() { return false; }
int device_count() { return 0; }
std::string describe() { return "not built with CUDA"; }

std::unique_ptr<Device> make_device(const DeviceOptions&) { not_built("cuda::make_device"); }
void* native_stream(Stream&) { not_built("cuda::native_stream"); }
int gemm_bf16_candidates(Stream&, uint16_t*, const uint16_t*, const uint16_t*, int, int, int) {
  not_built("cuda::gemm_bf16_candidates");
}
void gemm_bf16(Stream&, uint16_t*, const uint16_t*, const uint16_t*, int, int, int, int) {
  not_built("cuda::gemm_bf16");
}

}  // namespace strata::cuda
