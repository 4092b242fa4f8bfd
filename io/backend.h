// io/backend.h — what a FileIO backend does: move one chunk per operation and report the raw
// result, nothing more.
//
// FileIO (io/file_io.cpp) owns the policy — splitting, queue depth, requeueing -EAGAIN,
// continuing short transfers, draining and error messages — so every backend, and the fault
// injector sitting between FileIO and a real backend, is checked by the same code. A backend
// never retries and never throws for a failed transfer: it returns the byte count or -errno.
// It throws (strata::Error) only when it cannot work at all (ring setup, a refused
// io_uring_enter, thread start).
//
// Contract: FileIO never has more than `queue_depth` operations submitted and not yet reaped;
// add_file/remove_file/register_buffers are called only when nothing is in flight; one thread
// calls a backend at a time.
//
// Accounting, which FileIO relies on to never count an operation the backend does not hold:
// - submit(ops) accepts the ops in order. It returns when it accepted all of them, or throws
//   when it cannot accept one: the ops accepted before that point (a prefix, possibly empty)
//   stay accepted, are counted by in_flight() and yield results as usual; the rest were never
//   started and touch no memory. FileIO learns the prefix from in_flight() and fails the rest.
// - reap() throws only without having returned anything: results not returned stay with the
//   backend and in_flight() still counts them.
// - in_flight() counts accepted operations whose result reap() has not returned. Each accepted
//   operation yields exactly one result, with the id it was submitted under.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/file_io.h"

namespace strata {

struct RawOp {
  uint64_t id = 0;          // FileIO's slot id, returned with the result
  IoOp op = IoOp::read;
  int file = -1;            // index from add_file()
  uint64_t offset = 0;      // in that file
  void* buffer = nullptr;
  uint32_t length = 0;
  int buffer_index = -1;    // registered buffer holding [buffer, buffer + length), or -1
};

struct RawResult {
  uint64_t id = 0;
  int64_t result = 0;  // bytes moved, or -errno
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual std::string_view name() const = 0;  // "io_uring", "posix", "fault(posix)"
  virtual int add_file(int fd) = 0;           // fd stays owned by the caller
  virtual void remove_file(int file) = 0;
  // Whether add_file() put the file in a registered (fixed) file table (io_uring only).
  virtual bool file_registered(int /*file*/) const { return false; }
  // Registers staging memory (fixed buffers): an op whose buffer_index is i uses regions[i].
  // Returns false where unsupported (POSIX) or refused (io_uring; one warning says why), and
  // then nothing is registered; `regions` empty unregisters.
  virtual bool register_buffers(std::span<const iovec> regions) = 0;
  // Accepts every op, or throws having accepted a prefix (see the accounting above).
  virtual void submit(std::span<const RawOp> ops) = 0;
  // Waits until at least `min_results` results are ready (0: poll), moves up to out.size() into
  // `out`, returns how many. May return fewer than min_results (never more than in_flight());
  // callers loop.
  virtual size_t reap(std::span<RawResult> out, size_t min_results) = 0;
  virtual size_t in_flight() const = 0;
};

// io_uring (io/uring_backend.cpp, or the io/no_uring.cpp stub that throws "not built with
// io_uring"). Throws where the kernel refuses io_uring or lacks the read/write opcodes.
// submit_batch: entries handed to the kernel per io_uring_enter (io/file_io.h says why few).
std::unique_ptr<IoBackend> make_uring_backend(int queue_depth,
                                              int submit_batch = kDefaultSubmitBatch);
bool uring_compiled();
// pread/pwrite on a pool of min(queue_depth, 64) threads.
std::unique_ptr<IoBackend> make_posix_backend(int queue_depth);

// "Input/output error (EIO)": errno's text and name, for messages.
std::string errno_string(int err);

// How a directory takes direct I/O: whether O_DIRECT opens and moves an aligned block there,
// and the alignment it needs. `why` says what was refused.
struct DirectProbe {
  bool ok = false;
  Alignment alignment;
  std::string why;
};
DirectProbe probe_direct_io(const std::string& dir);
// The O_DIRECT alignment of an open file: statx STATX_DIOALIGN, else the device's logical block
// size from sysfs, else 4096.
Alignment direct_alignment(int fd);

}  // namespace strata
