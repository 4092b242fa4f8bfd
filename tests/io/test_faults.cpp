// tests/io/test_faults.cpp — FileIO's checks under injected faults, on each real backend: short
// transfers and -EAGAIN complete transparently with the right bytes; -EIO and -ENOSPC surface as
// one Error naming the path and offset, after everything in flight has drained; the same FileIO
// then works again. Then failures of the backend itself (a submit that throws part-way, a reap
// that throws, a result under an unknown id): each surfaces as one Error, nothing stays counted
// that the backend does not hold, and no call hangs — every such call runs under test::within,
// so a regression that would spin or block fails in seconds. Last, io_uring for real when the
// kernel refuses io_uring_enter (a seccomp filter in a child process).
#include <sys/syscall.h>

#include <set>

#include "core/size.h"
#include "io/aligned_buffer.h"
#include "io/fault_backend.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

using test::check_pattern;
using test::fill_pattern;

constexpr uint64_t kBlock = 64 * KiB;

class FaultTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    auto inner = test::backend_or_skip(GetParam(), kDepth, &why);
    if (!inner) GTEST_SKIP() << why;
    auto fault = std::make_unique<FaultBackend>(std::move(inner), std::vector<FaultRule>{});
    fault_ = fault.get();
    IoOptions o;
    o.queue_depth = kDepth;
    o.block_size = kBlock;
    io_ = std::make_unique<FileIO>(std::move(fault), o);
    dir_ = test::fresh_work_dir();
    path_ = dir_ + "/faults.bin";
    file_ = io_->open(FileSpec{{path_}});
  }
  // The destructor drains: bounded too, so that a FileIO left counting what its backend does
  // not hold fails the test instead of hanging it.
  void TearDown() override {
    if (io_) test::within(10, [&] { io_.reset(); });
  }

  // n requests of one block each at offsets i * kBlock.
  std::vector<IoRequest> blocks(IoOp op, AlignedBuffer& buf, int n) {
    std::vector<IoRequest> r;
    for (int i = 0; i < n; ++i)
      r.push_back({op, file_, i * kBlock, buf.data() + i * kBlock, kBlock, uint64_t(i)});
    return r;
  }

  // Submits, waits; expects one Error. Checks that nothing was left in flight when it surfaced
  // and that no failed request was reported complete. Returns the message; `done` gets the
  // completions delivered on the way (including by the wait() that threw).
  std::string expect_failure(const std::vector<IoRequest>& requests, std::set<uint64_t> failed_tags,
                             std::vector<IoCompletion>* done = nullptr) {
    std::vector<IoCompletion> local;
    std::vector<IoCompletion>& out = done ? *done : local;
    return test::within(10, [&] {
      io_->submit(requests);
      try {
        while (io_->pending()) io_->wait(1, out);
        ADD_FAILURE() << "no error surfaced";
        return std::string();
      } catch (const Error& e) {
        EXPECT_EQ(fault_->in_flight(), 0u) << "the error surfaced before the queue drained";
        EXPECT_EQ(fault_->inner_in_flight(), 0u);
        EXPECT_EQ(io_->pending(), 0u);
        for (const IoCompletion& c : out) EXPECT_EQ(failed_tags.count(c.tag), 0u) << c.tag;
        return std::string(e.what());
      }
    });
  }
  std::string expect_failure(const std::vector<IoRequest>& requests, uint64_t failed_tag) {
    return expect_failure(requests, std::set<uint64_t>{failed_tag});
  }

  // The same FileIO still moves the right bytes: n blocks written and read back.
  void expect_usable(int n, uint64_t seed) {
    AlignedBuffer out(n * kBlock), in(n * kBlock);
    fill_pattern(out.data(), out.size(), seed, 0);
    test::within(10, [&] {
      io_->run(blocks(IoOp::write, out, n));
      io_->run(blocks(IoOp::read, in, n));
    });
    EXPECT_EQ(check_pattern(in.data(), in.size(), seed, 0), -1);
  }

  static constexpr int kDepth = 8;
  FaultBackend* fault_ = nullptr;
  std::unique_ptr<FileIO> io_;
  std::string dir_, path_;
  int file_ = -1;
};

TEST_P(FaultTest, ShortWritesAndReadsCompleteWithTheRightBytes) {
  const int n = 16;
  AlignedBuffer out(n * kBlock), in(n * kBlock);
  fill_pattern(out.data(), out.size(), 31, 0);
  // Rules are tried in order; an operation fires at most one. Resubmitted rests are operations
  // too, so "any offset" rules also shorten them.
  fault_->add_rule({Fault::short_transfer, int(IoOp::write), 3 * kBlock, 0, 1, 4096});
  fault_->add_rule({Fault::short_transfer, int(IoOp::write), UINT64_MAX, 2, 5, 0});
  io_->run(blocks(IoOp::write, out, n));
  fault_->add_rule({Fault::short_transfer, int(IoOp::read), UINT64_MAX, 0, 7, 0});
  io_->run(blocks(IoOp::read, in, n));
  EXPECT_EQ(fault_->fired(), 13);
  EXPECT_EQ(io_->stats().resubmitted, 13u);
  EXPECT_EQ(io_->stats().bytes_written, n * kBlock);
  EXPECT_EQ(io_->stats().bytes_read, n * kBlock);
  EXPECT_EQ(check_pattern(in.data(), in.size(), 31, 0), -1);
}

TEST_P(FaultTest, AgainIsRequeued) {
  const int n = 12;
  AlignedBuffer out(n * kBlock), in(n * kBlock);
  fill_pattern(out.data(), out.size(), 32, 0);
  fault_->add_rule({Fault::again, int(IoOp::write), 5 * kBlock, 0, 3});
  fault_->add_rule({Fault::again, int(IoOp::read), UINT64_MAX, 1, 6});
  io_->run(blocks(IoOp::write, out, n));
  io_->run(blocks(IoOp::read, in, n));
  EXPECT_EQ(fault_->fired(), 9);
  EXPECT_EQ(io_->stats().requeued, 9u);
  EXPECT_EQ(io_->stats().failed, 0u);
  EXPECT_EQ(check_pattern(in.data(), in.size(), 32, 0), -1);
}

TEST_P(FaultTest, EioSurfacesAfterDrainingAndTheEngineStaysUsable) {
  const int n = 24;
  AlignedBuffer out(n * kBlock), in(n * kBlock);
  fill_pattern(out.data(), out.size(), 33, 0);
  io_->run(blocks(IoOp::write, out, n));
  fault_->add_rule({Fault::io_error, int(IoOp::read), 5 * kBlock, 0, 1});
  std::string msg = expect_failure(blocks(IoOp::read, in, n), 5);
  EXPECT_NE(msg.find("[io::read]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(5 * kBlock)), std::string::npos) << msg;
  EXPECT_NE(msg.find("65536 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Input/output error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("EIO"), std::string::npos) << msg;
  EXPECT_NE(msg.find("drained"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  EXPECT_EQ(io_->stats().failed, 1u);

  // Later requests on the same engine work and read the right bytes.
  std::memset(in.data(), 0, in.size());
  io_->run(blocks(IoOp::read, in, n));
  EXPECT_EQ(check_pattern(in.data(), in.size(), 33, 0), -1);
}

TEST_P(FaultTest, EnospcOnAWriteNamesThePathAndOffset) {
  const int n = 20;
  AlignedBuffer out(n * kBlock), in(n * kBlock);
  fill_pattern(out.data(), out.size(), 34, 0);
  fault_->add_rule({Fault::no_space, int(IoOp::write), 9 * kBlock, 0, 1});
  // Faults in flight next to it still get handled while draining.
  fault_->add_rule({Fault::short_transfer, int(IoOp::write), 8 * kBlock, 0, 1, 4096});
  std::string msg = expect_failure(blocks(IoOp::write, out, n), 9);
  EXPECT_NE(msg.find("[io::write]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(9 * kBlock)), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("free space"), std::string::npos) << msg;

  io_->run(blocks(IoOp::write, out, n));
  io_->run(blocks(IoOp::read, in, n));
  EXPECT_EQ(check_pattern(in.data(), in.size(), 34, 0), -1);
}

TEST_P(FaultTest, AFailureInsideALargeRequestNamesBoth) {
  AlignedBuffer out(16 * kBlock);
  fault_->add_rule({Fault::io_error, int(IoOp::write), 11 * kBlock, 0, 1});
  std::string msg =
      expect_failure({{IoOp::write, file_, 0, out.data(), out.size(), 77}}, 77);
  EXPECT_NE(msg.find("offset " + std::to_string(11 * kBlock)), std::string::npos) << msg;
  EXPECT_NE(msg.find("part of a " + std::to_string(16 * kBlock) + "-byte write at offset 0"),
            std::string::npos)
      << msg;
}

TEST_P(FaultTest, EndlessAgainEventuallyFails) {
  AlignedBuffer out(kBlock);
  fault_->add_rule({Fault::again, -1, UINT64_MAX, 0, 1000000});
  std::string msg = expect_failure({{IoOp::write, file_, 0, out.data(), kBlock, 1}}, 1);
  EXPECT_NE(msg.find("Resource temporarily unavailable"), std::string::npos) << msg;
}

// ---- failures of the backend itself --------------------------------------------------------

TEST_P(FaultTest, ASubmitThatThrowsPartWayFailsOnlyWhatTheBackendRefused) {
  const int n = 6;  // one pump: all six chunks go to the backend in one submit
  AlignedBuffer out(n * kBlock);
  fault_->add_rule({Fault::submit_throws, int(IoOp::write), 3 * kBlock, 0, 1});
  std::vector<IoCompletion> done;
  std::string msg = expect_failure(blocks(IoOp::write, out, n), {3, 4, 5}, &done);
  EXPECT_NE(msg.find("[io::write]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("refused 3 of 6 chunk(s) at submission"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(3 * kBlock)), std::string::npos) << msg;
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
  EXPECT_NE(msg.find("injected submit failure"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 request(s) failed"), std::string::npos) << msg;
  // The three the backend accepted ran and completed.
  std::set<uint64_t> completed;
  for (const IoCompletion& c : done) completed.insert(c.tag);
  EXPECT_EQ(completed, (std::set<uint64_t>{0, 1, 2}));
  expect_usable(n, 51);
}

TEST_P(FaultTest, ASubmitThatThrowsInsideWaitNeverLeavesADrainSpinning) {
  // 20 requests over 8 slots: the refused chunk goes out in a later pump, from inside wait().
  const int n = 20;
  AlignedBuffer out(n * kBlock);
  fault_->add_rule({Fault::submit_throws, int(IoOp::write), 12 * kBlock, 0, 1});
  std::string msg = expect_failure(blocks(IoOp::write, out, n), 12);
  EXPECT_NE(msg.find("injected submit failure"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(12 * kBlock)), std::string::npos) << msg;
  // drain() and the destructor's drain end as well.
  fault_->add_rule({Fault::submit_throws, int(IoOp::write), 0, 0, 1});
  io_->submit(blocks(IoOp::write, out, n));
  EXPECT_THROW(test::within(10, [&] { io_->drain(); }), Error);
  EXPECT_EQ(io_->pending(), 0u);
  expect_usable(n, 52);
  io_->submit(blocks(IoOp::write, out, n));
  fault_->add_rule({Fault::submit_throws, -1, UINT64_MAX, 0, 1000});
  test::within(10, [&] { io_.reset(); });
}

TEST_P(FaultTest, ASubmitThatRefusesEverythingFailsAtTheNextWait) {
  const int n = 4;
  AlignedBuffer out(n * kBlock);
  fault_->add_rule({Fault::submit_throws, int(IoOp::write), 0, 0, 1});
  std::string msg = expect_failure(blocks(IoOp::write, out, n), {0, 1, 2, 3});
  EXPECT_NE(msg.find("refused 4 of 4 chunk(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0 other chunks in flight"), std::string::npos) << msg;
  expect_usable(n, 53);
}

TEST_P(FaultTest, AReapThatThrowsOnceLosesNoResult) {
  const int n = 12;
  AlignedBuffer out(n * kBlock), in(n * kBlock);
  fill_pattern(out.data(), out.size(), 54, 0);
  test::within(10, [&] { io_->run(blocks(IoOp::write, out, n)); });
  fault_->add_rule({Fault::reap_throws, int(IoOp::read), 2 * kBlock, 0, 1});
  std::vector<IoCompletion> done;
  std::string msg = expect_failure(blocks(IoOp::read, in, n), {}, &done);
  EXPECT_EQ(fault_->fired(), 1);
  EXPECT_NE(msg.find("[io::wait] reaping completions from the fault("), std::string::npos) << msg;
  EXPECT_NE(msg.find("injected reap failure"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0 request(s) failed"), std::string::npos) << msg;
  // The results the failed reap held back were delivered, and their bytes are right; the
  // requests not started yet were abandoned.
  std::set<uint64_t> completed;
  for (const IoCompletion& c : done) {
    completed.insert(c.tag);
    EXPECT_EQ(check_pattern(in.data() + c.tag * kBlock, kBlock, 54, c.tag * kBlock), -1) << c.tag;
  }
  EXPECT_EQ(completed.count(2), 1u);
  EXPECT_NE(msg.find(str(n - completed.size(), " abandoned")), std::string::npos) << msg;
  expect_usable(n, 55);
}

TEST_P(FaultTest, AReapThatKeepsThrowingReportsWhatTheBackendStillHolds) {
  const int n = 5;
  AlignedBuffer out(n * kBlock);
  fill_pattern(out.data(), out.size(), 56, 0);
  std::vector<IoCompletion> done;
  test::within(10, [&] {
    io_->submit(blocks(IoOp::write, out, n));
    fault_->fail_next_reaps(1000000);
    try {
      io_->wait(1, done);
      ADD_FAILURE() << "no error surfaced";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("failed again"), std::string::npos) << msg;
      EXPECT_NE(msg.find("still holds 5 chunk(s) of 5 pending request(s)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("call wait() or drain() again"), std::string::npos) << msg;
    }
    // Nothing was released: the backend may still be writing from the buffers.
    EXPECT_EQ(io_->pending(), 5u);
    EXPECT_EQ(fault_->in_flight(), 5u);
    EXPECT_THROW(io_->drain(), Error);  // each call throws at once; none spins
    EXPECT_EQ(io_->pending(), 5u);
    // Once the backend answers again, the drain ends with the first failure.
    fault_->fail_next_reaps(0);
    try {
      io_->drain(&done);
      ADD_FAILURE() << "no error surfaced";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("injected reap failure"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(io_->pending(), 0u);
  EXPECT_EQ(fault_->in_flight(), 0u);
  expect_usable(n, 57);
  // A FileIO destroyed while its backend cannot be reaped still ends.
  io_->submit(blocks(IoOp::write, out, n));
  fault_->fail_next_reaps(1000000);
  test::within(10, [&] { io_.reset(); });
}

TEST_P(FaultTest, AResultUnderAnUnknownIdFailsItsRequestInsteadOfHanging) {
  const int n = 6;
  AlignedBuffer out(n * kBlock);
  fault_->add_rule({Fault::unknown_id, int(IoOp::write), 4 * kBlock, 0, 1});
  std::string msg = expect_failure(blocks(IoOp::write, out, n), 4);
  EXPECT_NE(msg.find("[io::wait]"), std::string::npos) << msg;
  size_t at = msg.find("for op id ");
  ASSERT_NE(at, std::string::npos) << msg;
  EXPECT_TRUE(std::stoull(msg.substr(at + 10)) & FaultBackend::kUnknownIdBit) << msg;
  EXPECT_NE(msg.find("which is not in flight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 request(s) failed"), std::string::npos) << msg;
  expect_usable(n, 58);
}

TEST_P(FaultTest, AStalledChunkIsWaitedForUntilItIsReleased) {
  const int n = 4;
  AlignedBuffer out(n * kBlock), in(n * kBlock);
  fill_pattern(out.data(), out.size(), 59, 0);
  test::within(10, [&] { io_->run(blocks(IoOp::write, out, n)); });
  fault_->add_rule({Fault::stall, int(IoOp::read), 1 * kBlock, 0, 1});
  io_->submit(blocks(IoOp::read, in, n));
  std::vector<IoCompletion> done;
  test::within(10, [&] { io_->wait(3, done); });  // the three others complete
  EXPECT_EQ(done.size(), 3u);
  EXPECT_EQ(fault_->stalled(), 1u);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fault_->release_stalled();
  });
  test::within(10, [&] { io_->drain(&done); });
  release.join();
  EXPECT_EQ(done.size(), 4u);
  EXPECT_EQ(check_pattern(in.data(), in.size(), 59, 0), -1);
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::Values("uring", "posix"),
                         [](const auto& info) { return info.param; });

// io_uring when the kernel refuses io_uring_enter after the ring was set up: the entries it
// never took are retired, nothing is counted in flight, the requests fail with the kernel's
// answer, and the FileIO does not hang. With io.submit_batch 8 the four chunks go in one enter;
// with the default 2 the first enter is refused and the two chunks after it are never handed over.
TEST(UringRefusedDeathTest, RefusedEnterFailsTheBatchAndCountsNothing) {
  if (!uring_compiled()) GTEST_SKIP() << "not built with io_uring";
  std::string why;
  if (!test::backend_or_skip("uring", 8, &why)) GTEST_SKIP() << why;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::string dir = test::fresh_work_dir();
  auto refused_run = [&](int submit_batch) {
    IoOptions o;
    o.queue_depth = 8;
    o.block_size = kBlock;
    o.submit_batch = submit_batch;
    FileIO io(make_uring_backend(8, submit_batch), o);
    int f = io.open(FileSpec{{dir + "/refused.bin"}});
    AlignedBuffer buf(4 * kBlock);
    io.run(std::vector<IoRequest>{{IoOp::write, f, 0, buf.data(), buf.size(), 1}});
    if (!test::refuse_syscall(__NR_io_uring_enter, EPERM)) std::_Exit(20);
    std::vector<IoRequest> reqs;
    for (int i = 0; i < 4; ++i)
      reqs.push_back({IoOp::read, f, i * kBlock, buf.data() + i * kBlock, kBlock, uint64_t(i)});
    for (int round = 0; round < 2; ++round) {
      try {
        io.run(reqs);
        std::_Exit(21);
      } catch (const Error& e) {
        if (io.pending() != 0) std::_Exit(22);
        std::fprintf(stderr, "%s\n", e.what());
      }
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(refused_run(8), ::testing::ExitedWithCode(0),
              "refused 4 of 4 chunk.*io_uring_submit refused 4 entries.*EPERM");
  EXPECT_EXIT(refused_run(kDefaultSubmitBatch), ::testing::ExitedWithCode(0),
              "refused 4 of 4 chunk.*io_uring_submit refused 2 entries.*EPERM");
}

}  // namespace
}  // namespace strata
