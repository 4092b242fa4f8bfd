// io/file_io.cpp — FileIO: the queue that turns requests into chunks, keeps the backend's queue
// full, checks every result, and drains before it reports a failure.
//
// Bookkeeping: a Job per request (split into chunks front to back, FIFO across requests), a Slot
// per chunk in flight (queue_depth of them; the slot index is the backend's op id). A chunk that
// comes back -EAGAIN/-EINTR or short keeps its slot and is resubmitted first on the next pump.
// A hard failure sets `aborting`: nothing new starts, in-flight chunks are reaped, then one Error.
// Failures of the backend itself go the same way: chunks it refused at submit, results for ids
// not in flight, results it lost (it holds none of the chunks counted in flight), a reap that
// throws. `in_flight` only ever counts chunks the backend accepted and has not answered, so
// draining always ends (io/backend.h has the accounting contract this relies on).
#include "io/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"
#include "io/backend.h"

namespace strata {
namespace {

constexpr uint32_t kMaxAgain = 1000;            // consecutive -EAGAIN on one chunk before giving up
constexpr uint64_t kMaxRegion = 1ull << 30;     // io_uring's limit per registered buffer
constexpr size_t kReapBatch = 256;

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

struct Member {
  UniqueFd fd;
  std::string path;
  int backend_file = -1;
  bool direct = false;
};

struct OpenFile {
  bool open = false;
  std::vector<Member> members;
  uint64_t stripe_bytes = 0;  // 0: not striped
  Alignment alignment;
  std::string description;
};

struct Job {
  IoRequest request;
  uint64_t cursor = 0;      // bytes already cut into chunks
  uint32_t chunks_out = 0;  // chunks in flight or waiting to be resubmitted
  bool failed = false;      // a chunk failed for good
  bool incomplete = false;  // a chunk was dropped unfinished while draining after a failure
  bool live = false;
};

struct Slot {
  uint32_t job = 0;
  int member = 0;
  uint64_t offset = 0;   // member-file offset of the part still to move
  uint64_t logical = 0;  // logical offset of the part still to move
  char* buffer = nullptr;
  uint32_t length = 0;   // bytes still to move
  int buffer_index = -1;
  uint32_t again = 0;
  bool busy = false;     // accepted by the backend, result not yet reaped
};

// What an exception from a backend says, for the failure it becomes.
struct Thrown {
  std::string where, what;
  std::vector<std::string> hints;
};
Thrown describe_thrown(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return {err.where(), err.what_failed(), err.hints()};
  } catch (const std::exception& err) {
    return {"", err.what(), {}};
  } catch (...) {
    return {"", "an exception that is not a std::exception", {}};
  }
}
std::string thrown_text(const Thrown& t) {
  return t.where.empty() ? t.what : str("[", t.where, "] ", t.what);
}

}  // namespace

struct FileIO::State {
  std::vector<OpenFile> files;
  std::vector<Job> jobs;
  std::vector<uint32_t> free_jobs;
  std::deque<uint32_t> to_split[kIoLanes];  // per lane: jobs with bytes not yet cut into chunks
  std::vector<Slot> slots;
  std::vector<uint32_t> free_slots;
  std::vector<uint32_t> resubmit;  // slots whose rest goes out on the next pump
  std::vector<RawOp> batch;
  std::vector<RawResult> results;
  size_t in_flight = 0;           // slots the backend accepted and has not answered (busy)
  std::vector<iovec> registered;  // sorted by address

  // The first hard failure, while draining.
  bool aborting = false;
  std::string fail_where, fail_what;
  std::vector<std::string> fail_hints;
  size_t fail_in_flight = 0;  // chunks in flight when it happened
  size_t failed_requests = 0;

  // Trace: one span per busy period of the queue.
  std::string track;
  int64_t busy_since = -1;
  uint64_t busy_chunks = 0, busy_bytes = 0;
  bool busy_read = false, busy_write = false;
};

std::string_view io_op_name(IoOp op) { return op == IoOp::read ? "read" : "write"; }

FileIO::FileIO(std::unique_ptr<IoBackend> backend, IoOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()), backend_(std::move(backend)) {
  STRATA_CHECK(backend_ != nullptr, "io::FileIO", "no backend");
  if (options_.queue_depth < 1 || options_.queue_depth > 4096)
    fail("io::FileIO", str("queue depth ", options_.queue_depth, " is out of range"),
         "set io.queue_depth between 1 and 4096 (32 suits most NVMe drives)");
  if (options_.block_size < 4096 || options_.block_size % 4096 || options_.block_size > kMaxRegion)
    fail("io::FileIO",
         str("block size ", options_.block_size, " is not a multiple of 4096 between 4K and 1G"),
         "set io.block_size to e.g. 1M");
  direct_ = options_.direct;
  State& st = *state_;
  st.slots.resize(options_.queue_depth);
  for (int i = options_.queue_depth - 1; i >= 0; --i) st.free_slots.push_back(uint32_t(i));
  st.results.resize(std::min<size_t>(kReapBatch, options_.queue_depth));
  st.batch.reserve(st.slots.size());  // pump() and complete() never allocate
  st.resubmit.reserve(st.slots.size());
  st.track = "io:" + options_.name;
}

FileIO::~FileIO() {
  try {
    WatchedWait w(str("FileIO '", options_.name, "' drains its requests at shutdown"),
                  WaitKind::io, watchdog_context());
    std::vector<IoCompletion> ignored;
    drain(&ignored);
  } catch (const std::exception& e) {
    log_error("io", "error while draining at shutdown: ", e.what());
  }
  try {
    if (pending_requests_ > 0)
      log_error("io", pending_requests_, " request(s) still pending at shutdown: the ",
                backend_->name(), " backend is closed while it holds ", backend_->in_flight(),
                " chunk(s) it never answered");
    for (OpenFile& f : state_->files)
      for (Member& m : f.members)
        if (m.backend_file >= 0) backend_->remove_file(m.backend_file);
  } catch (const std::exception& e) {
    log_error("io", "error while closing files: ", e.what());
  }
}

std::string_view FileIO::backend_name() const { return backend_->name(); }

int FileIO::open(const FileSpec& spec) {
  State& st = *state_;
  if (spec.paths.empty()) fail("io::open", "no path given");
  const bool striped = spec.paths.size() > 1;
  if (striped && (spec.stripe_bytes < 4096 || spec.stripe_bytes % 4096))
    fail("io::open", str("stripe size ", spec.stripe_bytes, " is not a positive multiple of 4096"),
         "set io.stripe_size to e.g. 1M");
  OpenFile file;
  file.stripe_bytes = striped ? spec.stripe_bytes : 0;
  file.alignment = Alignment{1, 1};
  try {
    for (const std::string& path : spec.paths) {
      Member m;
      m.path = path;
      int flags = O_RDWR | O_CLOEXEC | (spec.create ? O_CREAT : 0);
      int fd = direct_ ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
      int err = errno;
      if (fd >= 0) {
        m.direct = true;
      } else if (!direct_ || err == EINVAL) {
        if (direct_) {
          std::string dir = std::filesystem::path(path).parent_path().string();
          log_warn_once("io.no_direct:" + dir, "io", "O_DIRECT refused in '", dir, "' (",
                        detail::errno_text(err), "): using the page cache there");
        }
        fd = ::open(path.c_str(), flags, 0644);
        err = errno;
      }
      if (fd < 0)
        fail("io::open", str("cannot open '", path, "': ", errno_string(err)),
             err == ENOENT ? "create the directory first, or check offload.nvme_path"
                           : "check the path and its permissions");
      m.fd = UniqueFd(fd);
      Alignment a = direct_alignment(fd);
      file.alignment.memory = std::max(file.alignment.memory, a.memory);
      file.alignment.offset = std::max(file.alignment.offset, a.offset);
      m.backend_file = backend_->add_file(fd);
      file.members.push_back(std::move(m));
    }
    if (options_.block_size % file.alignment.offset)
      fail("io::open",
           str("block size ", options_.block_size, " is not a multiple of the O_DIRECT alignment ",
               file.alignment.offset, " of '", spec.paths[0], "'"),
           "set io.block_size to a multiple of that alignment");
    if (striped && spec.stripe_bytes % file.alignment.offset)
      fail("io::open",
           str("stripe size ", spec.stripe_bytes, " is not a multiple of the O_DIRECT alignment ",
               file.alignment.offset),
           "set io.stripe_size to a multiple of that alignment");
  } catch (...) {
    for (Member& m : file.members)
      if (m.backend_file >= 0) backend_->remove_file(m.backend_file);
    throw;
  }
  file.description = spec.paths[0];
  for (size_t i = 1; i < spec.paths.size(); ++i) file.description += " + " + spec.paths[i];
  if (striped) file.description += str(" (stripe ", format_bytes(spec.stripe_bytes), ")");
  file.open = true;
  // A closed file's slot is taken again: a writer that opens a file per save (the checkpoint's)
  // keeps a list as long as its files open at once, not one entry per file it ever opened.
  auto slot = std::find_if(st.files.begin(), st.files.end(),
                           [](const OpenFile& f) { return !f.open; });
  if (slot != st.files.end()) {
    *slot = std::move(file);
    return int(slot - st.files.begin());
  }
  st.files.push_back(std::move(file));
  return int(st.files.size()) - 1;
}

namespace {
OpenFile& checked_file(std::vector<OpenFile>& files, int file, const char* where) {
  if (file < 0 || size_t(file) >= files.size() || !files[file].open)
    fail(where, str("file id ", file, " is not open"));
  return files[file];
}
}  // namespace

void FileIO::close(int file) {
  State& st = *state_;
  OpenFile& f = checked_file(st.files, file, "io::close");
  if (pending_requests_ != 0)
    fail("io::close", str("'", f.description, "' closed with ", pending_requests_,
                          " requests pending"),
         "drain() before closing");
  for (Member& m : f.members) {
    if (m.backend_file >= 0) backend_->remove_file(m.backend_file);
    m.backend_file = -1;
  }
  f = OpenFile{};  // closed: its slot is free for the next open
}

void FileIO::sync(int file) {
  OpenFile& f = checked_file(state_->files, file, "io::sync");
  for (Member& m : f.members) {
    WatchedWait w(str("fsync of '", m.path, "'"), WaitKind::io, watchdog_context());
    if (::fsync(m.fd.get()) == 0) continue;
    const int err = errno;
    fail("io::sync", str("fsync of '", m.path, "' failed: ", errno_string(err)),
         err == ENOSPC || err == EDQUOT ? "free space on that file system"
                                        : "check the device (dmesg) and the file system");
  }
}

Alignment FileIO::alignment(int file) const {
  return checked_file(state_->files, file, "io::alignment").alignment;
}

bool FileIO::file_direct(int file) const {
  const OpenFile& f = checked_file(state_->files, file, "io::file_direct");
  return std::all_of(f.members.begin(), f.members.end(), [](const Member& m) { return m.direct; });
}

const std::string& FileIO::describe(int file) const {
  return checked_file(state_->files, file, "io::describe").description;
}

void FileIO::register_buffers(std::span<const std::span<std::byte>> regions) {
  State& st = *state_;
  if (pending_requests_ != 0)
    fail("io::register_buffers", str(pending_requests_, " requests pending"), "drain() first");
  std::vector<iovec> iovs;
  for (std::span<std::byte> r : regions) {
    for (uint64_t at = 0; at < r.size(); at += kMaxRegion)
      iovs.push_back(iovec{r.data() + at, size_t(std::min<uint64_t>(kMaxRegion, r.size() - at))});
  }
  std::sort(iovs.begin(), iovs.end(),
            [](const iovec& a, const iovec& b) { return a.iov_base < b.iov_base; });
  st.registered.clear();
  if (iovs.empty()) {
    backend_->register_buffers({});
    return;
  }
  if (backend_->register_buffers(iovs)) st.registered = std::move(iovs);
}

void FileIO::unregister_buffers() { register_buffers({}); }

bool FileIO::buffers_registered() const { return !state_->registered.empty(); }

bool FileIO::file_registered(int file) const {
  const OpenFile& f = checked_file(state_->files, file, "io::file_registered");
  return std::all_of(f.members.begin(), f.members.end(),
                     [&](const Member& m) { return backend_->file_registered(m.backend_file); });
}

void FileIO::validate(std::span<const IoRequest> requests) const {
  for (const IoRequest& r : requests) {
    const OpenFile& f = checked_file(state_->files, r.file, "io::submit");
    auto refuse = [&](const std::string& why) {
      fail(str("io::", io_op_name(r.op)),
           str(io_op_name(r.op), " of ", r.length, " bytes at offset ", r.offset, " in '",
               f.description, "' refused: ", why),
           str("O_DIRECT needs buffers aligned to ", f.alignment.memory, " bytes and offsets and "
               "lengths that are multiples of ", f.alignment.offset,
               " (allocate with std::aligned_alloc(4096, n) and round sizes up to 4096)"));
    };
    if (r.buffer == nullptr) refuse("no buffer");
    if (r.length == 0) refuse("length is 0");
    if (reinterpret_cast<uintptr_t>(r.buffer) % f.alignment.memory)
      refuse(str("buffer address ", r.buffer, " is not aligned to ", f.alignment.memory));
    if (r.offset % f.alignment.offset)
      refuse(str("offset is not a multiple of ", f.alignment.offset));
    if (r.length % f.alignment.offset)
      refuse(str("length is not a multiple of ", f.alignment.offset));
  }
}

void FileIO::submit(std::span<const IoRequest> requests, IoLane lane) {
  State& st = *state_;
  validate(requests);
  for (const IoRequest& r : requests) {
    uint32_t j;
    if (!st.free_jobs.empty()) {
      j = st.free_jobs.back();
      st.free_jobs.pop_back();
    } else {
      j = uint32_t(st.jobs.size());
      st.jobs.emplace_back();
    }
    st.jobs[j] = Job{r, 0, 0, false, false, true};
    st.to_split[int(lane)].push_back(j);
    ++pending_requests_;
    ++stats_.requests;
  }
  // pump() does not throw: what the backend refuses becomes the failure wait() reports.
  if (!st.aborting) pump();
}

// Fills free slots: resubmissions first, then new chunks, all in one backend submit. Never
// throws: chunks the backend refuses are failed (see refuse()).
void FileIO::pump() {
  State& st = *state_;
  st.batch.clear();
  auto raw = [&](uint32_t id) {
    const Slot& s = st.slots[id];
    const Job& job = st.jobs[s.job];
    const Member& m = st.files[job.request.file].members[s.member];
    return RawOp{id, job.request.op, m.backend_file, s.offset, s.buffer, s.length, s.buffer_index};
  };
  for (uint32_t id : st.resubmit) st.batch.push_back(raw(id));
  st.resubmit.clear();
  for (;;) {
    int lane = 0;
    while (lane < kIoLanes && st.to_split[lane].empty()) ++lane;
    if (st.free_slots.empty() || lane == kIoLanes) break;
    std::deque<uint32_t>& queue = st.to_split[lane];
    uint32_t j = queue.front();
    Job& job = st.jobs[j];
    const OpenFile& f = st.files[job.request.file];
    uint64_t logical = job.request.offset + job.cursor;
    uint64_t len = std::min(options_.block_size, job.request.length - job.cursor);
    Slot s;
    s.job = j;
    s.logical = logical;
    if (f.stripe_bytes) {
      uint64_t stripe = logical / f.stripe_bytes, within = logical % f.stripe_bytes;
      uint64_t n = f.members.size();
      s.member = int(stripe % n);
      s.offset = (stripe / n) * f.stripe_bytes + within;
      len = std::min(len, f.stripe_bytes - within);
    } else {
      s.offset = logical;
    }
    s.buffer = static_cast<char*>(job.request.buffer) + job.cursor;
    s.length = uint32_t(len);
    if (!st.registered.empty()) {
      auto it = std::upper_bound(st.registered.begin(), st.registered.end(), s.buffer,
                                 [](const char* p, const iovec& v) { return p < v.iov_base; });
      if (it != st.registered.begin()) {
        --it;
        const char* base = static_cast<const char*>(it->iov_base);
        if (s.buffer + len <= base + it->iov_len) {
          s.buffer_index = int(it - st.registered.begin());
          ++stats_.fixed_chunks;
        }
      }
    }
    uint32_t id = st.free_slots.back();
    st.free_slots.pop_back();
    st.slots[id] = s;
    job.cursor += len;
    ++job.chunks_out;
    if (job.cursor == job.request.length) queue.pop_front();
    ++stats_.chunks;
    if (trace_enabled()) {
      st.busy_chunks++;
      st.busy_bytes += len;
      (job.request.op == IoOp::read ? st.busy_read : st.busy_write) = true;
    }
    st.batch.push_back(raw(id));
  }
  if (st.batch.empty()) return;
  if (st.in_flight == 0 && st.busy_since < 0 && trace_enabled()) st.busy_since = trace_now_us();
  // The backend accepts all, or throws having accepted a prefix that its in_flight() counts.
  const size_t held_before = backend_->in_flight();
  size_t accepted = st.batch.size();
  std::exception_ptr refused;
  try {
    backend_->submit(st.batch);
  } catch (...) {
    refused = std::current_exception();
    size_t held_after = backend_->in_flight();
    accepted = held_after > held_before ? std::min(held_after - held_before, st.batch.size()) : 0;
  }
  for (size_t i = 0; i < accepted; ++i) st.slots[st.batch[i].id].busy = true;
  st.in_flight += accepted;
  if (refused) refuse(accepted, refused);
}

// The backend threw from submit() after accepting batch[0, accepted): the rest never started.
// Their requests fail; what is in flight drains; wait() then throws what the backend said.
void FileIO::refuse(size_t accepted, std::exception_ptr thrown) {
  State& st = *state_;
  const Thrown t = describe_thrown(thrown);
  std::vector<std::string> hints = t.hints;
  hints.push_back("the I/O backend itself failed, not a transfer: check `dmesg`; "
                  "io.backend=posix avoids io_uring");
  if (accepted == st.batch.size()) {  // it threw, yet holds every chunk: they drain as usual
    begin_abort("io::submit",
                str("the ", backend_->name(), " backend failed while submitting ", accepted,
                    " chunk(s), which it accepted: ", thrown_text(t)),
                std::move(hints));
    return;
  }
  const Slot& s = st.slots[st.batch[accepted].id];
  const Job& job = st.jobs[s.job];
  const Member& m = st.files[job.request.file].members[s.member];
  begin_abort(str("io::", io_op_name(job.request.op)),
              str("the ", backend_->name(), " backend refused ", st.batch.size() - accepted, " of ",
                  st.batch.size(), " chunk(s) at submission (the first: ", io_op_name(job.request.op),
                  " of ", s.length, " bytes at offset ", s.offset, " in '", m.path, "'): ",
                  thrown_text(t)),
              std::move(hints));
  std::vector<IoCompletion> none;  // a failed chunk never completes a request
  for (size_t i = accepted; i < st.batch.size(); ++i) {
    uint32_t id = uint32_t(st.batch[i].id);
    mark_failed(st.slots[id].job);
    release(id, none, false);
  }
}

size_t FileIO::wait(size_t min_completions, std::vector<IoCompletion>& out) {
  return wait_for(min_completions, false, out);
}

size_t FileIO::wait_progress(std::vector<IoCompletion>& out) { return wait_for(0, true, out); }

// any_chunk: return once a reap brought at least one result (wait_progress); else once
// min_completions requests completed (0: after one poll).
size_t FileIO::wait_for(size_t min_completions, bool any_chunk, std::vector<IoCompletion>& out) {
  State& st = *state_;
  size_t got = 0;
  bool polled = false;
  bool progressed = false;  // a reap returned a result
  bool reap_threw = false;  // the previous reap() threw
  for (;;) {
    if (!st.aborting) pump();
    // What the backend holds bounds what may be waited for: chunks counted in flight that it no
    // longer holds were lost, and waiting for them would never end.
    const size_t held = backend_->in_flight();
    if (held == 0 && st.in_flight > 0) lose_in_flight();
    if (st.aborting) {
      if (st.in_flight == 0 && held == 0) throw_failure();
    } else if (st.in_flight == 0) {
      if (pending_requests_ == 0) break;
      // Cannot happen while the bookkeeping holds; if it ever does, fail rather than return 0
      // to a drain() that would call again for ever.
      begin_abort("io::wait",
                  str(pending_requests_, " request(s) pending with no chunk in flight or queued"),
                  {"this is a bug in strata's FileIO; please report it"});
      continue;
    } else if (any_chunk ? progressed : got >= min_completions && (min_completions > 0 || polled)) {
      break;
    }
    // Each request needs at least one more chunk result, so waiting for that many results at
    // once never waits longer than necessary, and saves a wake-up per result. While draining,
    // everything the backend holds is waited for: buffers stay in use until it answers.
    size_t need = st.aborting               ? held
                  : any_chunk               ? std::min<size_t>({1, st.in_flight, held})
                  : got < min_completions   ? std::min({min_completions - got, st.in_flight, held})
                                            : 0;
    need = std::min(need, st.results.size());
    size_t n = 0;
    try {
      n = backend_->reap(st.results, need);
    } catch (...) {
      const Thrown t = describe_thrown(std::current_exception());
      if (reap_threw) {
        // Twice in a row: the backend cannot report on what it holds. Nothing is released (its
        // buffers may still be in use); a later wait() or drain() tries again.
        std::vector<std::string> hints = t.hints;
        hints.push_back("the requests stay pending and their buffers in use: call wait() or "
                        "drain() again to retry");
        throw Error("io::wait",
                    str("reaping completions from the ", backend_->name(), " backend failed again: ",
                        thrown_text(t), "; it still holds ", backend_->in_flight(), " chunk(s) of ",
                        pending_requests_, " pending request(s)"),
                    std::move(hints));
      }
      reap_threw = true;
      begin_abort("io::wait",
                  str("reaping completions from the ", backend_->name(), " backend failed: ",
                      thrown_text(t)),
                  t.hints);
      continue;
    }
    reap_threw = false;
    polled = true;
    progressed = progressed || n > 0;
    for (size_t i = 0; i < n; ++i) got += complete(st.results[i], out);
    if (st.in_flight == 0 && st.resubmit.empty()) end_busy_span();
  }
  return got;
}

void FileIO::drain(std::vector<IoCompletion>* out) {
  std::vector<IoCompletion> local;
  while (pending_requests_ > 0) wait(pending_requests_, out ? *out : local);
}

void FileIO::run(std::span<const IoRequest> requests) {
  submit(requests);
  drain();
}

// One backend result. Returns 1 when it completed a request (appended to `out`).
size_t FileIO::complete(const RawResult& r, std::vector<IoCompletion>& out) {
  State& st = *state_;
  if (r.id >= st.slots.size() || !st.slots[r.id].busy) {
    // Not ours: nothing is released on its account. If the backend answered a chunk under a
    // wrong id, that chunk's result is missing and lose_in_flight() fails it once the backend
    // holds nothing more.
    begin_abort("io::wait",
                str("the ", backend_->name(), " backend returned a result (", r.result,
                    ") for op id ", r.id, ", which is not in flight (ids are 0..",
                    st.slots.size() - 1, ")"),
                {"this is a bug in the I/O backend"});
    return 0;
  }
  --st.in_flight;
  Slot& s = st.slots[r.id];
  s.busy = false;
  Job& job = st.jobs[s.job];
  if (r.result < 0) {
    int err = int(-r.result);
    if (err == EAGAIN || err == EINTR) {
      if (st.aborting) return release(r.id, out, false);
      if (++s.again <= kMaxAgain) {
        ++stats_.requeued;
        st.resubmit.push_back(uint32_t(r.id));
        return 0;
      }
    }
    record_failure(r.id, err);
    return release(r.id, out, false);
  }
  if (r.result == 0 || uint64_t(r.result) > s.length) {
    record_failure(r.id, r.result == 0 ? 0 : -1);
    return release(r.id, out, false);
  }
  uint32_t n = uint32_t(r.result);
  (job.request.op == IoOp::read ? stats_.bytes_read : stats_.bytes_written) += n;
  s.again = 0;
  s.offset += n;
  s.logical += n;
  s.buffer += n;
  s.length -= n;
  if (s.length > 0 && !st.aborting) {
    ++stats_.resubmitted;
    st.resubmit.push_back(uint32_t(r.id));
    return 0;
  }
  return release(r.id, out, s.length == 0);
}

// Frees a slot; completes its request when that was its last chunk and every chunk moved. A
// request that failed or was cut short stays pending until throw_failure() reports it, so that
// callers keep calling wait() until they hear of it.
size_t FileIO::release(uint64_t id, std::vector<IoCompletion>& out, bool finished) {
  State& st = *state_;
  uint32_t j = st.slots[id].job;
  st.free_slots.push_back(uint32_t(id));
  Job& job = st.jobs[j];
  if (!finished) job.incomplete = true;
  --job.chunks_out;
  if (job.chunks_out > 0 || job.cursor < job.request.length) return 0;
  if (job.failed || job.incomplete) return 0;
  out.push_back(IoCompletion{job.request.tag, job.request.length});
  job.live = false;
  st.free_jobs.push_back(j);
  --pending_requests_;
  return 1;
}

// The backend holds none of the chunks counted in flight: their results will never come. Each
// fails, so draining ends.
void FileIO::lose_in_flight() {
  State& st = *state_;
  begin_abort("io::wait",
              str("the ", backend_->name(), " backend holds none of the ", st.in_flight,
                  " chunk(s) still counted in flight: their results were lost"),
              {"this is a bug in the I/O backend (it answered under unknown ids or dropped "
               "results)"});
  std::vector<IoCompletion> none;
  for (uint32_t id = 0; id < st.slots.size(); ++id) {
    if (!st.slots[id].busy) continue;
    st.slots[id].busy = false;
    --st.in_flight;
    mark_failed(st.slots[id].job);
    release(id, none, false);
  }
}

void FileIO::mark_failed(uint32_t job) {
  State& st = *state_;
  ++stats_.failed;
  if (!st.jobs[job].failed) ++st.failed_requests;
  st.jobs[job].failed = true;
}

// The first failure is the one reported; later ones only count.
void FileIO::begin_abort(std::string where, std::string what, std::vector<std::string> hints) {
  State& st = *state_;
  if (st.aborting) return;
  st.aborting = true;
  st.fail_in_flight = st.in_flight;
  st.fail_where = std::move(where);
  st.fail_what = std::move(what);
  st.fail_hints = std::move(hints);
}

// err > 0: errno; 0: end of file (nothing moved); -1: the backend reported more than asked.
void FileIO::record_failure(uint64_t id, int err) {
  State& st = *state_;
  const Slot& s = st.slots[id];
  mark_failed(s.job);
  if (st.aborting) return;
  const Job& job = st.jobs[s.job];
  const OpenFile& f = st.files[job.request.file];
  const Member& m = f.members[s.member];
  const char* op = io_op_name(job.request.op).data();
  std::string what = str(op, " of ", s.length, " bytes at offset ", s.offset, " in '", m.path,
                         "' failed: ");
  std::vector<std::string> hints;
  if (err > 0) {
    what += errno_string(err);
    if (err == ENOSPC || err == EDQUOT)
      hints.push_back(str("free space on the file system of '", m.path,
                          "', or point offload.nvme_path at a larger device"));
    else if (err == EIO)
      hints.push_back("the device reported an error: check `dmesg` and the drive's health");
    else if (err == EINVAL && m.direct)
      hints.push_back(str("the file system refused this O_DIRECT transfer; try io.backend=posix "
                          "or a directory on a local NVMe file system"));
  } else if (err == 0) {
    struct stat sb {};
    uint64_t size = ::fstat(m.fd.get(), &sb) == 0 ? uint64_t(sb.st_size) : 0;
    what += job.request.op == IoOp::read
                ? str("end of file (the file holds ", size, " bytes)")
                : std::string("the device accepted no bytes");
    if (job.request.op == IoOp::read)
      hints.push_back("read only what was written before, within the file's size");
  } else {
    what += "the backend reported more bytes than were asked for";
  }
  if (f.stripe_bytes) what += str("; logical offset ", s.logical, " of '", f.description, "'");
  if (job.request.length != s.length || job.request.offset != s.logical)
    what += str("; part of a ", job.request.length, "-byte ", op, " at offset ",
                job.request.offset);
  begin_abort(str("io::", op), std::move(what), std::move(hints));
}

// Everything in flight has drained: finish what is left, reset, and throw the first failure.
[[noreturn]] void FileIO::throw_failure() {
  State& st = *state_;
  std::vector<IoCompletion> none;
  for (uint32_t id : st.resubmit) release(id, none, false);
  st.resubmit.clear();
  size_t abandoned = 0;
  for (uint32_t j = 0; j < st.jobs.size(); ++j) {
    Job& job = st.jobs[j];
    if (!job.live) continue;
    if (!job.failed) ++abandoned;
    job.live = false;
    st.free_jobs.push_back(j);
    --pending_requests_;
  }
  for (auto& queue : st.to_split) queue.clear();
  std::string what = std::move(st.fail_what);
  what += str(" (", st.fail_in_flight, " other chunks in flight were drained first; ",
              st.failed_requests, " request(s) failed, ", abandoned, " abandoned)");
  std::string where = std::move(st.fail_where);
  std::vector<std::string> hints = std::move(st.fail_hints);
  st.aborting = false;
  st.failed_requests = 0;
  st.fail_in_flight = 0;
  end_busy_span();
  throw Error(std::move(where), std::move(what), std::move(hints));
}

void FileIO::end_busy_span() {
  State& st = *state_;
  if (st.busy_since < 0) return;
  int64_t now = trace_now_us();
  const char* kind = st.busy_read && st.busy_write ? "read+write" : st.busy_read ? "read" : "write";
  trace_span(st.track, str(kind, " ", format_bytes(st.busy_bytes), " in ", st.busy_chunks, " chunks"),
             st.busy_since, now - st.busy_since, st.busy_bytes);
  st.busy_since = -1;
  st.busy_chunks = st.busy_bytes = 0;
  st.busy_read = st.busy_write = false;
}

}  // namespace strata
