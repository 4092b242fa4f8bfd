// tests/support/gtest_main.cpp — GoogleTest main of the single-process test binaries: GoogleTest's
// own, except that a run in which every selected test skipped exits 77 with the reasons, and one
// that selected no test fails (tests/support/skip_status.h).
#include <gtest/gtest.h>

#include "tests/support/skip_status.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return strata::test::exit_status(RUN_ALL_TESTS(), argv[0]);
}
