// tests/io/io_test_util.h — what the io and swap-space tests share: a fresh work directory under
// the build tree per test, a position-dependent byte pattern, and backends by name.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "io/backend.h"
#include "io/file_io.h"

namespace strata::test {

// STRATA_TEST_WORK_DIR/<suite>/<test>, emptied first.
inline std::string fresh_work_dir(const std::string& leaf = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name)
    if (c == '/') c = '_';
  std::filesystem::path p = std::filesystem::path(STRATA_TEST_WORK_DIR) / name;
  if (!leaf.empty()) p /= leaf;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// 8 bytes of pattern per 8-byte word, a function of (seed, byte position): a block read from the
// wrong place or the wrong run does not match.
inline uint64_t pattern_word(uint64_t seed, uint64_t pos) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + pos;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline void fill_pattern(void* dst, uint64_t bytes, uint64_t seed, uint64_t pos) {
  auto* w = static_cast<uint64_t*>(dst);
  for (uint64_t i = 0; i < bytes / 8; ++i) w[i] = pattern_word(seed, pos + 8 * i);
}
// Index of the first wrong byte, or -1.
inline int64_t check_pattern(const void* src, uint64_t bytes, uint64_t seed, uint64_t pos) {
  const auto* w = static_cast<const uint64_t*>(src);
  for (uint64_t i = 0; i < bytes / 8; ++i)
    if (w[i] != pattern_word(seed, pos + 8 * i)) return int64_t(8 * i);
  return -1;
}

// "uring" or "posix"; skips the test (with the reason) where io_uring is not available.
inline std::unique_ptr<IoBackend> backend_or_skip(const std::string& kind, int depth,
                                                  std::string* skip_reason) {
  if (kind == "posix") return make_posix_backend(depth);
  try {
    return make_uring_backend(depth);
  } catch (const Error& e) {
    *skip_reason = e.what();
    return nullptr;
  }
}

}  // namespace strata::test
