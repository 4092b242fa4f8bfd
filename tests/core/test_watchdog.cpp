// core/watchdog: the report names every wait in progress (collectives first, with their
// diagnosis and the context they were issued in), and a wait that outlasts the timeout ends the
// process through the installed handler — tested in a death test, since it must not return.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#include "core/watchdog.h"

using namespace strata;

namespace {

[[noreturn]] void exit_42(const std::string& report) {
  std::fprintf(stderr, "handler: %s\n", report.c_str());
  std::fflush(stderr);
  std::_Exit(42);
}

}  // namespace

TEST(Watchdog, ContextReadsStepPhaseUnit) {
  watchdog_set_step(7);
  watchdog_set_phase("backward");
  watchdog_set_unit("block.3");
  EXPECT_EQ(watchdog_context(), "step 7, backward, unit block.3");
  watchdog_set_unit("");
  EXPECT_EQ(watchdog_context(), "step 7, backward");
  watchdog_set_step(-1);
  watchdog_set_phase("");
  EXPECT_EQ(watchdog_context(), "");
}

TEST(Watchdog, ReportListsCollectivesFirstWithTheirDiagnosis) {
  EXPECT_EQ(watchdog_report_now(0), "");  // nothing waits
  WatchedWait host("the host waits for stream 'compute'", WaitKind::host, "step 2, forward");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  WatchedWait coll("all_gather of 64 f32 on 'dp'", WaitKind::collective, "step 2, forward, unit embedding",
                   [] { return std::string("ranks that did not arrive: 1"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(watchdog_report_now(10.0), "") << "no wait is 10 s old";
  const std::string r = watchdog_report_now(0.01);
  const size_t c = r.find("collective: all_gather of 64 f32 on 'dp' (step 2, forward, unit embedding)");
  const size_t h = r.find("host: the host waits for stream 'compute' (step 2, forward)");
  ASSERT_NE(c, std::string::npos) << r;
  ASSERT_NE(h, std::string::npos) << r;
  EXPECT_LT(c, h) << "the collective is the likely cause and is reported first:\n" << r;
  EXPECT_NE(r.find("ranks that did not arrive: 1"), std::string::npos) << r;
  EXPECT_NE(r.find("2 wait(s) in progress"), std::string::npos) << r;
  EXPECT_NE(r.find("hint:"), std::string::npos) << r;
}

TEST(Watchdog, ADiagnosisThatBlocksIsGivenUp) {
  WatchedWait w("recv of 4 f32 with rank 1", WaitKind::collective, "",
                [] {
                  std::this_thread::sleep_for(std::chrono::seconds(30));
                  return std::string("never");
                });
  const auto t0 = std::chrono::steady_clock::now();
  const std::string r = watchdog_report_now(0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.find("no answer from the other ranks"), std::string::npos) << r;
  EXPECT_LT(s, 20.0);  // bounded at 5 s; generous for a loaded machine
}

TEST(Watchdog, RefusesANonPositiveTimeout) {
  EXPECT_THROW(watchdog_set_timeout(0), Error);
  EXPECT_THROW(watchdog_set_timeout(-1), Error);
}

TEST(WatchdogDeathTest, AWaitPastTheTimeoutEndsTheProcessWithTheReport) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        watchdog_set_handler(&exit_42);
        watchdog_set_timeout(0.2);
        watchdog_set_step(5);
        watchdog_set_phase("forward");
        WatchedWait w("all_reduce of 1 f64 on 'dp'", WaitKind::collective, watchdog_context());
        std::this_thread::sleep_for(std::chrono::seconds(30));
        std::_Exit(0);  // not reached: the watchdog ends the process first
      },
      testing::ExitedWithCode(42),
      "handler: \\[watchdog\\] no progress .*all_reduce of 1 f64 on 'dp' \\(step 5, forward\\)");
}

TEST(WatchdogDeathTest, AWaitThatEndsInTimeIsNotReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        watchdog_set_handler(&exit_42);
        watchdog_set_timeout(0.5);
        for (int i = 0; i < 10; ++i) {
          WatchedWait w("short wait", WaitKind::host);
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(800));
        std::fprintf(stderr, "finished\n");
        std::_Exit(0);
      },
      testing::ExitedWithCode(0), "finished");
}
