// kernels/cuda/cuda_ops.h — the CUDA device's op launchers (cuda_ops.cpp): argument checks on
// the host, then the kernels of the *.cu files and the cuBLASLt GEMMs (gemm.h).
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace strata::cuda {

// bf16_matmuls: linear_fwd / linear_bwd run their GEMMs as GemmType::f32_bf16 (bf16 operands on
// the tensor cores, f32 accumulation) instead of exact f32 on the CUDA cores.
std::unique_ptr<Ops> make_cuda_ops(bool bf16_matmuls);

}  // namespace strata::cuda
