// offload/swapper.h — moves bytes between pinned host buffers and the NVMe swap space on a
// worker thread of its own, so the engine's thread only enqueues and, when it needs the data,
// waits for a ticket.
//
// submit() checks a job (any number of IoRequests, e.g. a unit's shard or one chunk of the
// optimizer states) on the caller's thread, hands it over and returns its ticket at once; the
// worker keeps the FileIO's queue full across jobs, and hands a job submitted meanwhile to the
// FileIO (in its lane) after the next chunk completes, not after a whole request already there.
// Buffers belong to the caller and must stay untouched until their job is waited for.
//
// Tickets: each is waited for once, by wait(ticket) or by a wait_all() called after it was
// issued. wait() or done() on ticket 0, on a ticket never issued, or on one already waited for
// is an immediate Error naming it (a bug in the caller), never a wait.
// Failures: the first I/O error, or any failure of the worker itself, fails the swapper. Every
// job not complete by then fails with that Error (naming path, offset, length): waiting for one
// rethrows it, as often as it is waited for; every later submit() throws it too, and wait_all()
// throws it while the swapper is failed. A job that completed before the failure still waits
// successfully. The worker drains the FileIO before it reports a failure, so no buffer of a
// failed job is still in use (unless the backend itself can no longer be reaped; that Error says
// so).
// Bounded waits: a wait() or wait_all() not satisfied after `timeout_s` throws an Error naming
// the ticket, the job (read or write, bytes, file) and how long it waited. The job stays in
// flight (its buffers in use) and may be waited for again. The destructor lets queued jobs
// finish and joins the worker; it returns once the backend has answered everything in flight.
// With tracing on, each job is a span on the track "nvme read" or "nvme write".
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "io/file_io.h"

namespace strata {

struct SwapperStats {
  uint64_t read_bytes = 0, write_bytes = 0;
  double busy_ms = 0;  // time with at least one job in flight
  double wait_ms = 0;  // time callers spent blocked in wait()
};

class Swapper {
 public:
  using Ticket = uint64_t;
  static constexpr double kDefaultTimeoutS = 600;  // parallel.timeout's default

  // timeout_s: how long one wait() or wait_all() may block; in (0, 1e7].
  explicit Swapper(FileIO& io, double timeout_s = kDefaultTimeoutS);
  ~Swapper();  // finishes queued jobs, then stops; an error no caller saw is logged
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  // Throws for invalid requests, or if failed. lane: FileIO::submit's — a job's bytes go to the
  // disk before those of every job of a later lane not yet started (the engine: a unit's compute
  // copy urgent, optimizer state reads normal, their write-backs bulk).
  Ticket submit(std::vector<IoRequest> requests, IoLane lane = IoLane::normal);
  void wait(Ticket ticket);
  void wait_all();
  bool done(Ticket ticket);  // never blocks; true once complete (it still needs its wait)
  SwapperStats take_stats();  // and reset them
  double timeout_s() const { return timeout_s_; }

  // Registers staging memory with the FileIO (io_uring fixed buffers, FileIO::register_buffers),
  // replacing the previous set; returns whether the backend took it (false on POSIX, or where
  // io_uring refused, with one warning; transfers then run unregistered). Only while no job is
  // queued or in flight: an Error otherwise. The memory must stay mapped until the next call or
  // the Swapper's end: its destructor unregisters, after the worker stopped.
  bool register_buffers(std::span<const std::span<std::byte>> regions);

 private:
  using Clock = std::chrono::steady_clock;
  struct Job {
    std::vector<IoRequest> requests;
    size_t remaining = 0;
    uint64_t read_bytes = 0, write_bytes = 0;
    Clock::time_point submitted;
    int64_t submitted_us = 0;  // for the trace: one span per job, submit to completion
    bool failed = false;       // the swapper failed before it completed
    IoLane lane = IoLane::normal;
  };
  void run();
  void finish(const std::vector<IoCompletion>& completions);  // with mu_ held
  void fail_all(std::exception_ptr error);
  // With mu_ held: throws unless 0 < ticket < next_.
  void check_issued(Ticket ticket, const char* where) const;
  [[noreturn]] void rethrow_error();  // with mu_ held
  std::string describe(Ticket ticket, const Job& job) const;

  FileIO& io_;
  const double timeout_s_;
  const Clock::duration timeout_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Ticket> queued_;
  std::map<Ticket, Job> jobs_;  // queued, in flight, or failed
  Ticket next_ = 1;
  std::unordered_set<Ticket> finished_;  // complete, not yet waited for
  std::exception_ptr error_;
  bool error_seen_ = false;  // error_ reached a caller
  bool stop_ = false;
  bool registered_ = false;  // a set of buffers is registered through this Swapper
  SwapperStats stats_;
  std::thread worker_;
};

}  // namespace strata
