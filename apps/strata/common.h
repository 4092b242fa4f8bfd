// apps/strata/common.h — what several subcommands share: the config options (--config, --set)
// and the communicator of this process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "comm/comm.h"
#include "engine/config.h"
#include "engine/plan.h"
#include "engine/trainer.h"

namespace strata::app {

struct ConfigArgs {
  std::string config_path;
  std::vector<std::string> sets;
  std::string init_from;
};

// Adds --config, --set (repeatable) and --init-from to a subcommand.
void add_config_options(CLI::App& cmd, ConfigArgs& args);
Config load(const ConfigArgs& args);
// The config of `strata train --resume DIR`: --config when given, else the one the checkpoint
// was written with; --set overrides on top. (--init-from is refused: the weights come from DIR.)
Config load_for_resume(const ConfigArgs& args, const std::string& resume);
// The machine a plan is for, with `ranks` ranks on it: the CPU device (its memory is RAM) or the
// CUDA device train.device names (sized by the device, or by offload.device_mem_limit on a
// machine without one).
PlanMachine plan_machine(const Config& config, int ranks);
// Solo for a single process; MPI when launched by mpirun.
std::unique_ptr<Communicator> make_world();

// One rank's failure ends the job: in a job with peers, reports `e` with this rank on stderr and
// ends every rank now (abort_world: ncclCommAbort, then MPI_Abort), so no rank waits for ever in
// a collective the failed one will never join. Call it from a catch block while the objects
// that hold streams and communicators are still alive (their destructors would wait for peers).
// Returns only when there are no peers; the caller then rethrows.
void end_job_if_peers(const std::exception& e);

// Test hooks of the command line, from the environment variable STRATA_FAULT (a comma-separated
// list of key=value): rank=R (the rank it applies to; default 0), step=S (default 1), and
// fault=hang (stop responding before step S), fault=hang_at_exit (stop responding at exit, before
// MPI_Finalize), fault=error (throw an Error before step S) or
// fault=nvme_read_error / nvme_write_error (the (skip+1)-th NVMe read / write of the rank fails
// with EIO; skip=N, default 0), fault=kill with phase=shard | manifest | rename | latest |
// prune (SIGKILL at that phase of the save of step S), fault=checkpoint_eio /
// checkpoint_enospc (the (skip+1)-th write of the rank's checkpoint file fails). Sets options.test_hooks
// (engine/test_hooks.h). Used by tests/cli/test_failures.sh; unset, it does nothing.
void apply_fault_hooks(int rank, TrainerOptions& options);

}  // namespace strata::app
