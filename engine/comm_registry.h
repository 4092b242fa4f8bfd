// engine/comm_registry.h — the communicator of this process: MPI when launched by an MPI
// launcher (mpirun sets OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK) and built with MPI, Solo
// otherwise. The only place that knows which communication backends were built.
#pragma once

#include <memory>

#include "engine/comm.h"

namespace strata {

bool launched_by_mpi();
bool mpi_built();
// World communicator; calls MPI_Init_thread on first use under a launcher (finalized at exit).
std::unique_ptr<Communicator> make_world_communicator();

}  // namespace strata
