// comm/comm_registry.cpp — picks Solo or MPI for the world communicator, and ends the whole
// job when one rank cannot go on (NCCL communicators aborted first, then MPI_Abort).
#include "comm/comm_registry.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/watchdog.h"
#include "comm/comm_mpi.h"
#include "comm/comm_nccl.h"

namespace strata {
namespace {

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* v : names)
    if (const char* e = std::getenv(v)) return std::atoi(e);
  return fallback;
}

constexpr std::chrono::seconds kEndBound{30};

// The watchdog's handler: the report, with this rank, then the end of every rank.
[[noreturn]] void end_job_on_timeout(const std::string& report) {
  std::fprintf(stderr, "strata: rank %d of %d: %s\n", world_rank_hint(), world_size_hint(),
               report.c_str());
  std::fflush(stderr);
  abort_world(3);
  std::_Exit(3);  // not launched by MPI: this process is the job, ended with the same code
}

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

int world_rank_hint() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, 0); }
int world_size_hint() { return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, 1); }

void abort_world(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  // The way out is bounded too: ncclCommAbort can block on a communicator whose kernels never
  // end, and MPI_Abort on a launcher that is gone. Should this call still be inside them after
  // kEndBound, a thread ends the process with `code` (MPI_Abort ends the others, or their own
  // watchdogs do).
  static std::atomic<bool> ending{false};
  ending = true;
  try {
    std::thread([code] {
      std::this_thread::sleep_for(kEndBound);
      if (!ending) return;
      std::fprintf(stderr, "strata: rank %d: ncclCommAbort and MPI_Abort did not end the job "
                   "within %lld s; ending this process\n", world_rank_hint(),
                   static_cast<long long>(kEndBound.count()));
      std::fflush(stderr);
      std::_Exit(code);
    }).detach();
  } catch (const std::exception&) {  // no thread to be had: end the job without the bound
  }
  nccl_abort_all();
  mpi_abort_if_running(code);
  ending = false;  // not under MPI: the caller goes on (and ends this process itself)
}

bool world_has_peers() { return launched_by_mpi() && world_size_hint() > 1 && mpi_running(); }

std::unique_ptr<Communicator> make_world_communicator() {
  watchdog_set_handler(&end_job_on_timeout);
  if (launched_by_mpi()) return make_mpi_world();
  return make_solo_communicator();
}

}  // namespace strata
