// kernels/cpu/cpu_ops.h — the CPU device's op launchers: each op becomes a task on the CPU
// stream that calls the fast path (kernels/cpu/fast_ops.h) or the scalar reference
// (kernels/cpu/ref_ops.h), as chosen when the device is made.
#pragma once

#include <memory>

#include "kernels/device.h"
#include "kernels/ops.h"

namespace strata {

std::unique_ptr<Ops> make_cpu_ops(CpuOpsMode mode);

}  // namespace strata
