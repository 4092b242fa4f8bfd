// comm/comm_mpi.h — the MPI backend's entry point (implemented by comm_mpi.cpp when MPI is
// built, by no_mpi.cpp otherwise). Plain C++: no MPI header here.
#pragma once

#include <memory>

#include "comm/comm.h"

namespace strata {

std::unique_ptr<Communicator> make_mpi_world();
void mpi_abort_if_running(int code);
bool mpi_running();  // initialized and not finalized  // MPI_Abort(MPI_COMM_WORLD) when initialized and not finalized

}  // namespace strata
