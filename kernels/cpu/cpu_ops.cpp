// placeholder; replaced by the CPU ops work
#include "kernels/cpu/cpu_ops.h"
#include "core/error.h"
namespace strata {
std::unique_ptr<Ops> make_cpu_ops(CpuOpsMode) { fail("cpu::ops", "not yet built"); }
}
