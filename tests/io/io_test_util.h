// tests/io/io_test_util.h — what the io and offload tests share: a fresh work directory under
// the build tree per test, a position-dependent byte pattern, backends by name, a bound on how
// long a call may take, a seccomp filter that makes the kernel refuse one system call, and a
// matcher for a message printed exactly once.
#pragma once

#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

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

// "uring" or "posix"; skips the test (with the reason) where io_uring is not available: a build
// without liburing, a kernel or seccomp filter that refuses io_uring_setup (ENOSYS, EPERM,
// EACCES; ENOMEM under a low locked-memory limit), or a kernel without IORING_OP_READ/WRITE. Any
// other failure to make the ring is a regression and propagates (the test fails).
inline std::unique_ptr<IoBackend> backend_or_skip(const std::string& kind, int depth,
                                                  std::string* skip_reason,
                                                  int submit_batch = kDefaultSubmitBatch) {
  if (kind == "posix") return make_posix_backend(depth);
  try {
    return make_uring_backend(depth, submit_batch);
  } catch (const Error& e) {
    const std::string what = e.what();
    bool environment =
        !uring_compiled() || what.find("lacks IORING_OP_READ/WRITE") != std::string::npos;
    for (const char* refusal : {"(ENOSYS)", "(EPERM)", "(EACCES)", "(ENOMEM)"})
      environment = environment || (what.find("refused: ") != std::string::npos &&
                                    what.find(refusal) != std::string::npos);
    if (!environment) throw;
    *skip_reason = what;
    return nullptr;
  }
}

// Runs fn on a thread of its own and returns what it returns (or throws what it throws). If it
// has not returned after `seconds`, the test fails and the process aborts: a regression that
// hangs must fail fast instead of stalling CTest until its timeout.
template <class Fn>
auto within(double seconds, Fn&& fn) -> decltype(fn()) {
  auto result = std::async(std::launch::async, std::forward<Fn>(fn));
  if (result.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "FAILED: %s.%s: a call did not return within %g s (a hang); aborting\n",
                 info ? info->test_suite_name() : "?", info ? info->name() : "?", seconds);
    std::abort();
  }
  return result.get();
}

// Whether io_uring may pin any amount of memory for this process: it has CAP_IPC_LOCK, or no
// RLIMIT_MEMLOCK. Elsewhere registering staging buffers may be refused for the limit (counted
// per user, across processes), and tests that need a registration skip instead of failing.
inline bool memlock_unbounded() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur == RLIM_INFINITY) return true;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return false;
  char line[256];
  unsigned long long caps = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "CapEff:", 7) == 0) caps = std::strtoull(line + 7, nullptr, 16);
  std::fclose(f);
  return (caps >> 14) & 1;  // CAP_IPC_LOCK
}

// Registers `regions`; where io_uring refuses and the locked-memory limit may be why, skips the
// test saying so (a refusal without that excuse is left to the test's own checks).
#define STRATA_REGISTER_OR_SKIP(io, regions)                                                    \
  do {                                                                                          \
    (io).register_buffers(regions);                                                             \
    if (!(io).buffers_registered() && (io).backend_name() == "io_uring" &&                      \
        !::strata::test::memlock_unbounded())                                                   \
      GTEST_SKIP() << "io_uring refused to register staging buffers under this RLIMIT_MEMLOCK " \
                      "without CAP_IPC_LOCK";                                                    \
  } while (0)

// From now on this process's calls of system call `nr` fail with `err` (a seccomp filter, as a
// container policy installs). Permanent: use it in a child process (a death test).
inline bool refuse_syscall(int nr, int err) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, unsigned(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (unsigned(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{sizeof(filter) / sizeof(filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// The child's stderr holds each of `needles` exactly once.
class OnceMatcher : public ::testing::MatcherInterface<const std::string&> {
 public:
  explicit OnceMatcher(std::vector<std::string> needles) : needles_(std::move(needles)) {}
  bool MatchAndExplain(const std::string& err, ::testing::MatchResultListener*) const override {
    for (const std::string& n : needles_) {
      size_t first = err.find(n);
      if (first == std::string::npos || err.find(n, first + 1) != std::string::npos) return false;
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const override {
    for (size_t i = 0; i < needles_.size(); ++i)
      *os << (i ? " and " : "") << "contains '" << needles_[i] << "' exactly once";
  }

 private:
  std::vector<std::string> needles_;
};
inline ::testing::Matcher<const std::string&> once(std::vector<std::string> needles) {
  return ::testing::Matcher<const std::string&>(new OnceMatcher(std::move(needles)));
}
inline ::testing::Matcher<const std::string&> once(const std::string& needle) {
  return once(std::vector<std::string>{needle});
}

}  // namespace strata::test
