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
// Ends every rank of the job now (MPI_Abort) when MPI is running; returns otherwise. For a rank
// that cannot go on without leaving the others blocked in a collective.
void abort_world(int code);

}  // namespace strata
