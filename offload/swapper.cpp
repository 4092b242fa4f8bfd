// offload/swapper.cpp — the swapper's worker: submits queued jobs to the FileIO and reaps
// completions, keeping the queue full while the engine computes; and the ticket rules and
// bounded waits of the engine's side.
//
// Everything the worker does sits inside one try: an exception from the FileIO, from the
// bookkeeping or from the trace fails the swapper (fail_all) rather than ending the thread, and
// the worker lives on until the destructor stops it.
#include "offload/swapper.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"

namespace strata {
namespace {
double ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}
// "0.25", "12.5", "600.0": seconds for messages.
std::string seconds(std::chrono::steady_clock::duration d) {
  const double s = std::chrono::duration<double>(d).count();
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.2f" : "%.1f", s);
  return buf;
}
std::chrono::steady_clock::duration checked_timeout(double s) {
  if (!(s > 0 && s <= 1e7))  // also refuses NaN
    fail("swapper::init", str("timeout ", s, " s is out of range"),
         "set parallel.timeout to a number of seconds between 0 and 1e7 (default 600)");
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}
}  // namespace

Swapper::Swapper(FileIO& io, double timeout_s)
    : io_(io), timeout_s_(timeout_s), timeout_(checked_timeout(timeout_s)) {
  worker_ = std::thread([this] { run(); });
}

Swapper::~Swapper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  {
    // The worker ends once the backend has answered what is in flight: a disk that stops
    // answering would hold this join, so it is watched like every other wait.
    WatchedWait w("the swapper's worker finishing the I/O in flight at shutdown", WaitKind::io,
                  watchdog_context());
    worker_.join();
  }
  const IoStats& s = io_.stats();
  log_debug("swapper", "stopped: ", s.requests, " request(s) in ", s.chunks, " chunk(s), ",
            s.fixed_chunks, " of them on registered buffers");
  if (registered_) {
    try {
      io_.unregister_buffers();
    } catch (const std::exception& e) {
      log_error("swapper", "unregistering the staging buffers at shutdown: ", e.what());
    }
  }
  if (error_ && !error_seen_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      log_error("swapper", "stopped after an error no caller waited for: ", e.what());
    } catch (...) {
    }
  }
}

Swapper::Ticket Swapper::submit(std::vector<IoRequest> requests, IoLane lane) {
  // On the caller's thread, so that a bad request throws here rather than failing the worker.
  io_.validate(requests);
  Job job;
  for (auto& r : requests) (r.op == IoOp::read ? job.read_bytes : job.write_bytes) += r.length;
  job.remaining = requests.size();
  job.lane = lane;
  job.requests = std::move(requests);
  job.submitted = Clock::now();
  job.submitted_us = trace_enabled() ? trace_now_us() : 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) rethrow_error();
  const Ticket t = next_;
  for (auto& r : job.requests) r.tag = t;
  if (job.remaining == 0) {
    finished_.insert(t);
  } else {
    jobs_.emplace(t, std::move(job));
    try {
      queued_.push_back(t);
    } catch (...) {
      jobs_.erase(t);
      throw;
    }
  }
  ++next_;
  work_cv_.notify_one();
  return t;
}

void Swapper::check_issued(Ticket t, const char* where) const {
  if (t == 0 || t >= next_)
    fail(where, str("ticket ", t, " was never issued (tickets issued so far: ",
                    next_ == 1 ? std::string("none") : str("1 to ", next_ - 1), ")"),
         "wait only for tickets that submit() returned, each once");
}

void Swapper::rethrow_error() {
  error_seen_ = true;
  std::rethrow_exception(error_);
}

bool Swapper::done(Ticket t) {
  std::lock_guard<std::mutex> lock(mu_);
  check_issued(t, "swapper::done");
  if (finished_.count(t)) return true;
  auto it = jobs_.find(t);
  if (it == jobs_.end())
    fail("swapper::done", str("ticket ", t, " was already waited for"),
         "each ticket is waited for once, by wait(ticket) or by a wait_all() after it");
  if (it->second.failed) rethrow_error();
  return false;
}

void Swapper::wait(Ticket t) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  check_issued(t, "swapper::wait");
  auto settled = [&] {
    auto it = jobs_.find(t);
    return it == jobs_.end() || it->second.failed;
  };
  if (!settled() && !done_cv_.wait_until(lock, t0 + timeout_, settled)) {
    const auto waited = Clock::now() - t0;
    stats_.wait_ms += ms(waited);
    fail("swapper::wait",
         str("ticket ", t, " has not completed after ", seconds(waited), " s: ",
             describe(t, jobs_.at(t))),
         str("the storage stopped answering or is far slower than expected: check `dmesg` and "
             "the drive's health; raise parallel.timeout (now ", timeout_s_,
             " s) if it is only slow. The job is still in flight: keep its buffers"));
  }
  stats_.wait_ms += ms(Clock::now() - t0);
  if (finished_.erase(t)) return;
  if (jobs_.count(t)) rethrow_error();  // failed, or abandoned by the failure
  fail("swapper::wait", str("ticket ", t, " was already waited for"),
       "each ticket is waited for once, by wait(ticket) or by a wait_all() after it");
}

void Swapper::wait_all() {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  auto settled = [&] { return error_ || jobs_.empty(); };
  if (!done_cv_.wait_until(lock, t0 + timeout_, settled)) {
    const auto waited = Clock::now() - t0;
    stats_.wait_ms += ms(waited);
    const auto& [oldest, job] = *jobs_.begin();
    fail("swapper::wait_all",
         str(jobs_.size(), " job(s) have not completed after ", seconds(waited),
             " s; the oldest is ticket ", oldest, ": ", describe(oldest, job)),
         str("the storage stopped answering or is far slower than expected: check `dmesg` and "
             "the drive's health; raise parallel.timeout (now ", timeout_s_,
             " s) if it is only slow. The jobs are still in flight: keep their buffers"));
  }
  stats_.wait_ms += ms(Clock::now() - t0);
  if (error_) rethrow_error();  // finished tickets stay, for wait(ticket) to report success
  finished_.clear();
}

bool Swapper::register_buffers(std::span<const std::span<std::byte>> regions) {
  // Under mu_ with no job: the worker is waiting for work or about to, and calls the FileIO only
  // for jobs, so this thread may drive it meanwhile (the lock orders the two).
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) rethrow_error();
  if (!jobs_.empty() || io_.pending() > 0)
    fail("swapper::register_buffers",
         str(jobs_.size(), " job(s) queued or in flight"),
         "register staging buffers before submitting, or after wait_all()");
  io_.register_buffers(regions);
  registered_ = !regions.empty();
  uint64_t bytes = 0;
  for (const auto& r : regions) bytes += r.size();
  log_debug("swapper", regions.size(), " staging region(s) of ", format_bytes(bytes), " in all: ",
            io_.buffers_registered() ? "registered" : "not registered", " with the ",
            io_.backend_name(), " backend");
  return io_.buffers_registered();
}

SwapperStats Swapper::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  SwapperStats s = stats_;
  stats_ = SwapperStats{};
  return s;
}

// "read of 64M in '/nvme0/strata-rank0.swap' (3 requests, submitted 12.5 s ago, in flight)"
std::string Swapper::describe(Ticket t, const Job& job) const {
  const char* kind = job.read_bytes && job.write_bytes ? "read+write"
                     : job.read_bytes                  ? "read"
                                                       : "write";
  std::string files = str("'", io_.describe(job.requests.front().file), "'");
  size_t others = 0;
  for (const IoRequest& r : job.requests) others += r.file != job.requests.front().file;
  if (others) files += str(" and other files");
  const bool queued = std::find(queued_.begin(), queued_.end(), t) != queued_.end();
  return str(kind, " of ", format_bytes(job.read_bytes + job.write_bytes), " in ", files, " (",
             job.requests.size(), " request(s), submitted ", seconds(Clock::now() - job.submitted),
             " s ago, ", queued ? "queued behind other jobs" : "in flight", "; ", jobs_.size(),
             " job(s) pending in all)");
}

void Swapper::run() {
  std::vector<IoCompletion> completions;
  std::vector<IoRequest> batch[kIoLanes];
  for (;;) {
    try {
      {
        std::unique_lock<std::mutex> lock(mu_);
        // After a failure the FileIO is not driven again: what it still holds (only when its
        // backend cannot be reaped) is left to its destructor.
        work_cv_.wait(lock, [&] {
          return stop_ || !queued_.empty() || (io_.pending() > 0 && !error_);
        });
        if (queued_.empty() && (io_.pending() == 0 || error_)) return;  // stop_, nothing left
        for (auto& b : batch) b.clear();
        for (Ticket t : queued_) {
          const Job& j = jobs_.at(t);
          std::vector<IoRequest>& to = batch[int(j.lane)];
          to.insert(to.end(), j.requests.begin(), j.requests.end());
        }
        queued_.clear();
      }
      const auto t0 = Clock::now();
      completions.clear();
      std::exception_ptr io_error;
      try {
        for (int l = 0; l < kIoLanes; ++l)
          if (!batch[l].empty()) io_.submit(batch[l], IoLane(l));
        if (io_.pending() > 0) io_.wait_progress(completions);  // back for new jobs per chunk
      } catch (...) {
        io_error = std::current_exception();  // FileIO drained first; `completions` are real
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.busy_ms += ms(Clock::now() - t0);
        finish(completions);
      }
      if (io_error) fail_all(io_error);
    } catch (...) {
      fail_all(std::current_exception());
    }
  }
}

void Swapper::finish(const std::vector<IoCompletion>& completions) {
  for (const auto& c : completions) {
    auto it = jobs_.find(c.tag);
    STRATA_CHECK(it != jobs_.end() && !it->second.failed, "swapper::run",
                 "a completion for ticket ", c.tag, ", which is not in flight");
    Job& j = it->second;
    if (--j.remaining > 0) continue;
    if (j.submitted_us && trace_enabled())
      trace_span(j.write_bytes ? "nvme write" : "nvme read",
                 str(j.write_bytes ? "write " : "read ", format_bytes(j.read_bytes + j.write_bytes)),
                 j.submitted_us, trace_now_us() - j.submitted_us, j.read_bytes + j.write_bytes);
    stats_.read_bytes += j.read_bytes;
    stats_.write_bytes += j.write_bytes;
    finished_.insert(c.tag);
    jobs_.erase(it);
  }
  if (!completions.empty()) done_cv_.notify_all();
}

// Fails every job not yet complete. The FileIO is drained first: a waiter told of the failure
// may free its buffers at once.
void Swapper::fail_all(std::exception_ptr error) {
  if (io_.pending() > 0) {
    try {
      io_.drain();
    } catch (const std::exception& e) {
      log_error("swapper", "draining the I/O queue after a failure: ", e.what());
    } catch (...) {
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_) error_ = error;
  for (auto& entry : jobs_) entry.second.failed = true;
  queued_.clear();
  done_cv_.notify_all();
}

}  // namespace strata
