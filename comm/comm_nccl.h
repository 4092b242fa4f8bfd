// comm/comm_nccl.h — the NCCL communicator's entry point (comm_nccl.cpp when NCCL and CUDA are
// built, no_nccl.cpp otherwise). Plain C++: no CUDA or NCCL header here.
//
// make_nccl_communicator is collective over `bootstrap` (the MPI world, a split of it, or Solo):
// rank 0 creates the ncclUniqueId, bootstrap.broadcast carries its bytes to every rank (on a
// CPU stream, so MPI moves host memory), and each rank joins with ncclCommInitRank as
// bootstrap.rank() of bootstrap.size() on CUDA device `cuda_device`. The result moves CUDA
// buffers: each operation is enqueued on the communicator's own CUDA stream, ordered after the
// caller's stream by an event and the caller's stream after it by another — never by host
// synchronization. Host buffers (pinned or not) are staged through device memory.
// Example (one GPU per rank):
//   auto world = make_world_communicator();                    // MPI under mpirun
//   auto nccl = make_nccl_communicator(*world, local_rank);    // every rank calls it
//   nccl->all_reduce(*compute, grads, n, CommType::f32, ReduceOp::sum);
#pragma once

#include <memory>

#include "comm/comm.h"

namespace strata {

bool nccl_built();
// Aborts every NCCL communicator of the process (ncclCommAbort), for ending the job at once; the
// communicators are unusable afterwards. A no-op without NCCL.
void nccl_abort_all() noexcept;
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device);

}  // namespace strata
