// kernels/cpu/cpu_device.cpp — CPU streams (one worker thread each), events and the capped
// memory of the CPU device.
#include "kernels/cpu/cpu_device.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <sys/mman.h>

#include "core/cpu.h"
#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fast_ops.h"

namespace strata {
namespace {

constexpr size_t kDeviceAlign = 256;
constexpr size_t kHostAlign = 4096;
constexpr size_t kHugePage = 2u << 20;
bool n_huge(size_t bytes) { return bytes >= kHugePage; }

// ---- events ---------------------------------------------------------------------------------

struct EventState {
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0;   // generation of the latest record()
  uint64_t completed = 0;  // highest generation that has completed
  std::string recorded_on;  // the stream of the latest record(), for the watchdog's report
};

class CpuEvent final : public Event {
 public:
  std::shared_ptr<EventState> state = std::make_shared<EventState>();

  bool query() override {
    std::lock_guard<std::mutex> lock(state->m);
    return state->completed >= state->recorded;
  }
  void synchronize() override {
    std::unique_lock<std::mutex> lock(state->m);
    uint64_t target = state->recorded;
    auto done = [&] { return state->completed >= target; };
    if (done()) return;
    WatchedWait w(str("the host waits for an event recorded on stream '", state->recorded_on, "'"),
                  WaitKind::host, watchdog_context());
    state->cv.wait(lock, done);
  }
};

// ---- streams --------------------------------------------------------------------------------

class CpuStream final : public Stream {
 public:
  CpuStream(Device& dev, std::string name) : device_(dev), name_(std::move(name)) {
    worker_ = std::thread([this] { run(); });
  }

  ~CpuStream() override {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    if (error_) {
      try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        log_warn("cpu::stream", "stream '", name_, "' destroyed with an unreported error: ", e.what());
      }
    }
  }

  Device& device() override { return device_; }
  const std::string& name() const override { return name_; }

  void copy(void* dst, const void* src, size_t bytes) override {
    push(Task{Kind::work, "copy", [dst, src, bytes] { std::memcpy(dst, src, bytes); }});
  }
  void fill_zero(void* dst, size_t bytes) override {
    push(Task{Kind::work, "fill_zero", [dst, bytes] { cpu::fast::fill_zero(dst, bytes); }});
  }
  void host_task(std::string_view label, std::function<void()> fn) override {
    push(Task{Kind::work, std::string(label), std::move(fn)});
  }

  void record(Event& event) override {
    auto st = static_cast<CpuEvent&>(event).state;
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(st->m);
      gen = ++st->recorded;
      st->recorded_on = name_;
    }
    push(Task{Kind::control, "record", [st, gen] {
                {
                  std::lock_guard<std::mutex> lock(st->m);
                  if (gen > st->completed) st->completed = gen;
                }
                st->cv.notify_all();
              }});
  }

  void wait(Event& event) override {
    auto st = static_cast<CpuEvent&>(event).state;
    uint64_t target;
    {
      std::lock_guard<std::mutex> lock(st->m);
      target = st->recorded;
    }
    push(Task{Kind::control, "wait", [this, st, target, context = watchdog_context()] {
                std::unique_lock<std::mutex> lock(st->m);
                if (st->completed >= target) return;
                int64_t t0 = trace_now_us();
                WatchedWait w(str("stream '", name_, "' waits for an event of another stream"),
                              WaitKind::stream, context);
                st->cv.wait(lock, [&] { return st->completed >= target; });
                int64_t dt = trace_now_us() - t0;
                waited_us_.fetch_add(dt, std::memory_order_relaxed);
                if (trace_enabled()) trace_span(name_, "wait", t0, dt);
              }});
  }

  double waited_ms() const override { return double(waited_us_.load()) / 1000.0; }

  void synchronize() override {
    std::unique_lock<std::mutex> lock(m_);
    auto idle = [&] { return queue_.empty() && !busy_; };
    if (!idle()) {
      WatchedWait w(str("the host waits for stream '", name_, "' (", queue_.size() + (busy_ ? 1 : 0),
                        " task(s) left)"),
                    WaitKind::host, watchdog_context());
      idle_cv_.wait(lock, idle);
    }
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  enum class Kind { work, control };  // control tasks (events) run even on a poisoned stream
  struct Task {
    Kind kind;
    std::string label;
    std::function<void()> fn;
  };

  void push(Task t) {
    {
      std::lock_guard<std::mutex> lock(m_);
      queue_.push_back(std::move(t));
    }
    cv_.notify_one();
  }

  void run() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        t = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        if (t.kind == Kind::work && error_) t.fn = nullptr;  // poisoned: skip work
      }
      if (t.fn) {
        bool tracing = t.kind == Kind::work && trace_enabled();
        int64_t t0 = tracing ? trace_now_us() : 0;
        try {
          t.fn();
        } catch (const Error&) {
          std::lock_guard<std::mutex> lock(m_);
          if (!error_) error_ = std::current_exception();
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(m_);
          if (!error_)
            error_ = std::make_exception_ptr(
                Error("cpu::stream", str("task '", t.label, "' on stream '", name_, "' failed: ", e.what())));
        }
        if (tracing) trace_span(name_, t.label, t0, trace_now_us() - t0);
      }
      {
        std::lock_guard<std::mutex> lock(m_);
        busy_ = false;
        if (queue_.empty()) idle_cv_.notify_all();
      }
    }
  }

  Device& device_;
  std::string name_;
  std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::atomic<int64_t> waited_us_{0};
  std::thread worker_;
};

// ---- memory ---------------------------------------------------------------------------------

class CpuMemory final : public BufferReleaser {
 public:
  explicit CpuMemory(uint64_t limit) : limit_(limit) {}

  Buffer alloc_device(size_t bytes, std::string_view what) {
    size_t n = round_up(bytes ? bytes : 1, kDeviceAlign);
    uint64_t used = used_.fetch_add(n) + n;
    if (used > limit_) {
      used_.fetch_sub(n);
      fail("cpu::alloc",
           str("device memory exhausted: ", what, " needs ", format_bytes(n), ", ",
               format_bytes(used - n), " of ", format_bytes(limit_), " already in use (limit ",
               format_bytes(limit_), ")"),
           "raise offload.device_mem_limit, shrink the model or batch, or offload states to "
           "host/nvme (run `strata plan` to see what each tier needs)");
    }
    uint64_t peak = peak_.load();
    while (used > peak && !peak_.compare_exchange_weak(peak, used)) {
    }
    // Large buffers on transparent huge pages, as alloc_host does: fewer TLB misses for the
    // kernels, and direct I/O from them (checkpoints write states in place) moves 2 MiB
    // physically contiguous pieces instead of 4 KiB pages.
    const bool huge = n_huge(n);
    const size_t align = huge ? kHugePage : n >= kHostAlign ? kHostAlign : kDeviceAlign;
    void* p = std::aligned_alloc(align, round_up(n, align));
    if (p && huge) madvise(p, round_up(n, align), MADV_HUGEPAGE);
    if (!p) {
      used_.fetch_sub(n);
      fail("cpu::alloc", str("out of host memory allocating ", format_bytes(n), " for ", what));
    }
    return Buffer(p, n, MemoryKind::device, this);
  }

  Buffer alloc_host(size_t bytes, bool pinned, std::string_view what) {
    // Large buffers sit on 2 MiB boundaries and ask for transparent huge pages: a staging buffer
    // that is physically contiguous in 2 MiB pieces lets the disk take larger direct-I/O
    // requests (docs/io.md measures reads about twice as fast).
    const bool huge = n_huge(bytes);
    size_t align = huge ? kHugePage : kHostAlign;
    size_t n = round_up(bytes ? bytes : 1, align);
    void* p = std::aligned_alloc(align, n);
    if (p && huge) madvise(p, n, MADV_HUGEPAGE);
    if (!p) fail("cpu::alloc_host", str("out of host memory allocating ", format_bytes(n), " for ", what));
    if (pinned) pinned_.fetch_add(n);
    return Buffer(p, n, pinned ? MemoryKind::host_pinned : MemoryKind::host, this);
  }

  void pin(size_t bytes) { pinned_.fetch_add(bytes); }
  void unpin(size_t bytes) noexcept { pinned_.fetch_sub(bytes); }

  void release(void* ptr, size_t bytes, MemoryKind kind) noexcept override {
    std::free(ptr);
    if (kind == MemoryKind::device) used_.fetch_sub(bytes);
    else if (kind == MemoryKind::host_pinned) pinned_.fetch_sub(bytes);
  }

  DeviceMemoryStats stats() const {
    return DeviceMemoryStats{limit_, used_.load(), peak_.load(), pinned_.load()};
  }
  void reset_peak() { peak_.store(used_.load()); }

 private:
  uint64_t limit_;
  std::atomic<uint64_t> used_{0}, peak_{0}, pinned_{0};
};

// ---- device ---------------------------------------------------------------------------------

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const DeviceOptions& o)
      : memory_(o.mem_limit_bytes ? o.mem_limit_bytes : physical_memory_bytes()),
        ops_(make_cpu_ops(o.cpu_ops)),
        mode_(o.cpu_ops) {}

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override {
    const auto& f = cpu_features();
    return str("cpu (", f.model.empty() ? "unknown model" : f.model, ", ", hardware_threads(),
               " threads", mode_ == CpuOpsMode::reference ? ", reference ops" : "", ")");
  }
  Buffer alloc(size_t bytes, std::string_view what) override {
    return memory_.alloc_device(bytes, what);
  }
  Buffer alloc_host(size_t bytes, bool pinned, std::string_view what) override {
    return memory_.alloc_host(bytes, pinned, what);
  }
  bool pin_host(void*, size_t bytes, std::string_view) override {
    memory_.pin(bytes);
    return true;
  }
  void unpin_host(void*, size_t bytes) noexcept override { memory_.unpin(bytes); }
  std::unique_ptr<Stream> make_stream(std::string name) override {
    return std::make_unique<CpuStream>(*this, std::move(name));
  }
  std::unique_ptr<Event> make_event() override { return std::make_unique<CpuEvent>(); }
  Ops& ops() override { return *ops_; }
  DeviceMemoryStats memory() const override { return memory_.stats(); }
  void reset_peak() override { memory_.reset_peak(); }
  bool host_addressable() const override { return true; }

 private:
  CpuMemory memory_;
  std::unique_ptr<Ops> ops_;
  CpuOpsMode mode_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const DeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

}  // namespace strata
