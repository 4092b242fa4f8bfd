// Byte sizes as users write them.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/size.h"

using namespace strata;

TEST(Size, Parses) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("512M"), 512 * MiB);
  EXPECT_EQ(parse_bytes("2G"), 2 * GiB);
  EXPECT_EQ(parse_bytes("2GiB"), 2 * GiB);
  EXPECT_EQ(parse_bytes("64kb"), 64 * KiB);
  EXPECT_EQ(parse_bytes("1.5G"), 3 * GiB / 2);
  EXPECT_EQ(parse_bytes(" 1T "), TiB);
  EXPECT_EQ(parse_bytes("0"), 0u);
}

TEST(Size, RejectsBadInput) {
  for (const char* bad : {"", "G", "-1", "12Q", "1.2.3G", "0.3", "99999999999999999999", "20000000T"}) {
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
