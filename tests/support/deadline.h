// tests/support/deadline.h — a deadline for one piece of a test: if the scope has not ended
// `seconds` after it began, the test prints what was running and ends the whole job (every rank
// under mpirun), so a hang is a failure with a message instead of a stuck CI.
//
// It watches from a thread of its own and needs nothing from the code under test; it does not
// try to unwind or recover the hung work (nothing can, safely).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "comm/comm_registry.h"

namespace strata::test {

class Deadline {
 public:
  Deadline(double seconds, std::string what) : what_(std::move(what)) {
    watcher_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lock(mu_);
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      if (cv_.wait_until(lock, until, [this] { return done_; })) return;
      std::fprintf(stderr, "HANG: %s did not finish within %.0f s; ending the job\n", what_.c_str(),
                   seconds);
      std::fflush(stdout);
      std::fflush(stderr);
      abort_world(3);  // under mpirun: every rank; plainly a no-op, then:
      std::_Exit(3);
    });
  }
  ~Deadline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    watcher_.join();
  }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread watcher_;
};

}  // namespace strata::test
