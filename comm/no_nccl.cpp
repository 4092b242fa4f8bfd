// comm/no_nccl.cpp — the stub compiled when strata is built without NCCL (or without CUDA).
#include "core/error.h"
#include "comm/comm_nccl.h"

namespace strata {

bool nccl_built() { return false; }
void nccl_abort_all() noexcept {}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int) {
  fail("comm::nccl", "this strata was not built with NCCL",
       "install the CUDA toolkit with NCCL (nccl.h and libnccl) and rebuild, or run on the CPU "
       "device with the MPI communicator");
}

}  // namespace strata
