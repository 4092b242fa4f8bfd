// engine/comm_registry.cpp — picks Solo or MPI for the world communicator.
#include "engine/comm_registry.h"

#include <cstdlib>

#include "engine/comm_mpi.h"

namespace strata {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

void abort_world(int code) { mpi_abort_if_running(code); }

std::unique_ptr<Communicator> make_world_communicator() {
  if (launched_by_mpi()) return make_mpi_world();
  return make_solo_communicator();
}

}  // namespace strata
