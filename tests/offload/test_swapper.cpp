// tests/offload/test_swapper.cpp — the Swapper's ticket rules, bounded waits and failures, over a
// fault-injecting backend on each real backend: jobs round-trip the right bytes; waiting for a
// ticket never issued or already waited for is an immediate Error; a wait past the timeout
// names the job; a ticket completed before a failure still succeeds while failed ones (and
// wait_all) report the Error; a backend that throws, loses ids or cannot be reaped fails the
// jobs without hanging anything, the destructor included; staging memory registered through
// the swapper is used for fixed transfers and released when it stops. Every call that could hang runs
// under test::within, so a regression fails in seconds instead of stalling CTest.
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"
#include "io/aligned_buffer.h"
#include "io/fault_backend.h"
#include "io/huge_pages.h"
#include "offload/swapper.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

using test::check_pattern;
using test::fill_pattern;
using test::within;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kBlock = 64 * KiB;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

class SwapperTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { open(8); }
  // The FileIO over a fault backend over the backend under test, `queue_depth` slots deep.
  void open(int queue_depth) {
    std::string why;
    auto inner = test::backend_or_skip(GetParam(), queue_depth, &why);
    if (!inner) GTEST_SKIP() << why;
    auto fault = std::make_unique<FaultBackend>(std::move(inner), std::vector<FaultRule>{});
    fault_ = fault.get();
    IoOptions o;
    o.queue_depth = queue_depth;
    o.block_size = kBlock;
    io_ = std::make_unique<FileIO>(std::move(fault), o);
    path_ = test::fresh_work_dir() + "/swap.bin";
    file_ = io_->open(FileSpec{{path_}});
  }
  void TearDown() override {
    if (fault_) fault_->release_stalled();
    within(10, [&] {
      swapper_.reset();
      io_.reset();
    });
  }
  void start(double timeout_s = Swapper::kDefaultTimeoutS) {
    swapper_ = std::make_unique<Swapper>(*io_, timeout_s);
  }
  // A job of `blocks` blocks starting at block `first`, on `buf` (which holds them all).
  std::vector<IoRequest> job(IoOp op, AlignedBuffer& buf, int first, int blocks) {
    std::vector<IoRequest> r;
    for (int i = first; i < first + blocks; ++i)
      r.push_back({op, file_, i * kBlock, buf.data() + i * kBlock, kBlock, 0});
    return r;
  }
  // Writes n blocks of pattern `seed` through the swapper and waits.
  void write_blocks(AlignedBuffer& out, int n, uint64_t seed) {
    fill_pattern(out.data(), n * kBlock, seed, 0);
    within(10, [&] { swapper_->wait(swapper_->submit(job(IoOp::write, out, 0, n))); });
  }

  FaultBackend* fault_ = nullptr;
  std::unique_ptr<FileIO> io_;
  std::unique_ptr<Swapper> swapper_;
  std::string path_;
  int file_ = -1;
};

TEST_P(SwapperTest, JobsRoundTripTheRightBytes) {
  trace_enable(true);  // the worker's trace code runs too
  start();
  const int n = 16;
  AlignedBuffer out(n * kBlock), in(n * kBlock);
  fill_pattern(out.data(), out.size(), 61, 0);
  std::vector<Swapper::Ticket> writes;
  for (int i = 0; i < n; i += 4) writes.push_back(swapper_->submit(job(IoOp::write, out, i, 4)));
  within(10, [&] {
    for (Swapper::Ticket t : writes) swapper_->wait(t);
  });
  std::vector<Swapper::Ticket> reads;
  for (int i = 0; i < n; i += 2) reads.push_back(swapper_->submit(job(IoOp::read, in, i, 2)));
  within(10, [&] { swapper_->wait_all(); });
  // Each job's span carries the bytes it moved, on the track of its direction.
  const std::string trace = test::fresh_work_dir() + "/swapper.trace.json";
  trace_write(trace);
  trace_enable(false);
  trace_clear();
  std::ifstream f(trace);
  const auto events = nlohmann::json::parse(f).at("traceEvents");
  std::map<int, std::string> track;
  for (const auto& e : events)
    if (e.at("ph") == "M")
      track[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
  std::map<std::string, std::pair<int, uint64_t>> moved;  // spans and bytes per NVMe track
  for (const auto& e : events) {
    if (e.at("ph") != "X") continue;
    auto& [spans, bytes] = moved[track.at(e.at("tid").get<int>())];
    ++spans;
    bytes += e.at("args").at("bytes").get<uint64_t>();
  }
  EXPECT_EQ(moved["nvme write"], std::make_pair(int(writes.size()), uint64_t(n) * kBlock));
  EXPECT_EQ(moved["nvme read"], std::make_pair(int(reads.size()), uint64_t(n) * kBlock));
  EXPECT_EQ(check_pattern(in.data(), in.size(), 61, 0), -1);
  SwapperStats s = swapper_->take_stats();
  EXPECT_EQ(s.write_bytes, n * kBlock);
  EXPECT_EQ(s.read_bytes, n * kBlock);
  // An empty job is complete at once.
  Swapper::Ticket empty = swapper_->submit({});
  EXPECT_TRUE(swapper_->done(empty));
  within(10, [&] { swapper_->wait(empty); });
}

// A job submitted while a long request is in flight reaches the FileIO after the next chunk,
// not after that request. One slot; a normal job of one 4-chunk request whose chunks 1 and 3
// stall. While chunk 1 is held, an urgent job arrives; chunk 1 released, the worker hands the
// urgent job over, which goes out before chunk 3 and completes while the normal job, held at
// chunk 3, cannot. (With the worker waiting for whole requests, the urgent job would wait for
// chunk 3's release: its wait times out.)
TEST_P(SwapperTest, AJobQueuedDuringALongRequestGoesOutAfterTheNextChunk) {
  within(10, [&] { io_.reset(); });
  open(1);
  if (IsSkipped()) return;
  start(5.0);
  AlignedBuffer out(8 * kBlock), in(8 * kBlock);
  write_blocks(out, 8, 67);
  fault_->add_rule({Fault::stall, int(IoOp::read), 1 * kBlock, 0, 1});
  fault_->add_rule({Fault::stall, int(IoOp::read), 3 * kBlock, 0, 1});
  Swapper::Ticket normal =
      swapper_->submit({{IoOp::read, file_, 0, in.data(), 4 * kBlock, 0}}, IoLane::normal);
  within(10, [&] {
    while (fault_->stalled() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  Swapper::Ticket urgent = swapper_->submit(job(IoOp::read, in, 6, 1), IoLane::urgent);
  fault_->release_stalled();  // chunk 1; chunk 3 stalls in its turn
  within(10, [&] { swapper_->wait(urgent); });
  EXPECT_FALSE(swapper_->done(normal));
  within(10, [&] {  // chunk 3 stalls (if it has not yet), then goes on
    while (fault_->stalled() == 0 && !swapper_->done(normal))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fault_->release_stalled();
    swapper_->wait(normal);
  });
  EXPECT_EQ(check_pattern(in.data(), 4 * kBlock, 67, 0), -1);
  EXPECT_EQ(check_pattern(in.data() + 6 * kBlock, kBlock, 67, 6 * kBlock), -1);
}

TEST_P(SwapperTest, RegisteredStagingIsUsedWhileIdleOnlyAndReleasedAtTheEnd) {
  start();
  HugePageBuffer staging(16 * kBlock);
  std::vector<std::span<std::byte>> regions{staging.span()};
  const bool took = swapper_->register_buffers(regions);
  if (!took && GetParam() == "uring" && !test::memlock_unbounded())
    GTEST_SKIP() << "io_uring refused to register staging buffers under this RLIMIT_MEMLOCK "
                    "without CAP_IPC_LOCK";
  EXPECT_EQ(took, GetParam() == "uring") << "io_uring registers; POSIX accepts it as a no-op";
  EXPECT_EQ(io_->buffers_registered(), took);
  // A job from the registered staging memory goes out on fixed buffers and moves the right bytes.
  fill_pattern(staging.data(), 8 * kBlock, 91, 0);
  std::vector<IoRequest> w, r;
  for (int i = 0; i < 8; ++i) {
    w.push_back({IoOp::write, file_, i * kBlock, staging.data() + i * kBlock, kBlock, 0});
    r.push_back({IoOp::read, file_, i * kBlock, staging.data() + (8 + i) * kBlock, kBlock, 0});
  }
  within(10, [&] { swapper_->wait(swapper_->submit(w)); });
  within(10, [&] { swapper_->wait(swapper_->submit(r)); });
  EXPECT_EQ(check_pattern(staging.data() + 8 * kBlock, 8 * kBlock, 91, 0), -1);
  EXPECT_EQ(io_->stats().fixed_chunks > 0, took);
  // Not while a job is in flight: an Error, and the job is unaffected.
  fault_->add_rule({Fault::stall, int(IoOp::read), 0, 0, 1});
  Swapper::Ticket t = swapper_->submit(r);
  within(10, [&] {
    while (fault_->stalled() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::string m = message_of([&] { swapper_->register_buffers(regions); });
  EXPECT_NE(m.find("[swapper::register_buffers] 1 job(s) queued or in flight"), std::string::npos)
      << m;
  fault_->release_stalled();
  within(10, [&] { swapper_->wait(t); });
  // The swapper's end unregisters (the FileIO outlives it here).
  within(10, [&] { swapper_.reset(); });
  EXPECT_FALSE(io_->buffers_registered());
}

TEST_P(SwapperTest, TicketsNeverIssuedOrAlreadyWaitedForAreImmediateErrors) {
  start();
  AlignedBuffer out(4 * kBlock);
  write_blocks(out, 2, 62);  // ticket 1, waited for
  Swapper::Ticket a = swapper_->submit(job(IoOp::write, out, 2, 1));
  Swapper::Ticket b = swapper_->submit(job(IoOp::write, out, 3, 1));
  within(10, [&] { swapper_->wait(a); });
  within(10, [&] { swapper_->wait_all(); });  // covers b
  within(5, [&] {
    std::string m = message_of([&] { swapper_->wait(0); });
    EXPECT_NE(m.find("[swapper::wait] ticket 0 was never issued (tickets issued so far: 1 to 3)"),
              std::string::npos) << m;
    EXPECT_NE(m.find("hint: wait only for tickets that submit() returned"), std::string::npos) << m;
    m = message_of([&] { swapper_->wait(4); });
    EXPECT_NE(m.find("ticket 4 was never issued"), std::string::npos) << m;
    m = message_of([&] { swapper_->wait(a); });
    EXPECT_NE(m.find("ticket 2 was already waited for"), std::string::npos) << m;
    m = message_of([&] { swapper_->wait(b); });  // by the wait_all()
    EXPECT_NE(m.find("ticket 3 was already waited for"), std::string::npos) << m;
    m = message_of([&] { swapper_->done(1); });
    EXPECT_NE(m.find("[swapper::done] ticket 1 was already waited for"), std::string::npos) << m;
    m = message_of([&] { swapper_->done(99); });
    EXPECT_NE(m.find("ticket 99 was never issued"), std::string::npos) << m;
  });
  // The swapper is not failed by a caller's mistake.
  within(10, [&] { swapper_->wait(swapper_->submit(job(IoOp::write, out, 0, 1))); });
}

TEST_P(SwapperTest, AnInvalidRequestThrowsFromSubmitAndFailsNothing) {
  start();
  AlignedBuffer out(2 * kBlock);
  std::vector<IoRequest> bad = job(IoOp::write, out, 0, 1);
  bad[0].offset = 100;  // not aligned
  std::string m = message_of([&] { swapper_->submit(bad); });
  EXPECT_NE(m.find("offset is not a multiple"), std::string::npos) << m;
  within(10, [&] { swapper_->wait(swapper_->submit(job(IoOp::write, out, 0, 2))); });
}

TEST_P(SwapperTest, AWaitPastTheTimeoutNamesTheJobAndTheJobCanStillBeWaitedFor) {
  start(0.25);
  AlignedBuffer out(4 * kBlock), in(4 * kBlock);
  write_blocks(out, 4, 63);
  fault_->add_rule({Fault::stall, int(IoOp::read), 2 * kBlock, 0, 1});
  Swapper::Ticket t = swapper_->submit(job(IoOp::read, in, 0, 4));
  const auto t0 = Clock::now();
  std::string m = within(10, [&] { return message_of([&] { swapper_->wait(t); }); });
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 5.0);
  EXPECT_NE(m.find(str("[swapper::wait] ticket ", t, " has not completed after 0.2")),
            std::string::npos) << m;
  EXPECT_NE(m.find("read of 256K in '" + path_ + "' (4 request(s)"), std::string::npos) << m;
  EXPECT_NE(m.find("in flight"), std::string::npos) << m;
  EXPECT_NE(m.find("raise parallel.timeout (now 0.25 s)"), std::string::npos) << m;
  m = within(10, [&] { return message_of([&] { swapper_->wait_all(); }); });
  EXPECT_NE(m.find("[swapper::wait_all] 1 job(s) have not completed after 0.2"), std::string::npos)
      << m;
  EXPECT_NE(m.find(str("the oldest is ticket ", t, ": read of 256K")), std::string::npos) << m;
  EXPECT_FALSE(swapper_->done(t));
  // Released, the job completes and its ticket waits normally. (Poll done() first: the wait's
  // own bound is the 0.25 s above, which a loaded machine can take just to finish the read.)
  fault_->release_stalled();
  within(10, [&] {
    while (!swapper_->done(t)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    swapper_->wait(t);
  });
  EXPECT_EQ(check_pattern(in.data(), in.size(), 63, 0), -1);
}

TEST_P(SwapperTest, ATicketCompletedBeforeAFailureSucceedsAndFailedOnesReportTheError) {
  start();
  AlignedBuffer out(8 * kBlock);
  fill_pattern(out.data(), out.size(), 64, 0);
  Swapper::Ticket a = swapper_->submit(job(IoOp::write, out, 0, 2));
  within(10, [&] {
    while (!swapper_->done(a)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  fault_->add_rule({Fault::io_error, int(IoOp::write), 5 * kBlock, 0, 1});
  Swapper::Ticket b = swapper_->submit(job(IoOp::write, out, 4, 2));
  std::string m = within(10, [&] { return message_of([&] { swapper_->wait(b); }); });
  EXPECT_NE(m.find("[io::write]"), std::string::npos) << m;
  EXPECT_NE(m.find(path_), std::string::npos) << m;
  EXPECT_NE(m.find("offset " + std::to_string(5 * kBlock)), std::string::npos) << m;
  EXPECT_NE(m.find("Input/output error"), std::string::npos) << m;
  within(10, [&] {
    swapper_->wait(a);  // completed before the failure
    // The failed ticket reports the same Error each time; so do wait_all(), done() and submit().
    EXPECT_EQ(message_of([&] { swapper_->wait(b); }), m);
    EXPECT_EQ(message_of([&] { swapper_->wait_all(); }), m);
    EXPECT_EQ(message_of([&] { swapper_->done(b); }), m);
    EXPECT_EQ(message_of([&] { swapper_->submit(job(IoOp::write, out, 0, 1)); }), m);
  });
  EXPECT_EQ(io_->pending(), 0u);
  EXPECT_EQ(fault_->in_flight(), 0u);
}

TEST_P(SwapperTest, WaitAllReportsAFailureNoOtherWaitSaw) {
  start();
  AlignedBuffer out(8 * kBlock);
  fault_->add_rule({Fault::no_space, int(IoOp::write), 1 * kBlock, 0, 1});
  std::vector<Swapper::Ticket> tickets;
  // A submit after the worker met the failure throws it (the swapper refuses work once failed).
  std::string refused;
  for (int i = 0; i < 8 && refused.empty(); i += 2) {
    try {
      tickets.push_back(swapper_->submit(job(IoOp::write, out, i, 2)));
    } catch (const Error& e) {
      refused = e.what();
    }
  }
  ASSERT_FALSE(tickets.empty());
  std::string m = within(10, [&] { return message_of([&] { swapper_->wait_all(); }); });
  EXPECT_NE(m.find("No space left on device"), std::string::npos) << m;
  if (!refused.empty()) {
    EXPECT_EQ(refused, m);
  }
  // The ticket that failed still reports it afterwards; it was not dropped by wait_all().
  EXPECT_EQ(within(10, [&] { return message_of([&] { swapper_->wait(tickets[0]); }); }), m);
}

TEST_P(SwapperTest, ABackendSubmitThatThrowsFailsEveryJobAndNothingHangs) {
  start();
  AlignedBuffer out(16 * kBlock);
  fault_->add_rule({Fault::submit_throws, int(IoOp::write), 6 * kBlock, 0, 1});
  std::vector<Swapper::Ticket> tickets;
  // Once the worker has met the failure, the swapper refuses new jobs with it: depending on how
  // far the worker got, a later submit throws instead of returning a ticket (slow under TSan).
  bool failed = false;
  for (int i = 0; i < 16 && !failed; i += 2) {
    try {
      tickets.push_back(swapper_->submit(job(IoOp::write, out, i, 2)));
    } catch (const Error& e) {
      failed = true;
      EXPECT_NE(std::string(e.what()).find("injected submit failure"), std::string::npos) << e.what();
    }
  }
  within(10, [&] {
    for (Swapper::Ticket t : tickets) {
      try {
        swapper_->wait(t);
      } catch (const Error& e) {
        failed = true;
        EXPECT_NE(std::string(e.what()).find("injected submit failure"), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(failed);
    EXPECT_THROW(swapper_->wait_all(), Error);
  });
  EXPECT_EQ(io_->pending(), 0u);
  EXPECT_EQ(fault_->in_flight(), 0u);
}

TEST_P(SwapperTest, AResultUnderAnUnknownIdFailsTheSwapperInsteadOfHangingIt) {
  start();
  AlignedBuffer out(4 * kBlock);
  fault_->add_rule({Fault::unknown_id, int(IoOp::write), 2 * kBlock, 0, 1});
  Swapper::Ticket t = swapper_->submit(job(IoOp::write, out, 0, 4));
  std::string m = within(10, [&] { return message_of([&] { swapper_->wait(t); }); });
  EXPECT_NE(m.find("which is not in flight"), std::string::npos) << m;
  EXPECT_EQ(io_->pending(), 0u);
}

TEST_P(SwapperTest, ABackendThatCannotBeReapedFailsTheJobsAndTheDestructorsEnd) {
  start();
  AlignedBuffer out(4 * kBlock);
  fault_->fail_next_reaps(1000000);
  Swapper::Ticket t = swapper_->submit(job(IoOp::write, out, 0, 4));
  std::string m = within(10, [&] { return message_of([&] { swapper_->wait(t); }); });
  EXPECT_NE(m.find("injected reap failure"), std::string::npos) << m;
  EXPECT_NE(m.find("still holds"), std::string::npos) << m;
  // The worker does not spin on the FileIO it can no longer reap, and both destructors end
  // (TearDown runs them under within()); the FileIO's logs what it leaves behind.
  EXPECT_THROW(within(10, [&] { swapper_->wait_all(); }), Error);
  // The backend still holds the writes, so their buffer may still be in use (file_io.h: reaping
  // that keeps throwing leaves chunks pending): the swapper and the FileIO, whose destructor
  // stops the backend, end here, before `out` is freed (ThreadSanitizer saw a worker's pwrite
  // race the free when `out` went first).
  within(10, [&] {
    swapper_.reset();
    io_.reset();
  });
  fault_ = nullptr;  // owned by io_
}

// A destructor held by a disk that does not answer is a watched wait: while a read is stalled,
// the swapper's destructor blocks in its worker's join, and the watchdog's report names it.
// (Unwatched, a run ending on the swapper's timeout Error would hang there without a word.)
TEST_P(SwapperTest, TheDestructorsJoinIsAWatchedWait) {
  start();
  AlignedBuffer out(2 * kBlock), in(2 * kBlock);
  write_blocks(out, 2, 69);
  fault_->add_rule({Fault::stall, int(IoOp::read), 0, 0, 1});
  swapper_->submit(job(IoOp::read, in, 0, 2));
  within(10, [&] {
    while (fault_->stalled() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::thread closer([&] { swapper_.reset(); });
  const std::string want = "the swapper's worker finishing the I/O in flight at shutdown";
  std::string report;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (report.find(want) == std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    report = watchdog_report_now(0);
  }
  fault_->release_stalled();
  within(10, [&] { closer.join(); });
  EXPECT_NE(report.find(want), std::string::npos) << "no watched wait while the destructor "
                                                     "blocked; the report:\n" << report;
  EXPECT_EQ(check_pattern(in.data(), in.size(), 69, 0), -1);
}

TEST_P(SwapperTest, TheDestructorFinishesQueuedJobsAndEndsAfterAFailure) {
  start();
  AlignedBuffer out(16 * kBlock), in(16 * kBlock);
  fill_pattern(out.data(), out.size(), 65, 0);
  for (int i = 0; i < 16; i += 2) swapper_->submit(job(IoOp::write, out, i, 2));
  within(10, [&] { swapper_.reset(); });  // queued jobs are finished first
  start();
  within(10, [&] { swapper_->wait(swapper_->submit(job(IoOp::read, in, 0, 16))); });
  EXPECT_EQ(check_pattern(in.data(), in.size(), 65, 0), -1);
  fault_->add_rule({Fault::io_error, -1, UINT64_MAX, 0, 1});
  // Jobs queued behind the one that fails. The worker may fail the swapper before this loop
  // ends (it did under ThreadSanitizer), and a submit after that throws the failure; the loop
  // stops there.
  for (int i = 0; i < 16; i += 2) {
    try {
      swapper_->submit(job(IoOp::write, out, i, 2));
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
      break;
    }
  }
  within(10, [&] { swapper_.reset(); });  // nobody waited: logged, not thrown
  EXPECT_EQ(io_->pending(), 0u);
}

TEST(Swapper, ATimeoutOutOfRangeIsRefused) {
  IoOptions o;
  FileIO io(make_posix_backend(4), o);
  for (double bad : {0.0, -1.0, 2e7, std::nan("")}) {
    std::string m = message_of([&] { Swapper s(io, bad); });
    EXPECT_NE(m.find("[swapper::init] timeout"), std::string::npos) << m;
    EXPECT_NE(m.find("parallel.timeout"), std::string::npos) << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapperTest, ::testing::Values("uring", "posix"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata
