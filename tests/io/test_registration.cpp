// tests/io/test_registration.cpp — io_uring fixed buffers and fixed files through FileIO:
// chunks inside a registered region go out as READ_FIXED/WRITE_FIXED with that region's index
// and move the same bytes as plain transfers; chunks outside every region (or straddling its
// end) take the plain path; several regions given out of address order map to the right
// indices; and where registration is refused (a read-only region, RLIMIT_MEMLOCK without
// CAP_IPC_LOCK, io_uring_register blocked by seccomp) transfers still run, unregistered, after
// one warning. The POSIX backend accepts the call as a no-op.
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/size.h"
#include "io/huge_pages.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

// A FileIO on io_uring with 256K blocks, or nullptr (the test skips) where io_uring is refused.
std::unique_ptr<FileIO> make_uring(int depth = 8) {
  std::string why;
  auto backend = test::backend_or_skip("uring", depth, &why);
  if (!backend) return nullptr;
  IoOptions o;
  o.queue_depth = depth;
  o.block_size = 256 * KiB;
  return std::make_unique<FileIO>(std::move(backend), o);
}

#define URING_OR_SKIP(io)                                             \
  auto io = make_uring();                                             \
  if (!io) GTEST_SKIP() << "io_uring unavailable in this environment"

TEST(Registration, FixedTransfersMoveTheSameBytesAsPlainOnes) {
  URING_OR_SKIP(io);
  const std::string dir = test::fresh_work_dir();
  const int f = io->open(FileSpec{{dir + "/fixed.bin"}});
  EXPECT_TRUE(io->file_registered(f)) << "files go into io_uring's fixed-file table";
  HugePageBuffer staging(4 * MiB), plain(4 * MiB);
  std::vector<std::span<std::byte>> regions{staging.span()};
  STRATA_REGISTER_OR_SKIP(*io, regions);
  ASSERT_TRUE(io->buffers_registered());

  // The same pattern written at [0, 4M) from registered memory and at [4M, 8M) from plain
  // memory; then each half read back both ways.
  test::fill_pattern(staging.data(), 4 * MiB, 21, 0);
  std::memcpy(plain.data(), staging.data(), 4 * MiB);
  const uint64_t fixed0 = io->stats().fixed_chunks;
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, staging.data(), 4 * MiB, 1},
                                 {IoOp::write, f, 4 * MiB, plain.data(), 4 * MiB, 2}});
  EXPECT_EQ(io->stats().fixed_chunks - fixed0, 16u) << "4M in 256K chunks, registered half only";
  for (uint64_t half : {uint64_t(0), 4 * MiB}) {
    std::memset(staging.data(), 0, 4 * MiB);
    std::memset(plain.data(), 0xff, 4 * MiB);
    io->run(std::vector<IoRequest>{{IoOp::read, f, half, staging.data(), 4 * MiB, 3},
                                   {IoOp::read, f, half, plain.data(), 4 * MiB, 4}});
    EXPECT_EQ(test::check_pattern(staging.data(), 4 * MiB, 21, 0), -1) << "fixed read at " << half;
    EXPECT_EQ(std::memcmp(staging.data(), plain.data(), 4 * MiB), 0) << "plain read at " << half;
  }
  EXPECT_EQ(io->stats().failed, 0u);
}

TEST(Registration, ChunksOutsideOrAcrossARegionTakeThePlainPath) {
  URING_OR_SKIP(io);
  const std::string dir = test::fresh_work_dir();
  const int f = io->open(FileSpec{{dir + "/edge.bin"}});
  HugePageBuffer mem(4 * MiB);
  // Only [0, 2M) is registered. A 1M request from 1.5M: two 256K chunks inside, two outside.
  std::vector<std::span<std::byte>> regions{mem.span().subspan(0, 2 * MiB)};
  STRATA_REGISTER_OR_SKIP(*io, regions);
  test::fill_pattern(mem.data(), 4 * MiB, 33, 0);
  std::byte* at = mem.data() + 1536 * KiB;
  const uint64_t fixed0 = io->stats().fixed_chunks;
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, at, 1 * MiB, 1}});
  EXPECT_EQ(io->stats().fixed_chunks - fixed0, 2u);
  // A request that straddles the region's end in one chunk (block 256K, 8K each side).
  std::byte* straddle = mem.data() + 2 * MiB - 8 * KiB;
  io->run(std::vector<IoRequest>{{IoOp::write, f, 1 * MiB, straddle, 16 * KiB, 2}});
  EXPECT_EQ(io->stats().fixed_chunks - fixed0, 2u) << "a straddling chunk is not fixed";
  HugePageBuffer back(2 * MiB, PageRequest::none);  // never registered
  io->run(std::vector<IoRequest>{{IoOp::read, f, 0, back.data(), 1 * MiB + 16 * KiB, 3}});
  EXPECT_EQ(test::check_pattern(back.data(), 1 * MiB, 33, 1536 * KiB), -1);
  EXPECT_EQ(test::check_pattern(back.data() + 1 * MiB, 16 * KiB, 33, 2 * MiB - 8 * KiB), -1);
}

TEST(Registration, SeveralRegionsOutOfAddressOrderMapToTheirOwnIndex) {
  URING_OR_SKIP(io);
  const std::string dir = test::fresh_work_dir();
  const int f = io->open(FileSpec{{dir + "/many.bin"}});
  std::vector<HugePageBuffer> bufs;
  for (int i = 0; i < 3; ++i) bufs.emplace_back(2 * MiB);
  // Given in descending address order; FileIO sorts them and must name each one's index (a
  // wrong index makes the kernel refuse the transfer with EFAULT, or move the wrong bytes).
  std::vector<std::span<std::byte>> regions;
  for (auto& b : bufs) regions.push_back(b.span());
  std::sort(regions.begin(), regions.end(),
            [](auto a, auto b) { return a.data() > b.data(); });
  STRATA_REGISTER_OR_SKIP(*io, regions);
  ASSERT_TRUE(io->buffers_registered());
  std::vector<IoRequest> writes;
  for (int i = 0; i < 3; ++i) {
    test::fill_pattern(bufs[i].data(), 2 * MiB, 50 + i, 0);
    writes.push_back({IoOp::write, f, uint64_t(i) * 2 * MiB, bufs[i].data(), 2 * MiB, uint64_t(i)});
  }
  const uint64_t fixed0 = io->stats().fixed_chunks;
  io->run(writes);
  EXPECT_EQ(io->stats().fixed_chunks - fixed0, 24u);
  for (auto& b : bufs) std::memset(b.data(), 0, 2 * MiB);
  std::vector<IoRequest> reads = writes;
  for (auto& r : reads) r.op = IoOp::read;
  io->run(reads);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(test::check_pattern(bufs[i].data(), 2 * MiB, 50 + i, 0), -1) << "region " << i;
  io->unregister_buffers();
  EXPECT_FALSE(io->buffers_registered());
}

TEST(Registration, ARefusedRegistrationLeavesTransfersWorking) {
  URING_OR_SKIP(io);
  const std::string dir = test::fresh_work_dir();
  const int f = io->open(FileSpec{{dir + "/refused.bin"}});
  // The kernel pins registered buffers for writing: a read-only mapping is refused (EFAULT).
  HugePageBuffer mem(2 * MiB, PageRequest::thp);
  test::fill_pattern(mem.data(), 2 * MiB, 61, 0);
  ASSERT_EQ(::mprotect(mem.data(), mem.mapped_bytes(), PROT_READ), 0);
  std::vector<std::span<std::byte>> regions{mem.span()};
  io->register_buffers(regions);
  EXPECT_FALSE(io->buffers_registered());
  ASSERT_EQ(::mprotect(mem.data(), mem.mapped_bytes(), PROT_READ | PROT_WRITE), 0);
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, mem.data(), 2 * MiB, 1}});
  std::memset(mem.data(), 0, 2 * MiB);
  io->run(std::vector<IoRequest>{{IoOp::read, f, 0, mem.data(), 2 * MiB, 2}});
  EXPECT_EQ(test::check_pattern(mem.data(), 2 * MiB, 61, 0), -1);
  EXPECT_EQ(io->stats().fixed_chunks, 0u);
  EXPECT_TRUE(io->file_registered(f)) << "files stay registered";
}

TEST(Registration, PosixAcceptsTheCallAsANoOp) {
  IoOptions o;
  o.block_size = 256 * KiB;
  FileIO io(make_posix_backend(4), o);
  const std::string dir = test::fresh_work_dir();
  const int f = io.open(FileSpec{{dir + "/posix.bin"}});
  HugePageBuffer mem(2 * MiB);
  std::vector<std::span<std::byte>> regions{mem.span()};
  io.register_buffers(regions);
  EXPECT_FALSE(io.buffers_registered());
  EXPECT_FALSE(io.file_registered(f));
  test::fill_pattern(mem.data(), 2 * MiB, 71, 0);
  io.run(std::vector<IoRequest>{{IoOp::write, f, 0, mem.data(), 2 * MiB, 1}});
  std::memset(mem.data(), 0, 2 * MiB);
  io.run(std::vector<IoRequest>{{IoOp::read, f, 0, mem.data(), 2 * MiB, 2}});
  EXPECT_EQ(test::check_pattern(mem.data(), 2 * MiB, 71, 0), -1);
}

// In a child: two FileIOs register 4 MiB each and round-trip through it. Exit 0 when neither
// registered (the transfers then ran on the plain path) and the bytes are right.
[[noreturn]] void child_registration_refused(const std::string& dir, bool files_refused) {
  for (int round = 0; round < 2; ++round) {
    auto io = make_uring();
    if (!io) std::_Exit(30);
    const int f = io->open(FileSpec{{dir + "/child" + std::to_string(round) + ".bin"}});
    if (io->file_registered(f) == files_refused) std::_Exit(31);
    HugePageBuffer mem(4 * MiB);
    std::vector<std::span<std::byte>> regions{mem.span()};
    io->register_buffers(regions);
    if (io->buffers_registered()) std::_Exit(32);
    test::fill_pattern(mem.data(), 4 * MiB, 81, 0);
    io->run(std::vector<IoRequest>{{IoOp::write, f, 0, mem.data(), 4 * MiB, 1}});
    std::memset(mem.data(), 0, 4 * MiB);
    io->run(std::vector<IoRequest>{{IoOp::read, f, 0, mem.data(), 4 * MiB, 2}});
    if (test::check_pattern(mem.data(), 4 * MiB, 81, 0) != -1) std::_Exit(33);
    if (io->stats().fixed_chunks != 0) std::_Exit(34);
  }
  std::_Exit(0);
}

// io_uring_register fails with EPERM from now on for every opcode but IORING_REGISTER_PROBE
// (which the backend needs to check its opcodes), so buffer and file registration are refused.
bool refuse_io_uring_register() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_register, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])),  // opcode
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, IORING_REGISTER_PROBE, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{sizeof(filter) / sizeof(filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

bool limit_memlock(rlim_t bytes) {
  rlimit rl{bytes, bytes};
  return ::setrlimit(RLIMIT_MEMLOCK, &rl) == 0;
}

// Drops CAP_IPC_LOCK from this process's effective set (the limit on locked memory then applies
// to io_uring registrations, as for any unprivileged process).
bool drop_ipc_lock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  return syscall(SYS_capset, &header, data) == 0;
}

TEST(RegistrationDeathTest, MemlockLimitTooLowFallsBackWithOneWarning) {
  if (!make_uring()) GTEST_SKIP() << "io_uring unavailable in this environment";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = test::fresh_work_dir();
  EXPECT_EXIT(
      {
        if (!limit_memlock(64 * 1024) || !drop_ipc_lock()) std::_Exit(20);  // far below 4M
        child_registration_refused(dir, false);
      },
      ::testing::ExitedWithCode(0), test::once("locked-memory limit (ulimit -l, now 64K)"));
}

TEST(RegistrationDeathTest, IoUringRegisterBlockedFallsBackForBuffersAndFiles) {
  if (!make_uring()) GTEST_SKIP() << "io_uring unavailable in this environment";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = test::fresh_work_dir();
  EXPECT_EXIT(
      {
        if (!refuse_io_uring_register()) std::_Exit(20);
        child_registration_refused(dir, true);
      },
      ::testing::ExitedWithCode(0),
      test::once(std::vector<std::string>{"io_uring refused to register 1 staging buffer(s)",
                                          "io_uring refused a registered file table"}));
}

}  // namespace
}  // namespace strata
