// offload/swapper.h — moves bytes between pinned host buffers and the NVMe swap space on a
// worker thread of its own, so the engine's thread only enqueues and, when it needs the data,
// waits for a ticket.
//
// submit() hands over a job (any number of IoRequests, e.g. a unit's shard or one chunk of the
// optimizer states) and returns at once; the worker keeps the FileIO's queue full across jobs.
// wait(ticket) blocks until that job's bytes have all moved. After an I/O error the swapper is
// failed: the job's waiters and every later wait() throw that Error (naming path, offset,
// length), so a step that hit it stops and nothing after it is reported as written.
// With tracing on, each job is a span on the track "nvme read" or "nvme write".
// Buffers belong to the caller and must stay untouched until their job is waited for.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
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

  explicit Swapper(FileIO& io);
  ~Swapper();  // finishes queued jobs, then stops; errors are logged
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  Ticket submit(std::vector<IoRequest> requests);
  void wait(Ticket ticket);
  void wait_all();
  bool done(Ticket ticket);  // never blocks; throws the error if the swapper failed
  SwapperStats take_stats();  // and reset them

 private:
  struct Job {
    std::vector<IoRequest> requests;
    size_t remaining = 0;
    uint64_t read_bytes = 0, write_bytes = 0;
    int64_t submitted_us = 0;  // for the trace: one span per job, submit to completion
  };
  void run();
  void rethrow_if_failed();  // with mu_ held

  FileIO& io_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Ticket> queued_;
  std::map<Ticket, Job> jobs_;  // queued or in flight
  Ticket next_ = 1;
  std::map<Ticket, bool> finished_;  // done, not yet waited for
  std::exception_ptr error_;
  bool stop_ = false;
  SwapperStats stats_;
  std::thread worker_;
};

}  // namespace strata
