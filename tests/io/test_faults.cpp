// tests/io/test_faults.cpp — FileIO's checks under injected faults, on each real backend: short
// transfers and -EAGAIN complete transparently with the right bytes; -EIO and -ENOSPC surface as
// one Error naming the path and offset, after everything in flight has drained; the same FileIO
// then works again.
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

  // n requests of one block each at offsets i * kBlock.
  std::vector<IoRequest> blocks(IoOp op, AlignedBuffer& buf, int n) {
    std::vector<IoRequest> r;
    for (int i = 0; i < n; ++i)
      r.push_back({op, file_, i * kBlock, buf.data() + i * kBlock, kBlock, uint64_t(i)});
    return r;
  }

  // Submits, waits; expects one Error. Checks that nothing was left in flight when it surfaced
  // and that the failed request was never reported complete. Returns the message.
  std::string expect_failure(const std::vector<IoRequest>& requests, uint64_t failed_tag) {
    std::vector<IoCompletion> done;
    io_->submit(requests);
    try {
      while (io_->pending()) io_->wait(1, done);
      ADD_FAILURE() << "no error surfaced";
      return "";
    } catch (const Error& e) {
      EXPECT_EQ(fault_->in_flight(), 0u) << "the error surfaced before the queue drained";
      EXPECT_EQ(fault_->inner_in_flight(), 0u);
      EXPECT_EQ(io_->pending(), 0u);
      for (const IoCompletion& c : done) EXPECT_NE(c.tag, failed_tag);
      return e.what();
    }
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

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::Values("uring", "posix"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata
