// Error messages: "[component::op] what" plus hint lines; checks stay on in Release.
#include <gtest/gtest.h>

#include "core/error.h"

using namespace strata;

TEST(Error, FormatsWhereWhatAndHints) {
  try {
    fail("io::open", "cannot open 'x': No such file", "check the path");
    FAIL() << "fail() returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[io::open] cannot open 'x': No such file\nhint: check the path");
    EXPECT_EQ(e.where(), "io::open");
    ASSERT_EQ(e.hints().size(), 1u);
  }
}

TEST(Error, CheckNamesConditionAndThrowsInRelease) {
  int n = 3;
  try {
    STRATA_CHECK(n == 4, "test::check", "n was ", n);
    FAIL() << "STRATA_CHECK did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[test::check] n was 3"), std::string::npos) << m;
    EXPECT_NE(m.find("n == 4"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(STRATA_CHECK(n == 3, "test::check"));
}

TEST(Error, UringCheckReportsErrno) {
  try {
    STRATA_URING_CHECK(-2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
}
