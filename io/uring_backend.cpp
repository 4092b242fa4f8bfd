// io/uring_backend.cpp — the io_uring backend: one ring of queue_depth entries, files in a
// registered (fixed) table, staging buffers registered once, one io_uring_enter per
// io.submit_batch entries (io/file_io.h says why few).
//
// It moves chunks and reports raw results; requeueing, short transfers and errors are FileIO's
// (io/file_io.cpp). No SQPOLL: a kernel thread spinning per ring costs a core, and this machine
// class reaches the device's bandwidth without it. Compiled only when liburing is found; the
// stub is io/no_uring.cpp.
#include <liburing.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "io/backend.h"

namespace strata {
namespace {

constexpr unsigned kFileSlots = 256;  // fixed-file table size; more files use plain fds
constexpr uint64_t kRetired = ~uint64_t(0);  // user data of entries retired after a failed enter

class UringBackend final : public IoBackend {
 public:
  UringBackend(int queue_depth, int submit_batch)
      : depth_(unsigned(queue_depth)), submit_batch_(size_t(submit_batch)) {
    if (submit_batch < 1 || submit_batch > 4096)
      fail("io::uring", str("submit batch ", submit_batch, " is out of range 1..4096"),
           "set io.submit_batch between 1 and 4096");
    // SUBMIT_ALL keeps submitting a batch past an SQE that fails early (its error arrives as a
    // CQE like any other). COOP_TASKRUN: the kernel hands completions to the submitting thread
    // at its next entry into the kernel (or wakes it if it sleeps) instead of interrupting it
    // with an inter-processor interrupt, which in a VM costs an exit per completion batch.
    // TASKRUN_FLAG marks such pending work in the ring, so that a caller that only polls
    // (wait(0): io_uring_peek_batch_cqe) enters the kernel to run it and still sees completions.
    // Kernels before 5.19 (COOP_TASKRUN) or 5.18 (SUBMIT_ALL) refuse them with -EINVAL and get
    // fewer flags.
    int rc = -EINVAL;
    for (unsigned flags : {IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN |
                               IORING_SETUP_TASKRUN_FLAG,
                           unsigned(IORING_SETUP_SUBMIT_ALL), 0u}) {
      rc = io_uring_queue_init(depth_, &ring_, flags);
      if (rc != -EINVAL) break;
    }
    if (rc < 0)
      fail("io::uring", str("io_uring_queue_init(", depth_, ") refused: ", errno_string(-rc)),
           "the kernel or a seccomp filter disables io_uring (see "
           "/proc/sys/kernel/io_uring_disabled); io.backend=auto falls back to POSIX");
    ring_ok_ = true;
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    bool ops = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
               io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
               io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
               io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
    if (probe) io_uring_free_probe(probe);
    if (!ops) {
      io_uring_queue_exit(&ring_);
      ring_ok_ = false;
      fail("io::uring", "this kernel's io_uring lacks IORING_OP_READ/WRITE (Linux >= 5.6 needed)",
           "io.backend=auto falls back to POSIX");
    }
    // A sparse fixed-file table (5.19+), else one filled with -1 (older kernels), else none.
    if (io_uring_register_files_sparse(&ring_, kFileSlots) == 0) {
      fixed_files_ = true;
    } else {
      std::vector<int> empty(kFileSlots, -1);
      fixed_files_ = io_uring_register_files(&ring_, empty.data(), kFileSlots) == 0;
    }
    if (!fixed_files_)
      log_warn_once("io.uring.files", "io", "io_uring refused a registered file table; requests "
                    "name plain file descriptors (the kernel takes a file reference per request)");
    slot_used_.assign(fixed_files_ ? kFileSlots : 0, false);
  }

  ~UringBackend() override {
    if (ring_ok_) io_uring_queue_exit(&ring_);  // FileIO drained: nothing is in flight
  }

  std::string_view name() const override { return "io_uring"; }

  int add_file(int fd) override {
    File f{fd, -1};
    for (unsigned i = 0; fixed_files_ && i < kFileSlots; ++i) {
      if (slot_used_[i]) continue;
      if (io_uring_register_files_update(&ring_, i, &fd, 1) == 1) {
        slot_used_[i] = true;
        f.slot = int(i);
      }
      break;
    }
    for (size_t i = 0; i < files_.size(); ++i)
      if (files_[i].fd < 0) {
        files_[i] = f;
        return int(i);
      }
    files_.push_back(f);
    return int(files_.size()) - 1;
  }

  void remove_file(int file) override {
    File& f = files_.at(size_t(file));
    if (f.slot >= 0) {
      int none = -1;
      io_uring_register_files_update(&ring_, unsigned(f.slot), &none, 1);
      slot_used_[size_t(f.slot)] = false;
    }
    f = File{};
  }

  bool file_registered(int file) const override { return files_.at(size_t(file)).slot >= 0; }

  bool register_buffers(std::span<const iovec> regions) override {
    if (buffers_) {
      io_uring_unregister_buffers(&ring_);
      buffers_ = false;
    }
    if (regions.empty()) return true;
    int rc = io_uring_register_buffers(&ring_, regions.data(), unsigned(regions.size()));
    if (rc < 0) {
      uint64_t bytes = 0;
      for (const iovec& v : regions) bytes += v.iov_len;
      rlimit rl{};
      std::string limit = ::getrlimit(RLIMIT_MEMLOCK, &rl) != 0 ? std::string("unknown")
                          : rl.rlim_cur == RLIM_INFINITY         ? std::string("unlimited")
                                                                 : format_bytes(rl.rlim_cur);
      log_warn_once("io.uring.buffers", "io", "io_uring refused to register ", regions.size(),
                    " staging buffer(s) of ", format_bytes(bytes), " in all (",
                    errno_string(-rc), "): transfers from them run unregistered",
                    rc == -ENOMEM ? str("; registering pins the memory against the locked-memory "
                                        "limit (ulimit -l, now ", limit,
                                        "): raise it, or run with CAP_IPC_LOCK")
                                  : std::string());
      return false;
    }
    buffers_ = true;
    return true;
  }

  // Prepares an entry per op and hands them to the kernel, one io_uring_enter per submit_batch_
  // entries (in larger ones the kernel merges neighbours: io/file_io.h). Entries an
  // enter leaves queued (-EAGAIN/-EBUSY, or a kernel that stops at a failing entry) stay
  // accepted: the next enter (reap() makes one) submits them. When the enter fails outright, the
  // entries of this batch the kernel did not take are retired and the call throws, so exactly
  // the accepted prefix is counted in flight (io/backend.h).
  void submit(std::span<const RawOp> ops) override {
    size_t queued = 0;   // entries of this batch prepared so far
    size_t entered = 0;  // of them, handed to the kernel
    for (const RawOp& op : ops) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) {  // entries left behind by earlier enters (-EAGAIN/-EBUSY) fill the ring
        enter(queued);
        entered = queued;
        sqe = io_uring_get_sqe(&ring_);
        if (!sqe)
          fail("io::uring",
               str("submission queue full: the kernel took none of the ", io_uring_sq_ready(&ring_),
                   " queued entries (", queued, " of this batch of ", ops.size(), " accepted)"),
               "the kernel is short of memory or the completion queue overflowed; retry later");
      }
      const File& f = files_[size_t(op.file)];
      int target = f.slot >= 0 ? f.slot : f.fd;
      if (op.buffer_index >= 0) {
        if (op.op == IoOp::read)
          io_uring_prep_read_fixed(sqe, target, op.buffer, op.length, op.offset, op.buffer_index);
        else
          io_uring_prep_write_fixed(sqe, target, op.buffer, op.length, op.offset, op.buffer_index);
      } else {
        if (op.op == IoOp::read)
          io_uring_prep_read(sqe, target, op.buffer, op.length, op.offset);
        else
          io_uring_prep_write(sqe, target, op.buffer, op.length, op.offset);
      }
      if (f.slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, op.id);
      ++queued;
      ++in_flight_;
      if (queued - entered == submit_batch_) {
        enter(queued);
        entered = queued;
      }
    }
    if (entered < queued || ops.empty()) enter(queued);
  }

  size_t reap(std::span<RawResult> out, size_t min_results) override {
    if (min_results > 0) {
      for (;;) {
        int rc = io_uring_submit_and_wait(&ring_, unsigned(min_results));
        if (rc >= 0 || rc == -EAGAIN || rc == -EBUSY) {
          if (rc >= 0 || io_uring_cq_ready(&ring_) > 0) break;
          // The kernel is out of resources with nothing completed: let it catch up, without
          // spinning a core (the caller's wait is watched).
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          continue;
        }
        if (rc == -EINTR) continue;
        STRATA_URING_CHECK(rc);  // nothing reaped yet: every result stays in the ring
      }
    }
    io_uring_cqe* cqes[256];
    unsigned want = unsigned(std::min<size_t>(out.size(), 256));
    unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, want);
    size_t got = 0;
    for (unsigned i = 0; i < n; ++i) {
      uint64_t id = io_uring_cqe_get_data64(cqes[i]);
      if (id == kRetired) {
        --retired_;
        continue;
      }
      out[got++] = RawResult{id, cqes[i]->res};
    }
    io_uring_cq_advance(&ring_, n);
    in_flight_ -= got;
    return got;
  }

  size_t in_flight() const override { return in_flight_; }

 private:
  struct File {
    int fd = -1;
    int slot = -1;  // fixed-file index, or -1
  };

  // Hands queued entries to the kernel. -EAGAIN/-EBUSY leave them queued for the next enter.
  // Any other error: the last `batch` entries are this call's; those still in the submission
  // queue are retired and no longer counted, and it throws.
  void enter(size_t& batch) {
    for (;;) {
      int rc = io_uring_submit(&ring_);
      if (rc >= 0 || rc == -EAGAIN || rc == -EBUSY) return;
      if (rc == -EINTR) continue;
      const size_t left = std::min<size_t>(io_uring_sq_ready(&ring_), batch);
      retire_newest(unsigned(left));
      in_flight_ -= left;
      const size_t accepted = batch - left;
      batch = accepted;
      fail("io::uring",
           str("io_uring_submit refused ", left, " entries (", accepted,
               " of this batch were accepted before): ", errno_string(-rc)),
           "the kernel or a seccomp filter refused io_uring_enter; io.backend=posix avoids io_uring");
    }
  }

  // The newest `count` entries of the submission queue, which the kernel has not consumed, become
  // no-ops under kRetired: they touch no memory, and reap() drops their completions. (An entry
  // published to the kernel cannot be taken back; without SQPOLL the kernel reads it only inside
  // io_uring_enter, which only this thread calls.)
  void retire_newest(unsigned count) {
    const unsigned tail = ring_.sq.sqe_tail;
    for (unsigned i = 1; i <= count; ++i) {
      const unsigned pos = (tail - i) & ring_.sq.ring_mask;
      const unsigned index = ring_.sq.array ? ring_.sq.array[pos] : pos;
      io_uring_sqe* sqe = &ring_.sq.sqes[index];
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kRetired);
    }
    retired_ += count;
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  unsigned depth_;
  size_t submit_batch_;  // entries per io_uring_enter
  bool fixed_files_ = false;
  bool buffers_ = false;
  std::vector<bool> slot_used_;
  std::vector<File> files_;
  size_t in_flight_ = 0;  // accepted, not yet reaped (retired entries excluded)
  size_t retired_ = 0;    // retired entries whose completion has not come back
};

}  // namespace

bool uring_compiled() { return true; }

std::unique_ptr<IoBackend> make_uring_backend(int queue_depth, int submit_batch) {
  return std::make_unique<UringBackend>(queue_depth, submit_batch);
}

}  // namespace strata
