// comm/comm_registry.h — the communicator of this process: MPI when launched by an MPI
// launcher (mpirun sets OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK) and built with MPI, Solo
// otherwise. The only place that knows which communication backends were built.
#pragma once

#include <memory>

#include "comm/comm.h"

namespace strata {

bool launched_by_mpi();
bool mpi_built();
// This process's rank and the job's size as the launcher announced them (0 and 1 without one);
// for messages written before or without a communicator.
int world_rank_hint();
int world_size_hint();
// World communicator; calls MPI_Init_thread on first use under a launcher (finalized at exit).
// Also installs the watchdog's handler (core/watchdog.h): a wait past parallel.timeout prints
// the report with this rank and ends the job through abort_world().
std::unique_ptr<Communicator> make_world_communicator();
// Ends every rank of the job now — NCCL communicators aborted first (ncclCommAbort), then
// MPI_Abort — when MPI is running; returns otherwise. For a rank that cannot go on without
// leaving the others blocked in a collective. Bounded: should ncclCommAbort or MPI_Abort not
// return within 30 s, the process ends itself (std::_Exit(code)).
void abort_world(int code);
// True when this process has peers that abort_world() would end (MPI started, more than one rank).
bool world_has_peers();

}  // namespace strata
