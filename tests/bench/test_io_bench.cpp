// tests/bench/test_io_bench.cpp — `strata bench io`'s pass (bench/io_bench.h) over real files:
// on each backend it writes and reads back every byte asked for with nothing counted wrong; a
// byte flipped in one read-back block, in a sector's stamp or in its pattern bytes, is counted
// as one wrong sector; and a queue of one request with its one spare buffer finishes. The update
// pattern reads, checks and rewrites every block in place (the read after it checks the new
// stamps, so a block not rewritten would count wrong), one request deep too. The overwrite
// pattern times a write over blocks an untimed write laid out first (a different seed: a block
// the timed write missed would count wrong).
#include <string>

#include "bench/io_bench.h"
#include "core/size.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

class IoBenchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!test::backend_or_skip(GetParam(), 4, &why)) GTEST_SKIP() << why;
  }
  IoBenchOptions options(uint64_t size, int depth) {
    IoBenchOptions o;
    o.dirs = {test::fresh_work_dir()};
    o.size_bytes = size;
    o.block_bytes = 256 * KiB;
    o.queue_depth = depth;
    o.backend = GetParam();
    return o;
  }
};

TEST_P(IoBenchTest, EveryByteIsWrittenAndReadBackUnchanged) {
  const nlohmann::json r = run_io_bench(options(16 * MiB, 8));
  EXPECT_EQ(r["backend"], GetParam() == "uring" ? "io_uring" : "posix");
  EXPECT_EQ(r["bytes_written"], 16 * MiB);
  EXPECT_EQ(r["bytes_read"], 16 * MiB);
  EXPECT_EQ(r["wrong"], 0);
  EXPECT_GT(r["read_gbps"].get<double>(), 0);
}

TEST_P(IoBenchTest, AByteFlippedInOneReadBackBlockIsOneWrongSector) {
  IoBenchOptions o = options(16 * MiB, 8);
  o.test_corrupt_block = 37;           // of 64
  o.test_corrupt_byte = 3 * 4096 + 9;  // sector 3's stamp (offset word)
  EXPECT_EQ(run_io_bench(o)["wrong"], 1);
  o.test_corrupt_byte = 5 * 4096 + 2000;  // sector 5's pattern bytes
  EXPECT_EQ(run_io_bench(o)["wrong"], 1);
  o.test_corrupt_byte = 6 * 4096 + 6;  // sector 6's contents id (above the offset)
  EXPECT_EQ(run_io_bench(o)["wrong"], 1);
}

TEST_P(IoBenchTest, TheOverwritePatternTimesAWriteOverWrittenBlocks) {
  IoBenchOptions o = options(16 * MiB, 8);
  o.overwrite = true;
  const nlohmann::json r = run_io_bench(o);
  EXPECT_EQ(r["pattern"], "overwrite");
  EXPECT_EQ(r["bytes_written"], 16 * MiB);  // the timed pass alone
  EXPECT_EQ(r["bytes_read"], 16 * MiB);
  EXPECT_EQ(r["wrong"], 0);
  o.test_corrupt_block = 21;
  o.test_corrupt_byte = 2 * 4096 + 12;  // sector 2's seed word
  EXPECT_EQ(run_io_bench(o)["wrong"], 1);
}

TEST_P(IoBenchTest, OneRequestDeepWithOneSpareBufferFinishes) {
  test::within(60, [&] {
    const nlohmann::json r = run_io_bench(options(4 * MiB, 1));
    EXPECT_EQ(r["bytes_read"], 4 * MiB);
    EXPECT_EQ(r["wrong"], 0);
  });
}

TEST_P(IoBenchTest, TheUpdatePassRewritesEveryBlockInPlace) {
  IoBenchOptions o = options(16 * MiB, 8);
  o.update = true;
  const nlohmann::json r = run_io_bench(o);
  EXPECT_EQ(r["pattern"], "update");
  EXPECT_EQ(r["bytes_written"], 16 * MiB);
  EXPECT_EQ(r["update"]["bytes_read"], 16 * MiB);
  EXPECT_EQ(r["update"]["bytes_written"], 16 * MiB);
  EXPECT_EQ(r["bytes_read"], 16 * MiB);
  EXPECT_EQ(r["wrong"], 0);
  EXPECT_GT(r["update"]["gbps"].get<double>(), 0);
  o.test_corrupt_block = 11;
  o.test_corrupt_byte = 7 * 4096 + 3;  // sector 7's stamp, as read after the update
  EXPECT_EQ(run_io_bench(o)["wrong"], 1);
  o.queue_depth = 1;
  o.test_corrupt_block = UINT64_MAX;
  test::within(60, [&] { EXPECT_EQ(run_io_bench(o)["wrong"], 0); });
}

INSTANTIATE_TEST_SUITE_P(Backends, IoBenchTest, ::testing::Values("uring", "posix"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata
