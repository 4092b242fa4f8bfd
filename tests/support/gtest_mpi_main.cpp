// tests/support/gtest_mpi_main.cpp — GoogleTest main for tests that also run under mpirun.
// A test that fails on one rank may leave the other ranks waiting in a collective it skipped;
// so when a test fails in a multi-rank run, this main reports it and ends the whole job
// (MPI_Abort) instead of letting it hang until the CTest timeout.
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/comm_registry.h"

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

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new AbortOnFailure);
  return RUN_ALL_TESTS();
}
