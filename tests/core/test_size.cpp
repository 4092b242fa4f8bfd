// Byte sizes as users write them, and checked size arithmetic.
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "core/size.h"

using namespace strata;

TEST(Size, Parses) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("512M"), 512 * MiB);
  EXPECT_EQ(parse_bytes("2G"), 2 * GiB);
  EXPECT_EQ(parse_bytes("2GiB"), 2 * GiB);
  EXPECT_EQ(parse_bytes("4B"), 4u);
  EXPECT_EQ(parse_bytes("64kb"), 64 * KiB);
  EXPECT_EQ(parse_bytes("1.5G"), 3 * GiB / 2);
  EXPECT_EQ(parse_bytes(" 1T "), TiB);
  EXPECT_EQ(parse_bytes("0"), 0u);
}

TEST(Size, RejectsBadInput) {
  for (const char* bad : {"", "G", "-1", "12Q", "1.2.3G", "0.3", "99999999999999999999", "20000000T",
                          "4iB", "4 iB"}) {  // (iB only after K, M, G or T)
    EXPECT_THROW(parse_bytes(bad, "offload.device_mem_limit"), Error) << bad;
  }
  try {
    parse_bytes("12Q", "offload.device_mem_limit");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offload.device_mem_limit"), std::string::npos);
  }
}

TEST(Size, Formats) {
  EXPECT_EQ(format_bytes(512), "512");
  EXPECT_EQ(format_bytes(512 * MiB), "512M");
  EXPECT_EQ(format_bytes(3 * GiB / 2), "1.5G");
  EXPECT_EQ(format_bytes(2 * GiB), "2G");
  EXPECT_EQ(parse_bytes(format_bytes(7 * GiB)), 7 * GiB);
}

// Checked size arithmetic: exact results, and an Error naming the quantity at the first bit
// that does not fit (never wrap-around or signed overflow).
TEST(Size, CheckedArithmetic) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(checked_mul<int64_t>(int64_t(1) << 31, int64_t(1) << 31, "x"), int64_t(1) << 62);
  EXPECT_EQ(checked_mul<uint64_t>(uint64_t(1) << 32, (uint64_t(1) << 32) - 1, "x"),
            (uint64_t(1) << 32) * ((uint64_t(1) << 32) - 1));
  EXPECT_EQ(checked_mul<int64_t>(0, kMax, "x"), 0);
  EXPECT_EQ(checked_mul<int64_t>(-3, 5, "x"), -15);
  EXPECT_EQ(checked_add<uint64_t>(UINT64_MAX - 1, 1, "x"), UINT64_MAX);
  EXPECT_EQ(checked_cast<int>(int64_t(2147483647), "x"), 2147483647);
  EXPECT_EQ(checked_cast<uint64_t>(int64_t(5), "x"), 5u);

  auto expect_error = [](auto fn, const std::string& fragment) {
    try {
      fn();
      ADD_FAILURE() << "no Error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([] { checked_mul<int64_t>(int64_t(1) << 62, 2, "tensor 'w' numel"); },
               "tensor 'w' numel: 4611686018427387904 x 2 does not fit in int64");
  expect_error([] { checked_mul<uint64_t>(uint64_t(1) << 32, uint64_t(1) << 32, "bytes"); },
               "4294967296 x 4294967296 does not fit in uint64");
  expect_error([] { checked_mul<int>(65536, 32768, "tokens"); }, "does not fit in int32");
  expect_error([] { checked_add<int64_t>(kMax, 1, "sum"); }, "sum: 9223372036854775807 + 1");
  expect_error([] { checked_cast<int>(int64_t(1) << 31, "QKV"); },
               "QKV: 2147483648 does not fit in int32");
  expect_error([] { checked_cast<uint64_t>(int64_t(-1), "count"); }, "count: -1 does not fit");
}

TEST(Size, DivCeilAndRoundUp) {
  static_assert(div_ceil(0u, 4u) == 0 && div_ceil(1u, 4u) == 1 && div_ceil(8u, 4u) == 2);
  EXPECT_EQ(div_ceil(uint64_t(9), 4), 3u);
  EXPECT_EQ(div_ceil(size_t(4096), 4096), 1u);
  // No n + d − 1 on the way: the largest value still divides without wrapping.
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(div_ceil(kMax, 2), uint64_t(1) << 63);
  EXPECT_EQ(div_ceil(kMax, kMax), 1u);
  EXPECT_EQ(round_up(size_t(1), 4096), 4096u);
  EXPECT_EQ(round_up(size_t(4096), 4096), 4096u);
  EXPECT_EQ(round_up(uint64_t(4097), 4096), 8192u);
  EXPECT_EQ(round_up(uint64_t(0), 256), 0u);
}
