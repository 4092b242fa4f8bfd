// offload/swapper.cpp — the swapper's worker: submits queued jobs to the FileIO and reaps
// completions, keeping the queue full while the engine computes.
#include "offload/swapper.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"

namespace strata {
namespace {
using Clock = std::chrono::steady_clock;
double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
}  // namespace

Swapper::Swapper(FileIO& io) : io_(io) { worker_ = std::thread([this] { run(); }); }

Swapper::~Swapper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
}

Swapper::Ticket Swapper::submit(std::vector<IoRequest> requests) {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_if_failed();
  Ticket t = next_++;
  Job job;
  job.remaining = requests.size();
  for (auto& r : requests) {
    r.tag = t;
    (r.op == IoOp::read ? job.read_bytes : job.write_bytes) += r.length;
  }
  job.requests = std::move(requests);
  job.submitted_us = trace_enabled() ? trace_now_us() : 0;
  if (job.remaining == 0) {
    finished_[t] = true;
  } else {
    jobs_.emplace(t, std::move(job));
    queued_.push_back(t);
  }
  work_cv_.notify_one();
  return t;
}

void Swapper::rethrow_if_failed() {
  if (error_) std::rethrow_exception(error_);
}

bool Swapper::done(Ticket t) {
  std::lock_guard<std::mutex> lock(mu_);
  rethrow_if_failed();
  return finished_.count(t) != 0;
}

void Swapper::wait(Ticket t) {
  auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return error_ || finished_.count(t); });
  stats_.wait_ms += ms(Clock::now() - t0);
  rethrow_if_failed();
  finished_.erase(t);
}

void Swapper::wait_all() {
  auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return error_ || (jobs_.empty() && queued_.empty()); });
  stats_.wait_ms += ms(Clock::now() - t0);
  rethrow_if_failed();
  finished_.clear();
}

SwapperStats Swapper::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  SwapperStats s = stats_;
  stats_ = SwapperStats{};
  return s;
}

void Swapper::run() {
  std::vector<IoCompletion> completions;
  for (;;) {
    std::vector<IoRequest> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queued_.empty() || io_.pending() > 0; });
      if (stop_ && queued_.empty() && io_.pending() == 0) return;
      while (!queued_.empty()) {
        Job& j = jobs_.at(queued_.front());
        batch.insert(batch.end(), j.requests.begin(), j.requests.end());
        queued_.pop_front();
      }
    }
    auto t0 = Clock::now();
    try {
      if (!batch.empty()) io_.submit(batch);
      completions.clear();
      if (io_.pending() > 0) io_.wait(1, completions);
    } catch (...) {
      // FileIO drained before throwing: nothing is in flight. Fail every job, now and later.
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      jobs_.clear();
      queued_.clear();
      done_cv_.notify_all();
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.busy_ms += ms(Clock::now() - t0);
    for (const auto& c : completions) {
      auto it = jobs_.find(c.tag);
      if (it == jobs_.end()) continue;
      if (--it->second.remaining == 0) {
        const Job& j = it->second;
        if (j.submitted_us && trace_enabled())
          trace_span(j.write_bytes ? "nvme write" : "nvme read",
                     str(j.write_bytes ? "write " : "read ", format_bytes(j.read_bytes + j.write_bytes)),
                     j.submitted_us, trace_now_us() - j.submitted_us);
        stats_.read_bytes += it->second.read_bytes;
        stats_.write_bytes += it->second.write_bytes;
        finished_[c.tag] = true;
        jobs_.erase(it);
      }
    }
    if (!completions.empty()) done_cv_.notify_all();
  }
}

}  // namespace strata
