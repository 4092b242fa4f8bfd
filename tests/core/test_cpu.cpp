// CPU feature detection is self-consistent and /proc readings are plausible.
#include <gtest/gtest.h>

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
