// kernels/cuda/cuda_backend.h — the plain C++ entry points of the CUDA backend. Implemented by
// the CUDA sources when the backend is built, by no_cuda.cpp otherwise (which reports
// "not built with CUDA" at run time). No CUDA header is included here.
#pragma once

#include <memory>
#include <string>

#include "kernels/device.h"

namespace strata::cuda {

bool built();
int device_count();
std::string describe();
std::unique_ptr<Device> make_device(const DeviceOptions& options);

}  // namespace strata::cuda
