// io/file_io.h — the file I/O seam: submit aligned reads and writes, wait for their completions.
//
// A FileIO is one queue of requests in flight over files it opened and registered once. It splits
// each request into chunks of at most `block_size` bytes (and at stripe boundaries), keeps up to
// `queue_depth` chunks in flight, and checks every result: -EAGAIN/-EINTR are requeued, a short
// transfer is resubmitted for the rest, anything else fails the request. Backends (io/backend.h):
// io_uring, POSIX on a thread pool, and a fault injector for tests. It does not cache, reorder
// for locality, or order overlapping requests; it does not allocate the caller's memory.
//
// Ownership: the caller owns every buffer and keeps it alive and untouched from submit() until
// its completion is returned by wait() (or until wait()/drain() throws, except as said below).
// Files belong to the FileIO and are closed by close() or its destructor (which drains first).
// Threads: one thread at a time may call a FileIO; it has no thread of its own to call back on.
// validate(), alignment(), file_direct() and describe() only read what open() set, and may be
// called from any thread while no open() or close() runs.
// Completions: a request's completion is delivered by wait() once all its bytes have moved.
// Errors (strata::Error): submit() throws for invalid requests (unaligned buffer, offset or length;
// unknown file) before queueing any request of the batch. When a chunk fails, no new chunk is
// started; wait() keeps reaping until nothing is in flight, then throws one Error naming the path,
// offset, length and errno text (and how many other requests failed or were abandoned). After
// that every request not yet returned is finished, nothing is in flight, and the FileIO is usable.
// Completions appended to `out` by the wait() that throws are real: those requests completed.
// Failures of the backend itself are handled the same way, so a wait() never waits for a chunk
// the backend does not hold: chunks it refuses at submission fail (submit() itself does not
// throw for them; the next wait() reports it), a result under an id not in flight is a failure,
// chunks it no longer holds fail as lost. The one exception: when reaping throws twice in a row,
// wait() throws at once with the chunks the backend still holds left pending (their buffers may
// still be in use); a later wait() or drain() retries. No call ever waits for ever unless the
// backend never answers an operation it holds (a hung device; the kernel's own I/O timeout
// usually turns that into -EIO).
//
// Example (two 8 MiB writes in flight, then a read of both):
//   auto io = make_file_io(IoOptions{}, {dir});
//   int f = io->open(FileSpec{{dir + "/a.bin"}});
//   io->submit({{IoOp::write, f, 0, buf0, 8 * MiB, 1}, {IoOp::write, f, 8 * MiB, buf1, 8 * MiB, 2}});
//   std::vector<IoCompletion> done;
//   while (io->pending()) io->wait(1, done);  // done gets tags 1 and 2, in completion order
//   io->run({{IoOp::read, f, 0, big, 16 * MiB, 3}});  // submit + wait for all
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class IoBackend;
struct RawResult;

// Chunks handed to the kernel per io_uring_enter (io.submit_batch). The kernel plugs a
// submission of more than two entries, and the plug merges neighbouring chunks into one request
// of up to the disk's max_sectors_kb: io.block_size then no longer says what the disk sees. On a
// virtio disk, 1M chunks submitted up to 32 at a time reached it as 4M requests, 7-9 in flight
// instead of 27, and moved 7-10 % less than the same chunks two at a time
// (bench/results/cpu-xeon-2core-2026-12-06-submit-batch.md). Larger batches save system calls
// where chunks are small.
inline constexpr int kDefaultSubmitBatch = 2;

struct IoOptions {
  std::string backend = "auto";      // auto | uring | posix (auto: io_uring + O_DIRECT when allowed)
  int queue_depth = 32;              // chunks in flight
  uint64_t block_size = 1ull << 20;  // largest chunk; a multiple of 4096
  int submit_batch = kDefaultSubmitBatch;  // io_uring: entries per io_uring_enter (above)
  bool direct = true;                // O_DIRECT where the file system allows it
  std::string name = "io";           // trace track "io:<name>" and log prefix
};

enum class IoOp : uint8_t { read, write };
std::string_view io_op_name(IoOp op);

// One file, or one logical file striped over several paths (stripe i lives on paths[i % n] at
// offset (i / n) * stripe_bytes; each path is typically on its own NVMe device).
struct FileSpec {
  std::vector<std::string> paths;
  uint64_t stripe_bytes = 1ull << 20;  // used when paths.size() > 1
  bool create = true;                  // create missing files (never truncates)
};

// O_DIRECT constraints of a file: buffer addresses are multiples of `memory`, offsets and
// lengths multiples of `offset` (from statx STATX_DIOALIGN, else the logical block size, else 4096).
struct Alignment {
  uint32_t memory = 4096;
  uint32_t offset = 4096;
};

struct IoRequest {
  IoOp op = IoOp::read;
  int file = -1;         // from open()
  uint64_t offset = 0;   // logical byte offset in the file
  void* buffer = nullptr;
  uint64_t length = 0;   // bytes; > 0
  uint64_t tag = 0;      // returned in the completion
};

// Which queue a request waits in before it is cut into chunks (FileIO::submit): urgent first,
// then normal, then bulk.
enum class IoLane { urgent, normal, bulk };
inline constexpr int kIoLanes = 3;

struct IoCompletion {
  uint64_t tag = 0;
  uint64_t bytes = 0;
};

struct IoStats {
  uint64_t requests = 0, chunks = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t requeued = 0;     // -EAGAIN / -EINTR resubmissions
  uint64_t resubmitted = 0;  // short transfers continued
  uint64_t failed = 0;       // chunks that failed for good
  uint64_t fixed_chunks = 0; // chunks that used a registered buffer
};

class FileIO {
 public:
  FileIO(std::unique_ptr<IoBackend> backend, IoOptions options);
  ~FileIO();  // drains (errors are logged, not thrown), then closes every file
  FileIO(const FileIO&) = delete;
  FileIO& operator=(const FileIO&) = delete;

  std::string_view backend_name() const;
  bool direct() const { return direct_; }  // O_DIRECT requested (a file may still fall back)
  const IoOptions& options() const { return options_; }

  // Opens and registers; returns the file id (the id of a closed file is given again).
  int open(const FileSpec& spec);
  void close(int file);            // nothing may be pending
  // Makes the file's data and size durable (fsync of every member); call after the writes to it
  // have completed. An Error names the path and the system's reason.
  void sync(int file);
  Alignment alignment(int file) const;
  bool file_direct(int file) const;  // opened with O_DIRECT
  const std::string& describe(int file) const;  // its path, or "a + b (stripe 1M)"

  // Staging buffers used for many requests: registered once (io_uring fixed buffers, split
  // into regions of at most 1 GiB), which saves pinning and mapping pages per request. A chunk
  // that lies wholly inside a registered region goes out as READ_FIXED/WRITE_FIXED; any other
  // buffer still works, on the plain path. Replaces the previous set; nothing may be pending.
  // The memory must stay mapped until unregister_buffers(), the next register_buffers() or the
  // FileIO's end: the kernel keeps the pages it pinned, so a region unmapped and mapped anew
  // while registered would be read into and written from the old pages. Not an error where
  // the backend cannot register (POSIX; io_uring refusing, e.g. over RLIMIT_MEMLOCK, with one
  // warning): requests then use the plain path and buffers_registered() is false.
  void register_buffers(std::span<const std::span<std::byte>> regions);
  void unregister_buffers();
  bool buffers_registered() const;      // the current set is registered (and not empty)
  bool file_registered(int file) const; // every path of it is in io_uring's fixed-file table

  // Throws what submit() would throw for these requests, and does nothing else.
  void validate(std::span<const IoRequest> requests) const;
  // lane: requests are cut into chunks lane by lane — every urgent one before any normal one,
  // every normal one before any bulk one; in submission order within a lane. Chunks already
  // handed to the backend are not preempted. (For transfers a pass waits on, queued beside
  // traffic nothing waits on yet.)
  void submit(std::span<const IoRequest> requests, IoLane lane = IoLane::normal);
  void submit(const IoRequest& request) { submit(std::span<const IoRequest>(&request, 1)); }
  // Blocks until at least `min_completions` requests completed (fewer if fewer are pending) and
  // appends them to `out`; returns how many were appended. wait(0, out) only polls.
  size_t wait(size_t min_completions, std::vector<IoCompletion>& out);
  // Blocks until the backend returns at least one chunk's result (not at all when no chunk is
  // in flight), then appends the requests that completed meanwhile to `out` (maybe none) and
  // returns how many. For a caller with requests to hand over between chunks: the Swapper's
  // worker submits a job queued meanwhile after the next chunk, not after a whole request.
  size_t wait_progress(std::vector<IoCompletion>& out);
  // Waits for every pending request; their completions go to `out` (or are dropped).
  void drain(std::vector<IoCompletion>* out = nullptr);
  // submit, then drain: for callers with nothing else pending.
  void run(std::span<const IoRequest> requests);
  size_t pending() const { return pending_requests_; }  // submitted, not yet returned

  const IoStats& stats() const { return stats_; }

 private:
  struct State;  // the queue's bookkeeping (io/file_io.cpp)
  void pump();
  size_t wait_for(size_t min_completions, bool any_chunk, std::vector<IoCompletion>& out);
  void refuse(size_t accepted, std::exception_ptr thrown);
  size_t complete(const RawResult& result, std::vector<IoCompletion>& out);
  size_t release(uint64_t slot, std::vector<IoCompletion>& out, bool finished);
  void lose_in_flight();
  void mark_failed(uint32_t job);
  void begin_abort(std::string where, std::string what, std::vector<std::string> hints);
  void record_failure(uint64_t slot, int err);
  [[noreturn]] void throw_failure();
  void end_busy_span();

  IoOptions options_;
  bool direct_ = true;
  size_t pending_requests_ = 0;
  IoStats stats_;
  std::unique_ptr<State> state_;
  std::unique_ptr<IoBackend> backend_;  // declared last: destroyed before the files close
};

// The FileIO for `options`, on the backend it names. "auto" uses io_uring where the kernel
// allows it and O_DIRECT works in every directory of `dirs`, else POSIX (one warning saying
// why). "uring" throws where io_uring is unavailable.
std::unique_ptr<FileIO> make_file_io(const IoOptions& options,
                                     std::span<const std::string> dirs = {});

}  // namespace strata
