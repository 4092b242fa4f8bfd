// engine/checkpoint_writer.cpp — the writer thread: one rank's file through the I/O engine, the
// gather of sizes and hashes, and rank 0's commit.
#include "engine/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"
#include "comm/comm.h"
#include "engine/test_hooks.h"
#include "io/file_io.h"
#include "kernels/device.h"

namespace strata {
namespace fs = std::filesystem;

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

CheckpointWriter::CheckpointWriter(Communicator& comm, CheckpointWriterOptions options)
    : comm_(comm), opt_(std::move(options)) {
  STRATA_CHECK(!opt_.root.empty(), "checkpoint::writer", "no checkpoint.dir");
  STRATA_CHECK(opt_.depth >= 2 && opt_.chunk_bytes >= 4096 && opt_.chunk_bytes % 4096 == 0,
               "checkpoint::writer", "bad staging shape");
  cpu_ = make_device(DeviceKind::cpu);
  stream_ = cpu_->make_stream("checkpoint");
  std::error_code ec;
  fs::create_directories(opt_.root, ec);
  if (ec)
    fail("checkpoint::init", str("cannot create checkpoint.dir '", opt_.root, "': ", ec.message()),
         "set checkpoint.dir to a writable folder (on a fast local disk)");
  // One queue for every save: io_uring with O_DIRECT where the root's file system allows it.
  IoOptions io;
  io.backend = opt_.io_backend;
  io.queue_depth = opt_.io_queue_depth;
  io.block_size = opt_.io_block_size;
  io.submit_batch = opt_.io_submit_batch;
  io.name = "checkpoint";
  fio_ = make_file_io_with_faults(io, std::vector<std::string>{opt_.root},
                                  opt_.test_hooks ? &opt_.test_hooks->checkpoint_io_faults : nullptr);
  worker_ = std::thread([this] { run(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_) {  // a save still in flight ends first, under the watchdog like every wait here
      WatchedWait w(str("the checkpoint save of step ", job_ ? job_->manifest.step : -1,
                        ", still in flight as the writer shuts down"),
                    WaitKind::io, watchdog_context());
      cv_.wait(lock, [&] { return done_; });
    }
    stop_ = true;
    if (error_) {
      try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        log_warn("checkpoint", "a save failed and nobody asked for its error: ", e.what());
      }
    }
  }
  cv_.notify_all();
  worker_.join();
}

void CheckpointWriter::rethrow_locked(std::unique_lock<std::mutex>&) {
  if (error_) std::rethrow_exception(error_);  // sticky: a failed save ends the run
}

void CheckpointWriter::start(CheckpointManifest manifest, std::vector<CheckpointBlock> blocks,
                             CheckpointSource& source) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    WatchedWait w(str("the previous checkpoint save (step ", job_ ? job_->manifest.step : -1, ")"),
                  WaitKind::io, watchdog_context());
    cv_.wait(lock, [&] { return done_; });
  }
  rethrow_locked(lock);
  job_ = std::make_unique<Job>(Job{std::move(manifest), std::move(blocks), &source});
  reads_done_ = done_ = false;
  cv_.notify_all();
}

void CheckpointWriter::wait_reads() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!reads_done_) {
    WatchedWait w("the checkpoint save reading the optimizer states", WaitKind::io, watchdog_context());
    cv_.wait(lock, [&] { return reads_done_; });
  }
  rethrow_locked(lock);
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    WatchedWait w("the checkpoint save", WaitKind::io, watchdog_context());
    cv_.wait(lock, [&] { return done_; });
  }
  rethrow_locked(lock);
}

void CheckpointWriter::poll() {
  std::unique_lock<std::mutex> lock(mu_);
  rethrow_locked(lock);
}

bool CheckpointWriter::busy() {
  std::lock_guard<std::mutex> lock(mu_);
  return !done_;
}

CheckpointStats CheckpointWriter::last_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (job_ && !done_); });
    if (!job_ || done_) {
      if (stop_) return;
      continue;
    }
    Job& job = *job_;
    lock.unlock();
    std::exception_ptr err;
    try {
      save(job);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    reads_done_ = done_ = true;
    job_.reset();
    cv_.notify_all();
  }
}

void CheckpointWriter::save(Job& job) {
  const int64_t step = job.manifest.step;
  const int rank = comm_.rank();
  const std::string tmp = (fs::path(opt_.root) / (checkpoint_step_name(step) + ".tmp")).string();
  watchdog_set_phase("checkpoint");  // the writer's waits are reported with this context
  // Rank 0 clears what a crashed save of this step may have left; everyone writes after it.
  if (rank == 0) {
    WatchedWait w(str("creation of '", tmp, "'"), WaitKind::io, watchdog_context());
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) fail("checkpoint::save", str("cannot create '", tmp, "': ", ec.message()));
  }
  comm_.barrier(*stream_);
  stream_->synchronize();

  auto t0 = Clock::now();
  uint64_t bytes = 0, hash = 0;
  const std::string file = checkpoint_rank_file(rank);
  write_file(job, (fs::path(tmp) / file).string(), bytes, hash);
  const double write_ms = ms_since(t0);

  // Every rank's size and hash to everyone; rank 0 lists them and commits.
  auto t1 = Clock::now();
  const int n = comm_.size();
  Buffer mine = cpu_->alloc_host(16, false, "checkpoint hash");
  Buffer all = cpu_->alloc_host(16 * size_t(n), false, "checkpoint hashes");
  mine.as<uint64_t>()[0] = bytes;
  mine.as<uint64_t>()[1] = hash;
  comm_.all_gather(*stream_, all.data(), mine.data(), 16, CommType::u8);
  stream_->synchronize();
  if (rank == 0) {
    CheckpointManifest& m = job.manifest;
    m.files.clear();
    for (int r = 0; r < n; ++r)
      m.files.push_back(CheckpointFile{checkpoint_rank_file(r), all.as<uint64_t>()[2 * r],
                                       all.as<uint64_t>()[2 * r + 1]});
    commit_checkpoint(opt_.root, m, opt_.keep, opt_.test_hooks.get());
  }
  comm_.barrier(*stream_);  // when a save is done on any rank, it is committed
  stream_->synchronize();
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = CheckpointStats{step, bytes, write_ms, ms_since(t1)};
}

// The rank's file: every block in order, each chunk hashed in file order as it is submitted.
void CheckpointWriter::write_file(Job& job, const std::string& path, uint64_t& bytes, uint64_t& hash) {
  // Staging for NVMe blocks and for memory the file system cannot take directly (kept across
  // saves; a failed save drains the FileIO before its error leaves here, so no write still
  // reads it).
  const uint64_t chunk = std::max<uint64_t>(4096, opt_.chunk_bytes);
  if (!staging_) staging_ = cpu_->alloc_host(size_t(chunk) * size_t(opt_.depth), true, "checkpoint staging");
  Buffer& staging = staging_;
  FileIO* fio = fio_.get();
  uint64_t total = 0;
  for (const auto& b : job.blocks) total += b.bytes();
  // Preallocated to its final size: direct writes inside the file run in parallel (ext4
  // serializes the ones that extend it), and a full disk shows now, with a clear error.
  {
    WatchedWait w(str("creation and allocation of '", path, "'"), WaitKind::io, watchdog_context());
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("checkpoint::write", str("cannot create '", path, "': ", std::strerror(errno)));
    int rc = total ? ::fallocate(fd, 0, 0, off_t(total)) : 0;
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && (err == EOPNOTSUPP || err == ENOSYS)) {
      rc = ::ftruncate(fd, off_t(total));
      err = rc == 0 ? 0 : errno;
    }
    ::close(fd);
    if (rc != 0)
      fail("checkpoint::write", str("cannot allocate ", format_bytes(total), " for '", path, "': ", std::strerror(err)),
           err == ENOSPC ? "free space in checkpoint.dir, or lower checkpoint.keep" : "check the file system");
  }
  const int f = fio->open(FileSpec{{path}, 1u << 20, false});
  // However this returns, nothing stays in flight (a write may read the states' own memory)
  // and the file is closed.
  struct Closer {
    FileIO& io;
    int file;
    bool closed = false;
    ~Closer() {
      if (closed) return;
      try {
        io.drain();
      } catch (const std::exception&) {  // the error that unwinds us is the one reported
      }
      try {
        io.close(file);
      } catch (const std::exception&) {
      }
    }
  } closer{*fio, f};
  const Alignment al = fio->alignment(f);
  if (chunk % al.offset)
    fail("checkpoint::write", str("the staging chunk of ", chunk, " bytes is not a multiple of the "
                                  "O_DIRECT alignment ", al.offset, " of '", path, "'"));

  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> xx(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(xx.get(), 0);

  std::vector<int> free_bufs;
  for (int i = opt_.depth - 1; i >= 0; --i) free_bufs.push_back(i);
  auto buf_ptr = [&](int i) { return staging.as<char>() + size_t(i) * chunk; };

  struct Pending {
    int buf = -1;  // staging buffer the write reads from; -1: the state's own memory
  };
  std::map<uint64_t, Pending> writes;  // by tag
  uint64_t next_tag = 1;
  std::vector<IoCompletion> done;
  auto reap = [&](size_t min) {
    done.clear();
    fio->wait(min, done);
    for (const auto& c : done) {
      auto it = writes.find(c.tag);
      if (it == writes.end()) continue;
      if (it->second.buf >= 0) free_bufs.push_back(it->second.buf);
      writes.erase(it);
    }
  };
  auto submit = [&](const char* src, uint64_t offset, uint64_t len, int buf) {
    XXH64_update(xx.get(), src, size_t(len));
    const uint64_t tag = next_tag++;
    writes[tag] = Pending{buf};
    fio->submit(IoRequest{IoOp::write, f, offset, const_cast<char*>(src), len, tag});
    while (writes.size() >= size_t(opt_.depth) * 2) reap(1);
  };
  auto take_buf = [&] {
    while (free_bufs.empty()) reap(1);
    int b = free_bufs.back();
    free_bufs.pop_back();
    return b;
  };

  bool hooked = false;
  uint64_t written = 0;
  for (const auto& b : job.blocks) {
    const uint64_t block_bytes = b.bytes();
    STRATA_CHECK(b.file_offset == written, "checkpoint::write", "blocks out of order");
    const char* mem = static_cast<const char*>(job.source->block_memory(b));
    // NVMe blocks: reads run ahead of the writes by up to depth - 1 chunks. However this block
    // ends, no read may still fill a staging buffer when the buffers are freed.
    std::deque<std::pair<uint64_t, std::pair<int, uint64_t>>> reads;  // offset → (buf, ticket)
    struct ReadGuard {
      std::deque<std::pair<uint64_t, std::pair<int, uint64_t>>>& reads;
      CheckpointSource& source;
      ~ReadGuard() {
        for (auto& r : reads) {
          try {
            source.wait_read(r.second.second);
          } catch (const std::exception&) {  // the error that unwinds us is the one reported
          }
        }
      }
    } guard{reads, *job.source};
    uint64_t read_at = 0;
    for (uint64_t off = 0; off < block_bytes; off += chunk) {
      const uint64_t len = std::min(chunk, block_bytes - off);
      if (len % al.offset)
        fail("checkpoint::write", str("a chunk of ", len, " bytes is not a multiple of the O_DIRECT "
                                      "alignment ", al.offset, " of '", path, "'"),
             "put checkpoint.dir on a file system with 4 KiB alignment, or set io.backend=posix");
      if (mem) {
        const char* src = mem + off;
        if (reinterpret_cast<uintptr_t>(src) % al.memory == 0) {
          submit(src, b.file_offset + off, len, -1);  // straight from the state's memory
        } else {
          int buf = take_buf();
          std::memcpy(buf_ptr(buf), src, len);
          submit(buf_ptr(buf), b.file_offset + off, len, buf);
        }
      } else {
        while (read_at < block_bytes && reads.size() < size_t(opt_.depth - 1)) {
          const uint64_t rlen = std::min(chunk, block_bytes - read_at);
          int buf = take_buf();
          uint64_t t = job.source->read_block(b, read_at, buf_ptr(buf), rlen);
          reads.push_back({read_at, {buf, t}});
          read_at += rlen;
        }
        auto [roff, bt] = reads.front();
        reads.pop_front();
        STRATA_CHECK(roff == off, "checkpoint::write", "NVMe reads out of order");
        job.source->wait_read(bt.second);
        submit(buf_ptr(bt.first), b.file_offset + off, len, bt.first);
      }
      written += len;
      if (!hooked && written * 2 >= total) {
        hooked = true;
        run_checkpoint_hook(opt_.test_hooks.get(), "shard", job.manifest.step);
      }
    }
  }
  while (!writes.empty()) reap(writes.size());
  // Every write has completed, so none still reads a state's memory: the optimizer may
  // overwrite them while the file is synced and the save commits.
  {
    std::lock_guard<std::mutex> lock(mu_);
    reads_done_ = true;
  }
  cv_.notify_all();
  run_checkpoint_hook(opt_.test_hooks.get(), "written", job.manifest.step);
  fio->sync(f);
  closer.closed = true;
  fio->close(f);
  bytes = written;
  hash = XXH64_digest(xx.get());
}

}  // namespace strata
