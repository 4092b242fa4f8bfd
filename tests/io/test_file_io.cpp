// tests/io/test_file_io.cpp — FileIO on each real backend (io_uring, POSIX): round trips at many
// sizes and offsets, requests split into chunks and queued past the depth, registered buffers,
// refusal of unaligned requests, end of file, striping over two directories, backend choice.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "core/size.h"
#include "io/aligned_buffer.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

using test::check_pattern;
using test::fill_pattern;

class FileIOTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A FileIO on the parameter's backend; blocks of 64K so that most requests span chunks.
  std::unique_ptr<FileIO> make(int depth = 8, uint64_t block = 64 * KiB) {
    std::string why;
    auto backend = test::backend_or_skip(GetParam(), depth, &why);
    if (!backend) return nullptr;
    IoOptions o;
    o.queue_depth = depth;
    o.block_size = block;
    return std::make_unique<FileIO>(std::move(backend), o);
  }
};

#define MAKE_OR_SKIP(io, ...)                                         \
  auto io = make(__VA_ARGS__);                                        \
  if (!io) GTEST_SKIP() << "io_uring unavailable in this environment"

TEST_P(FileIOTest, RoundTripsAtManySizesAndOffsets) {
  MAKE_OR_SKIP(io);
  std::string dir = test::fresh_work_dir();
  int f = io->open(FileSpec{{dir + "/data.bin"}});
  EXPECT_TRUE(io->file_direct(f)) << "O_DIRECT should work under the build tree";
  const uint64_t sizes[] = {4096, 8192, 60 * KiB, 64 * KiB, 68 * KiB, 3 * 64 * KiB + 12 * KiB,
                            1 * MiB + 4096};
  const uint64_t offsets[] = {0, 4096, 60 * KiB, 5 * 64 * KiB + 4096, 7 * MiB};
  uint64_t seed = 1;
  for (uint64_t size : sizes) {
    for (uint64_t off : offsets) {
      AlignedBuffer out(size), in(size);
      fill_pattern(out.data(), size, seed, off);
      io->run(std::vector<IoRequest>{{IoOp::write, f, off, out.data(), size, 1}});
      io->run(std::vector<IoRequest>{{IoOp::read, f, off, in.data(), size, 2}});
      ASSERT_EQ(check_pattern(in.data(), size, seed, off), -1)
          << "size " << size << " offset " << off;
      ++seed;
    }
  }
  EXPECT_EQ(io->pending(), 0u);
  EXPECT_EQ(io->stats().failed, 0u);
  EXPECT_GT(io->stats().chunks, io->stats().requests) << "large requests are split into blocks";
}

TEST_P(FileIOTest, QueuesPastTheDepthAndDeliversEachCompletionOnce) {
  MAKE_OR_SKIP(io, 4, 64 * KiB);
  std::string dir = test::fresh_work_dir();
  int f = io->open(FileSpec{{dir + "/many.bin"}});
  const int n = 100;
  const uint64_t len = 12 * KiB;
  AlignedBuffer out(n * len), in(n * len);
  fill_pattern(out.data(), n * len, 7, 0);
  std::vector<IoRequest> writes, reads;
  for (int i = 0; i < n; ++i) {
    writes.push_back({IoOp::write, f, i * len, out.data() + i * len, len, uint64_t(1000 + i)});
    reads.push_back({IoOp::read, f, i * len, in.data() + i * len, len, uint64_t(2000 + i)});
  }
  std::vector<IoCompletion> done;
  io->submit(writes);
  EXPECT_EQ(io->pending(), size_t(n));
  while (io->pending()) io->wait(1, done);
  io->submit(reads);
  while (io->pending()) io->wait(3, done);
  ASSERT_EQ(done.size(), size_t(2 * n));
  std::set<uint64_t> tags;
  for (const IoCompletion& c : done) {
    EXPECT_EQ(c.bytes, len);
    tags.insert(c.tag);
  }
  EXPECT_EQ(tags.size(), size_t(2 * n));
  EXPECT_EQ(*tags.begin(), 1000u);
  EXPECT_EQ(*tags.rbegin(), uint64_t(2000 + n - 1));
  EXPECT_EQ(check_pattern(in.data(), n * len, 7, 0), -1);
}

// Lanes: with one slot, chunks go out one at a time, so requests complete in the order they
// are cut. A bulk request's first chunk is in flight already when the others arrive; the rest of
// it waits behind every normal and urgent request, and the urgent ones go before the normal,
// each lane in submission order.
TEST_P(FileIOTest, UrgentThenNormalThenBulkAndInOrderWithinALane) {
  MAKE_OR_SKIP(io, 1, 64 * KiB);
  std::string dir = test::fresh_work_dir();
  int f = io->open(FileSpec{{dir + "/lanes.bin"}});
  const uint64_t len = 64 * KiB;
  AlignedBuffer buf(8 * len);
  fill_pattern(buf.data(), 8 * len, 3, 0);
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, buf.data(), 8 * len, 1}});
  auto req = [&](int i, uint64_t n, uint64_t tag) {
    return IoRequest{IoOp::read, f, i * len, buf.data() + i * len, n * len, tag};
  };
  std::vector<IoCompletion> done;
  io->submit(std::vector<IoRequest>{req(0, 3, 10)}, IoLane::bulk);  // 3 chunks: the first goes out now
  io->submit(std::vector<IoRequest>{req(3, 1, 20), req(4, 1, 21)});  // normal
  io->submit(std::vector<IoRequest>{req(5, 1, 30)}, IoLane::urgent);
  io->submit(std::vector<IoRequest>{req(6, 1, 22)}, IoLane::normal);
  io->submit(std::vector<IoRequest>{req(7, 1, 31)}, IoLane::urgent);
  while (io->pending()) io->wait(1, done);
  std::vector<uint64_t> order;
  for (const IoCompletion& c : done) order.push_back(c.tag);
  EXPECT_EQ(order, (std::vector<uint64_t>{30, 31, 20, 21, 22, 10}));
  EXPECT_EQ(check_pattern(buf.data(), 8 * len, 3, 0), -1);
}

// wait_progress returns after each chunk's result: with one slot, a request of four chunks takes
// four calls, the first three returning no completion (wait(1) would block through all four).
// With nothing pending it returns at once.
TEST_P(FileIOTest, WaitProgressReturnsAfterEveryChunk) {
  MAKE_OR_SKIP(io, 1, 64 * KiB);
  std::string dir = test::fresh_work_dir();
  int f = io->open(FileSpec{{dir + "/progress.bin"}});
  AlignedBuffer buf(4 * 64 * KiB);
  fill_pattern(buf.data(), buf.size(), 5, 0);
  io->submit({IoOp::write, f, 0, buf.data(), buf.size(), 7});
  std::vector<IoCompletion> done;
  std::vector<size_t> returned;
  while (io->pending() && returned.size() < 10) returned.push_back(io->wait_progress(done));
  EXPECT_EQ(returned, (std::vector<size_t>{0, 0, 0, 1}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 7u);
  EXPECT_EQ(done[0].bytes, buf.size());
  EXPECT_EQ(io->wait_progress(done), 0u);
  EXPECT_EQ(done.size(), 1u);
}

TEST_P(FileIOTest, PollingWithWaitZeroMakesProgress) {
  MAKE_OR_SKIP(io);
  std::string dir = test::fresh_work_dir();
  int f = io->open(FileSpec{{dir + "/poll.bin"}});
  AlignedBuffer buf(256 * KiB);
  fill_pattern(buf.data(), buf.size(), 3, 0);
  io->submit({IoOp::write, f, 0, buf.data(), buf.size(), 9});
  std::vector<IoCompletion> done;
  // Bounded by time, not by a spin count: a loaded machine may take long to finish the write,
  // but polling alone must get it done.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (done.empty() && std::chrono::steady_clock::now() < deadline) io->wait(0, done);
  ASSERT_EQ(done.size(), 1u) << "polling with wait(0) did not reap the write within 30 s";
  EXPECT_EQ(done[0].tag, 9u);
  EXPECT_EQ(io->pending(), 0u);
}

TEST_P(FileIOTest, RegisteredBuffersRoundTrip) {
  MAKE_OR_SKIP(io, 8, 128 * KiB);
  std::string dir = test::fresh_work_dir();
  int f = io->open(FileSpec{{dir + "/fixed.bin"}});
  AlignedBuffer staging(4 * MiB), other(1 * MiB);
  std::vector<std::span<std::byte>> regions{staging.span()};
  io->register_buffers(regions);
  fill_pattern(staging.data(), staging.size(), 11, 0);
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, staging.data(), staging.size(), 1}});
  std::memset(staging.data(), 0, staging.size());
  io->run(std::vector<IoRequest>{{IoOp::read, f, 0, staging.data(), staging.size(), 2},
                                 {IoOp::read, f, 1 * MiB, other.data(), other.size(), 3}});
  EXPECT_EQ(check_pattern(staging.data(), staging.size(), 11, 0), -1);
  EXPECT_EQ(check_pattern(other.data(), other.size(), 11, 1 * MiB), -1)
      << "an unregistered buffer still works next to registered ones";
  if (GetParam() == "uring") {
    EXPECT_GT(io->stats().fixed_chunks, 0u);
  }
  io->unregister_buffers();
  io->run(std::vector<IoRequest>{{IoOp::read, f, 0, staging.data(), 64 * KiB, 4}});
  EXPECT_EQ(check_pattern(staging.data(), 64 * KiB, 11, 0), -1);
}

TEST_P(FileIOTest, RefusesUnalignedRequestsAndStaysUsable) {
  MAKE_OR_SKIP(io);
  std::string dir = test::fresh_work_dir();
  std::string path = dir + "/align.bin";
  int f = io->open(FileSpec{{path}});
  Alignment a = io->alignment(f);
  EXPECT_GE(a.offset, 512u);
  AlignedBuffer buf(64 * KiB);
  auto expect_refused = [&](IoRequest r, const std::string& needle) {
    try {
      io->submit(r);
      ADD_FAILURE() << "accepted an unaligned request (" << needle << ")";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
    }
    EXPECT_EQ(io->pending(), 0u);
  };
  expect_refused({IoOp::write, f, 0, buf.data() + 8, 4096, 1}, "buffer address");
  expect_refused({IoOp::write, f, 100, buf.data(), 4096, 1}, "offset is not a multiple");
  expect_refused({IoOp::read, f, 4096, buf.data(), 4097, 1}, "length is not a multiple");
  expect_refused({IoOp::read, f, 0, buf.data(), 0, 1}, "length is 0");
  try {
    io->submit({IoOp::read, f + 7, 0, buf.data(), 4096, 1});
    ADD_FAILURE() << "accepted an unknown file id";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not open"), std::string::npos) << e.what();
  }
  // A batch with one bad request queues none of it.
  std::vector<IoRequest> batch{{IoOp::write, f, 0, buf.data(), 4096, 1},
                               {IoOp::write, f, 4096 + 1, buf.data(), 4096, 2}};
  EXPECT_THROW(io->submit(batch), Error);
  EXPECT_EQ(io->pending(), 0u);
  fill_pattern(buf.data(), buf.size(), 5, 0);
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, buf.data(), buf.size(), 3}});
  EXPECT_EQ(io->stats().bytes_written, buf.size());
}

TEST_P(FileIOTest, ReadingPastTheEndIsAnError) {
  MAKE_OR_SKIP(io);
  std::string dir = test::fresh_work_dir();
  int f = io->open(FileSpec{{dir + "/short.bin"}});
  AlignedBuffer buf(128 * KiB);
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, buf.data(), 64 * KiB, 1}});
  try {
    io->run(std::vector<IoRequest>{{IoOp::read, f, 0, buf.data(), 128 * KiB, 2}});
    FAIL() << "read past the end succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("end of file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset 65536"), std::string::npos) << e.what();
  }
  EXPECT_EQ(io->pending(), 0u);
}

// A writer that opens a file per save (the checkpoint's, for the whole run) must not grow the
// FileIO by an entry per file it ever opened: a closed file's id is given to the next open, and
// the file open beside it keeps its id and data.
TEST_P(FileIOTest, AClosedFilesIdIsTakenAgain) {
  MAKE_OR_SKIP(io);
  std::string dir = test::fresh_work_dir();
  const int kept = io->open(FileSpec{{dir + "/kept.bin"}});
  AlignedBuffer out(64 * KiB), in(64 * KiB);
  fill_pattern(out.data(), out.size(), 7, 0);
  io->run(std::vector<IoRequest>{{IoOp::write, kept, 0, out.data(), out.size(), 1}});
  std::set<int> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string path = dir + "/save_" + std::to_string(i % 3) + ".bin";
    const int f = io->open(FileSpec{{path}});
    ids.insert(f);
    io->run(std::vector<IoRequest>{{IoOp::write, f, 0, out.data(), 4096, 2}});
    EXPECT_EQ(io->describe(f), path);
    io->close(f);
    EXPECT_THROW(io->describe(f), Error) << "a closed id is not open";
  }
  EXPECT_EQ(ids.size(), 1u) << "each open took the slot the last close freed";
  EXPECT_EQ(ids.count(kept), 0u);
  io->run(std::vector<IoRequest>{{IoOp::read, kept, 0, in.data(), in.size(), 3}});
  EXPECT_EQ(check_pattern(in.data(), in.size(), 7, 0), -1);
}

TEST_P(FileIOTest, StripesOverTwoDirectories) {
  MAKE_OR_SKIP(io, 16, 256 * KiB);
  std::string d0 = test::fresh_work_dir("nvme0"), d1 = test::fresh_work_dir("nvme1");
  const uint64_t stripe = 64 * KiB, total = 2 * MiB + 3 * stripe;
  int f = io->open(FileSpec{{d0 + "/s.bin", d1 + "/s.bin"}, stripe});
  EXPECT_NE(io->describe(f).find(" + "), std::string::npos);
  AlignedBuffer out(total), in(total);
  fill_pattern(out.data(), total, 21, 0);
  io->run(std::vector<IoRequest>{{IoOp::write, f, 0, out.data(), total, 1}});
  io->run(std::vector<IoRequest>{{IoOp::read, f, 0, in.data(), total, 2}});
  ASSERT_EQ(check_pattern(in.data(), total, 21, 0), -1);

  // On disk: stripe i is in file i % 2 at (i / 2) * stripe.
  for (int member = 0; member < 2; ++member) {
    std::string path = (member ? d1 : d0) + "/s.bin";
    int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    AlignedBuffer piece(stripe);
    for (uint64_t s = member; s * stripe < total; s += 2) {
      ASSERT_EQ(::pread(fd, piece.data(), stripe, off_t(s / 2 * stripe)), ssize_t(stripe));
      ASSERT_EQ(check_pattern(piece.data(), stripe, 21, s * stripe), -1)
          << "stripe " << s << " not in " << path;
    }
    ::close(fd);
  }
  // Requests that straddle stripe boundaries, in one batch.
  std::vector<IoRequest> reads;
  std::vector<AlignedBuffer> bufs;
  const uint64_t offs[] = {stripe - 4096, 3 * stripe - 8192, 5 * stripe + 4096};
  for (size_t i = 0; i < std::size(offs); ++i) bufs.emplace_back(stripe + 12 * KiB);
  for (size_t i = 0; i < bufs.size(); ++i)
    reads.push_back({IoOp::read, f, offs[i], bufs[i].data(), bufs[i].size(), i});
  io->run(reads);
  for (size_t i = 0; i < bufs.size(); ++i)
    EXPECT_EQ(check_pattern(bufs[i].data(), bufs[i].size(), 21, offs[i]), -1) << "at " << offs[i];
}

// io.submit_batch: however many entries go to the kernel per io_uring_enter (one, two, a
// number that leaves a remainder, more than the depth), every request is written and read back
// whole, each completion once.
TEST(UringSubmitBatch, EveryBatchSizeMovesEveryRequest) {
  std::string dir = test::fresh_work_dir();
  const int depth = 16, n = 40;
  const uint64_t len = 3 * 64 * KiB + 4096;  // four chunks of 64K, the last short
  for (int batch : {1, 2, 3, 7, 4096}) {
    std::string why;
    auto backend = test::backend_or_skip("uring", depth, &why, batch);
    if (!backend) GTEST_SKIP() << why;
    IoOptions o;
    o.queue_depth = depth;
    o.block_size = 64 * KiB;
    o.submit_batch = batch;
    FileIO io(std::move(backend), o);
    int f = io.open(FileSpec{{str(dir, "/batch", batch, ".bin")}});
    AlignedBuffer out(n * len), in(n * len);
    fill_pattern(out.data(), n * len, uint64_t(batch), 0);
    std::vector<IoRequest> writes, reads;
    for (int i = 0; i < n; ++i) {
      writes.push_back({IoOp::write, f, i * len, out.data() + i * len, len, uint64_t(i)});
      reads.push_back({IoOp::read, f, i * len, in.data() + i * len, len, uint64_t(n + i)});
    }
    std::vector<IoCompletion> done;
    io.submit(writes);
    io.drain(&done);
    io.submit(reads);
    io.drain(&done);
    std::set<uint64_t> tags;
    for (const IoCompletion& c : done) tags.insert(c.tag);
    EXPECT_EQ(done.size(), size_t(2 * n)) << "batch " << batch;
    EXPECT_EQ(tags.size(), size_t(2 * n)) << "batch " << batch;
    EXPECT_EQ(check_pattern(in.data(), n * len, uint64_t(batch), 0), -1) << "batch " << batch;
    EXPECT_EQ(io.stats().chunks, uint64_t(2 * n * 4)) << "batch " << batch;
  }
}

TEST(UringSubmitBatch, RefusesABatchOutOfRange) {
  if (!uring_compiled()) GTEST_SKIP() << "built without io_uring";
  for (int batch : {0, 4097}) {
    try {
      make_uring_backend(4, batch);
      ADD_FAILURE() << "accepted io.submit_batch " << batch;
    } catch (const Error& e) {  // refused before any ring is made, so on every kernel
      EXPECT_NE(std::string(e.what()).find("io.submit_batch"), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FileIOTest, ::testing::Values("uring", "posix"),
                         [](const auto& info) { return info.param; });

TEST(MakeFileIO, ChoosesABackendAndRejectsUnknownNames) {
  std::string dir = test::fresh_work_dir();
  std::vector<std::string> dirs{dir};
  auto io = make_file_io(IoOptions{}, dirs);
  EXPECT_TRUE(io->backend_name() == "io_uring" || io->backend_name() == "posix");
  EXPECT_TRUE(io->direct());
  IoOptions posix;
  posix.backend = "posix";
  EXPECT_EQ(make_file_io(posix, dirs)->backend_name(), "posix");
  IoOptions bogus;
  bogus.backend = "aio";
  try {
    make_file_io(bogus, dirs);
    FAIL() << "accepted io.backend=aio";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto, uring, posix"), std::string::npos) << e.what();
  }
  IoOptions depth;
  depth.queue_depth = 0;
  EXPECT_THROW(make_file_io(depth, dirs), Error);
  IoOptions block;
  block.block_size = 1000;
  EXPECT_THROW(make_file_io(block, dirs), Error);
  EXPECT_THROW(make_file_io(IoOptions{}, std::vector<std::string>{dir + "/missing"}), Error);
}

TEST(ProbeDirectIO, ReadsTheAlignmentFromTheFileSystem) {
  std::string dir = test::fresh_work_dir();
  DirectProbe p = probe_direct_io(dir);
  EXPECT_TRUE(p.ok) << p.why;
  EXPECT_GE(p.alignment.offset, 512u);
  EXPECT_EQ(p.alignment.offset & (p.alignment.offset - 1), 0u) << "a power of two";
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the probe leaves no file behind";
}

}  // namespace
}  // namespace strata
