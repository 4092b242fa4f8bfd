// tests/support/gtest_mpi_main.cpp — GoogleTest main for tests that also run under mpirun.
// A test that fails on one rank may leave the other ranks waiting in a collective it skipped;
// so when a test fails in a multi-rank run, this main reports it and ends the whole job
// (MPI_Abort) instead of letting it hang until the CTest timeout. A run in which every selected
// test skipped exits 77 (tests/support/skip_status.h; mpirun passes the status on), with the
// reasons printed by rank 0.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "comm/comm_registry.h"
#include "tests/support/skip_status.h"

namespace {

class AbortOnFailure : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo& info) override {
    if (!info.result()->Failed() || !strata::launched_by_mpi()) return;
    std::fprintf(stderr, "test %s.%s failed on this rank: aborting every rank\n",
                 info.test_suite_name(), info.name());
    std::fflush(stdout);
    std::fflush(stderr);
    strata::abort_world(1);
  }
};

// Rank 0 of an MPI job (from the launcher's environment), or a plain process.
bool first_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* e = std::getenv(v)) return std::atoi(e) == 0;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new AbortOnFailure);
  return strata::test::exit_status(RUN_ALL_TESTS(), argv[0], first_rank());
}
