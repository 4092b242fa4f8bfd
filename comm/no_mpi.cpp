// comm/no_mpi.cpp — the stub compiled when strata is built without MPI.
#include "core/error.h"
#include "comm/comm_mpi.h"

namespace strata {

std::unique_ptr<Communicator> make_mpi_world() {
  fail("comm::mpi", "this strata was not built with MPI, but it was launched by an MPI launcher",
       "install libopenmpi-dev openmpi-bin and rebuild, or run without mpirun");
}

}  // namespace strata

namespace strata {
bool mpi_built() { return false; }
void mpi_abort_if_running(int) {}
bool mpi_running() { return false; }
}  // namespace strata
