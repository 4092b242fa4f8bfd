// tests/support/skip_status.h — the exit status of a GoogleTest binary whose tests all skipped.
// GoogleTest exits 0 when every test called GTEST_SKIP, and CTest would count that as Passed:
// a GPU test binary on a machine without a GPU would "pass" without running a line of it. The
// mains in tests/support return kSkipExitCode (77, the automake / liburing convention) instead,
// strata_test() gives every entry SKIP_RETURN_CODE 77, and CTest reports the entry as Skipped.
// The reasons (each distinct GTEST_SKIP message once) go to stdout, so `ctest -V` and
// Testing/Temporary/LastTest.log say why. A binary where some tests ran keeps GoogleTest's status;
// one where none was selected fails.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace strata::test {

inline constexpr int kSkipExitCode = 77;

namespace detail {

inline void add_skip_reasons(const testing::TestResult& r, std::vector<std::string>& out) {
  for (int k = 0; k < r.total_part_count(); ++k) {
    const testing::TestPartResult& part = r.GetTestPartResult(k);
    if (!part.skipped()) continue;
    std::string why = part.message() ? part.message() : "";
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    if (why.empty()) why = "(GTEST_SKIP without a message)";
    bool seen = false;
    for (const auto& s : out) seen = seen || s == why;
    if (!seen) out.push_back(why);
  }
}

}  // namespace detail

// gtest_status: what RUN_ALL_TESTS returned. Returns it unchanged unless it is 0 and
//  - every test selected to run was skipped: prints the reasons (when `report`, e.g. on rank 0
//    only) and returns kSkipExitCode;
//  - no test was selected (a --gtest_filter that matches nothing, say after a rename): says so
//    and returns 1, since an entry that runs nothing must not pass.
// `program` names the binary in the messages.
inline int exit_status(int gtest_status, const char* program, bool report = true) {
  const testing::UnitTest& ut = *testing::UnitTest::GetInstance();
  const int selected = ut.test_to_run_count();
  std::string name = program ? program : "test";
  if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  if (gtest_status == 0 && selected == 0) {
    if (report)
      std::printf("FAILED: %s selected no test to run (check --gtest_filter: %s)\n", name.c_str(),
                  testing::GTEST_FLAG(filter).c_str());
    return 1;
  }
  if (gtest_status != 0 || ut.skipped_test_count() < selected) return gtest_status;
  std::vector<std::string> reasons;
  detail::add_skip_reasons(ut.ad_hoc_test_result(), reasons);
  for (int i = 0; i < ut.total_test_suite_count(); ++i) {
    const testing::TestSuite& suite = *ut.GetTestSuite(i);
    detail::add_skip_reasons(suite.ad_hoc_test_result(), reasons);
    for (int j = 0; j < suite.total_test_count(); ++j)
      if (suite.GetTestInfo(j)->should_run())
        detail::add_skip_reasons(*suite.GetTestInfo(j)->result(), reasons);
  }
  if (report) {
    std::printf("SKIPPED: all %d tests of %s skipped (exit status %d, which CTest reports as "
                "Skipped), because:\n",
                selected, name.c_str(), kSkipExitCode);
    for (const auto& why : reasons) std::printf("  %s\n", why.c_str());
    std::fflush(stdout);
  }
  return kSkipExitCode;
}

}  // namespace strata::test
