// kernels/cpu/cpu_device.h — the CPU device: a complete Device, not a mock.
//
// "Device memory" is ordinary 256-byte-aligned host memory counted against a hard cap
// (offload.device_mem_limit), so an over-large plan fails here exactly as it would on a GPU.
// Each Stream is one worker thread running its queue in order; Events are real completion
// points; ops run as stream tasks (on the fast oneTBB/BLAS path or the scalar reference).
// It does not model bandwidths or latencies of a real GPU.
#pragma once

#include <memory>

#include "kernels/device.h"

namespace strata {

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& options);

}  // namespace strata
