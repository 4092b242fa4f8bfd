// kernels/cuda/cuda_ops.h — the CUDA device's op launchers (cuda_ops.cpp): argument checks on
// the host, then the kernels of the *.cu files and the cuBLASLt GEMMs (gemm.h).
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace strata::cuda {

std::unique_ptr<Ops> make_cuda_ops();

}  // namespace strata::cuda
