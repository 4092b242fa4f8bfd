// CPU feature detection is self-consistent and /proc readings are plausible.
#include <gtest/gtest.h>
#include <unistd.h>

#include "core/cpu.h"

using namespace strata;

TEST(Cpu, FeaturesAreConsistent) {
  const auto& f = cpu_features();
  if (f.avx2) {
    EXPECT_TRUE(f.avx);
  }
  if (f.avx512bw) {
    EXPECT_TRUE(f.avx512f);
  }
  EXPECT_FALSE(f.describe().empty());
#if defined(__AVX2__)
  EXPECT_TRUE(f.avx2);  // this binary was compiled for AVX2 and runs, so the CPU has it
#endif
}

TEST(Cpu, MemoryReadings) {
  EXPECT_GT(hardware_threads(), 0);
  EXPECT_GT(physical_memory_bytes(), 64ull << 20);
  EXPECT_GT(current_rss_bytes(), 0u);
  EXPECT_GE(peak_rss_bytes(), current_rss_bytes() / 2);
}

TEST(Cpu, ProcStatFieldsByKind) {
  const double hz = double(sysconf(_SC_CLK_TCK));
  // user nice system idle iowait irq softirq steal guest guest_nice
  const CpuTimes t = parse_proc_stat("cpu  100 20 30 400 50 6 4 90 7 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n");
  ASSERT_TRUE(t.machine);
  EXPECT_DOUBLE_EQ(t.busy_s, 160 / hz);
  EXPECT_DOUBLE_EQ(t.idle_s, 450 / hz);
  EXPECT_DOUBLE_EQ(t.steal_s, 90 / hz);
  EXPECT_DOUBLE_EQ(*t.share(t.steal_s), 90.0 / 700);  // of busy + idle + steal
  // A kernel older than steal accounting (four fields): no steal, still read.
  const CpuTimes old = parse_proc_stat("cpu 10 0 10 80\n");
  ASSERT_TRUE(old.machine);
  EXPECT_DOUBLE_EQ(old.steal_s, 0.0);
  EXPECT_DOUBLE_EQ(old.total_s(), 100 / hz);
  EXPECT_FALSE(parse_proc_stat("intr 1 2 3\n").machine);
  EXPECT_FALSE(parse_proc_stat("intr 1 2 3\n").share(0.0).has_value());  // nothing read
  EXPECT_FALSE(parse_proc_stat("cpu 1 2\n").machine);
}

TEST(Cpu, TimesAdvanceWithWork) {
  const CpuTimes a = cpu_times();
  volatile double x = 0;
  for (int i = 0; i < 20'000'000; ++i) x = x + 1e-9 * i;
  const CpuTimes d = cpu_times() - a;
  EXPECT_GT(d.process_s, 0.0);  // this process ran
  EXPECT_DOUBLE_EQ(d.process_cores(2.0), d.process_s / 2.0);
  EXPECT_EQ(d.process_cores(0.0), 0.0);
  if (a.machine) {
    EXPECT_TRUE(d.machine);
    EXPECT_GT(d.busy_s, 0.0);
    EXPECT_GE(d.idle_s, 0.0);
    EXPECT_GE(d.steal_s, 0.0);
  }
}
