// kernels/cuda/cuda_backend.h — the plain C++ entry points of the CUDA backend. Implemented by
// the CUDA sources when the backend is built, by no_cuda.cpp otherwise (which reports
// "not built with CUDA" at run time). No CUDA header is included here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/device.h"

namespace strata::cuda {

bool built();
int device_count();     // 0 when not built, without a driver, or without a device
std::string describe();  // runtime, driver, the build's architectures, each device
std::unique_ptr<Device> make_device(const DeviceOptions& options);

// The cudaStream_t behind a stream of the CUDA device, for CUDA-aware files outside kernels/
// (the NCCL communicator, the device AdamW), which cast it back; also makes the stream's device
// current on the calling thread, as a launch on it needs. Error for any other stream.
void* native_stream(Stream& s);

// bf16 GEMM through cuBLASLt (bf16 inputs and output, f32 accumulation), row-major:
// out (m, n) = a (m, k) · b^T (n, k), enqueued on s. candidate 0 is the algorithm strata runs
// (cuBLASLt's first heuristic choice); 1 .. candidates-1 are the further heuristic results,
// for benchmarks that look for cuBLAS's best on the same shape.
int gemm_bf16_candidates(Stream& s, uint16_t* out, const uint16_t* a, const uint16_t* b, int m,
                         int n, int k);
void gemm_bf16(Stream& s, uint16_t* out, const uint16_t* a, const uint16_t* b, int m, int n, int k,
               int candidate = 0);

}  // namespace strata::cuda
