// tests/engine/test_util.h — helpers for the engine I/O tests: a scratch directory per test,
// whole-file writes, and EXPECT_ERROR_HAS, which requires an Error whose message holds each of
// the given fragments.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace strata::test {

// A fresh, empty directory for the running test under the build tree.
inline std::string scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(STRATA_TEST_WORK_DIR) / "engine_io" /
                              (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Runs fn; the test fails unless it throws strata::Error with every fragment in its message.
inline void expect_error_has(const std::function<void()>& fn, const std::vector<std::string>& fragments,
                             const char* file, int line) {
  SCOPED_TRACE(::testing::Message() << "called from " << file << ":" << line);
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in:\n" << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-strata exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "no Error was thrown";
}

}  // namespace strata::test

#define EXPECT_ERROR_HAS(stmt, ...) \
  ::strata::test::expect_error_has([&] { stmt; }, {__VA_ARGS__}, __FILE__, __LINE__)
