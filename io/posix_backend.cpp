// io/posix_backend.cpp — the POSIX backend: pread/pwrite on a pool of worker threads.
//
// Used where io_uring or O_DIRECT is refused (tmpfs, old kernels, seccomp). Each worker makes
// exactly one pread/pwrite per operation and reports its raw result (bytes or -errno); FileIO
// continues short transfers and requeues -EINTR/-EAGAIN. Plain std::threads rather than oneTBB:
// these threads block in the kernel, which would starve a TBB arena meant for compute.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/watchdog.h"
#include "io/backend.h"

namespace strata {
namespace {

constexpr int kMaxThreads = 64;

class PosixBackend final : public IoBackend {
 public:
  explicit PosixBackend(int queue_depth) {
    int n = std::clamp(queue_depth, 1, kMaxThreads);
    workers_.reserve(size_t(n));
    try {
      for (int i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      stop();
      fail("io::posix", str("cannot start I/O threads: ", e.what()));
    }
  }
  ~PosixBackend() override { stop(); }

  std::string_view name() const override { return "posix"; }

  int add_file(int fd) override {
    std::lock_guard<std::mutex> lock(m_);
    for (size_t i = 0; i < fds_.size(); ++i)
      if (fds_[i] < 0) {
        fds_[i] = fd;
        return int(i);
      }
    fds_.push_back(fd);
    return int(fds_.size()) - 1;
  }
  void remove_file(int file) override {
    std::lock_guard<std::mutex> lock(m_);
    fds_.at(size_t(file)) = -1;
  }
  bool register_buffers(std::span<const iovec>) override { return false; }

  // One op at a time, so that a throw (std::bad_alloc from the queue) leaves exactly the ops
  // queued before it accepted and counted (io/backend.h).
  void submit(std::span<const RawOp> ops) override {
    {
      std::lock_guard<std::mutex> lock(m_);
      for (const RawOp& op : ops) {
        work_.push_back(op);
        ++in_flight_;
      }
    }
    if (ops.size() == 1) work_cv_.notify_one();
    else work_cv_.notify_all();
  }

  size_t reap(std::span<RawResult> out, size_t min_results) override {
    std::unique_lock<std::mutex> lock(m_);
    // Never more than it holds: a caller asking for more would otherwise wait for ever.
    const size_t want = std::min(min_results, in_flight_);
    done_cv_.wait(lock, [&] { return done_.size() >= want; });
    size_t n = std::min(out.size(), done_.size());
    std::copy_n(done_.begin(), n, out.begin());
    done_.erase(done_.begin(), done_.begin() + ptrdiff_t(n));
    in_flight_ -= n;
    return n;
  }

  size_t in_flight() const override {
    std::lock_guard<std::mutex> lock(m_);
    return in_flight_;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || !work_.empty(); });
      if (stopping_) return;
      RawOp op = work_.front();
      work_.pop_front();
      int fd = fds_[size_t(op.file)];
      lock.unlock();
      ssize_t rc = op.op == IoOp::read ? ::pread(fd, op.buffer, op.length, off_t(op.offset))
                                       : ::pwrite(fd, op.buffer, op.length, off_t(op.offset));
      int64_t result = rc < 0 ? -int64_t(errno) : int64_t(rc);
      lock.lock();
      done_.push_back(RawResult{op.id, result});
      done_cv_.notify_one();
    }
  }

  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lock(m_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    // A worker inside a pread or pwrite that never returns (a hung device) would hold this.
    WatchedWait w("the POSIX I/O backend's workers finish their reads and writes at shutdown",
                  WaitKind::io, watchdog_context());
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
  }

  mutable std::mutex m_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<RawOp> work_;
  std::vector<RawResult> done_;
  std::vector<int> fds_;
  size_t in_flight_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> make_posix_backend(int queue_depth) {
  return std::make_unique<PosixBackend>(queue_depth);
}

}  // namespace strata
