// tests/io/test_fallback.cpp — io.backend=auto where the environment refuses io_uring or
// O_DIRECT. Each case runs in a child process (a gtest death test) that first installs a seccomp
// filter making the kernel refuse the one thing, as a container policy or a file system would;
// the child checks that POSIX took over and still moves the right bytes, and the parent checks
// that exactly one warning said why.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>

#include "core/size.h"
#include "io/aligned_buffer.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

// Refuses io_uring_setup with EPERM (what seccomp profiles of container runtimes do).
bool refuse_io_uring() { return test::refuse_syscall(__NR_io_uring_setup, EPERM); }

// Refuses openat with O_DIRECT with EINVAL (what a file system without direct I/O answers).
bool refuse_o_direct() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[2])),  // flags, low word
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EINVAL & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{sizeof(filter) / sizeof(filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// In the child: two FileIOs on "auto" (the warning must not repeat), a round trip on the second.
// Exit code 0: POSIX chose, direct as expected, bytes right.
[[noreturn]] void child_round_trip(const std::string& dir, bool expect_direct) {
  std::vector<std::string> dirs{dir};
  auto first = make_file_io(IoOptions{}, dirs);
  auto io = make_file_io(IoOptions{}, dirs);
  if (io->backend_name() != "posix" || first->backend_name() != "posix") std::_Exit(10);
  int f = io->open(FileSpec{{dir + "/fallback.bin"}});
  if (io->file_direct(f) != expect_direct) std::_Exit(11);
  AlignedBuffer out(1 * MiB), in(1 * MiB);
  test::fill_pattern(out.data(), out.size(), 41, 0);
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, out.data(), out.size(), 1}});
  io->run(std::vector<IoRequest>{{IoOp::read, f, 0, in.data(), in.size(), 2}});
  std::_Exit(test::check_pattern(in.data(), in.size(), 41, 0) == -1 ? 0 : 12);
}

using test::once;

TEST(FallbackDeathTest, IoUringRefusedFallsBackToPosixWithOneWarning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::string dir = test::fresh_work_dir();
  EXPECT_EXIT(
      {
        if (!refuse_io_uring()) std::_Exit(20);
        child_round_trip(dir, true);
      },
      ::testing::ExitedWithCode(0), once("io_uring unavailable"));
}

TEST(FallbackDeathTest, ODirectRefusedFallsBackToPosixWithOneWarning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::string dir = test::fresh_work_dir();
  EXPECT_EXIT(
      {
        if (!refuse_o_direct()) std::_Exit(20);
        child_round_trip(dir, false);
      },
      ::testing::ExitedWithCode(0), once("O_DIRECT refused"));
}

TEST(FallbackDeathTest, ExplicitUringWhereRefusedIsAnError) {
  if (!uring_compiled()) GTEST_SKIP() << "not built with io_uring";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::string dir = test::fresh_work_dir();
  EXPECT_EXIT(
      {
        if (!refuse_io_uring()) std::_Exit(20);
        IoOptions o;
        o.backend = "uring";
        try {
          make_file_io(o, std::vector<std::string>{dir});
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::_Exit(3);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3), "io_uring_queue_init.*refused.*EPERM");
}

}  // namespace
}  // namespace strata
