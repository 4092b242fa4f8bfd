// kernels/device.h — the device seam: Device, Buffer, Stream, Event.
//
// A Device owns memory (a capped "device memory" pool, and host memory that may be pinned),
// makes streams and events, and exposes its op launchers (kernels/ops.h). A Stream is an
// in-order queue: work enqueued on it runs in order, asynchronously to the caller; Events
// order work across streams, as in CUDA. The CPU device implements all of this for real (a
// worker thread per stream), so the engine's scheduling code is the same on both devices and
// ordering bugs show up in CPU-only tests.
//
// Ownership: every Buffer, Stream and Event must be destroyed before the Device that made it.
// Errors: work that fails on a stream poisons it; the error is rethrown (as strata::Error) by the
// next synchronize() of that stream, which clears the poison. Enqueueing never blocks on work.
//
// Example (two streams, the second consumes what the first produced):
//   auto copy = dev.make_stream("copy"), compute = dev.make_stream("compute");
//   auto ready = dev.make_event();
//   copy->copy(dst, src, n);          // async
//   copy->record(*ready);             // ready completes when the copy has
//   compute->wait(*ready);            // compute's later work starts after the copy
//   dev.ops().add(*compute, y, dst, x, n / 4);
//   compute->synchronize();           // host waits; rethrows any error of compute's work
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace strata {

class Ops;
class Device;

enum class DeviceKind { cpu, cuda };
enum class MemoryKind { device, host_pinned, host };

std::string_view device_kind_name(DeviceKind k);
std::string_view memory_kind_name(MemoryKind k);

// Returns memory to whatever allocated it. Implemented by device allocators.
class BufferReleaser {
 public:
  virtual ~BufferReleaser() = default;
  virtual void release(void* ptr, size_t bytes, MemoryKind kind) noexcept = 0;
};

// Owner of a block of bytes on a device or in host memory. Move-only; frees on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* ptr, size_t bytes, MemoryKind kind, BufferReleaser* releaser) noexcept
      : ptr_(ptr), bytes_(bytes), kind_(kind), releaser_(releaser) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() noexcept;
  void* data() const noexcept { return ptr_; }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(ptr_); }
  size_t bytes() const noexcept { return bytes_; }
  MemoryKind memory() const noexcept { return kind_; }
  bool pinned() const noexcept { return kind_ == MemoryKind::host_pinned; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::host;
  BufferReleaser* releaser_ = nullptr;
};

// A point in a stream's order. record() on a stream sets it; query/synchronize/wait refer to
// the most recent record at the time they are called. An event never recorded is complete.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool query() = 0;        // true when complete (never blocks)
  virtual void synchronize() = 0;  // host blocks until complete
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() = 0;
  virtual const std::string& name() const = 0;

  // Asynchronous copy of `bytes` between any two memories this device can address.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Runs fn on a host thread in stream order. `label` names the work in traces and errors.
  // On the CPU device this is how every op runs; on CUDA it must not call CUDA APIs.
  virtual void host_task(std::string_view label, std::function<void()> fn) = 0;

  virtual void record(Event& event) = 0;
  virtual void wait(Event& event) = 0;  // later work on this stream waits for event
  virtual void synchronize() = 0;       // host waits for all work; rethrows the first error

  // Total time this stream's queue has spent blocked in wait(event), as far as the host can
  // measure it (the CPU device: exactly; devices that wait in hardware report 0).
  virtual double waited_ms() const { return 0.0; }
};

struct DeviceMemoryStats {
  uint64_t limit_bytes = 0;  // the cap (offload.device_mem_limit or the physical size)
  uint64_t used_bytes = 0;
  uint64_t peak_bytes = 0;
  uint64_t host_pinned_bytes = 0;  // pinned host memory currently held by this device
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // Device memory, counted against the cap; throws Error naming `what`, the request and the
  // limit when it does not fit. Aligned to at least 256 bytes. Contents are uninitialized.
  virtual Buffer alloc(size_t bytes, std::string_view what) = 0;
  // Host memory aligned to 4096 bytes (usable for O_DIRECT). pinned: page-locked for fast
  // transfers (cudaHostAlloc/Register on CUDA; on the CPU device, ordinary memory marked pinned).
  virtual Buffer alloc_host(size_t bytes, bool pinned, std::string_view what) = 0;
  // Pins host memory the caller mapped itself (e.g. huge pages for I/O staging), so that it
  // serves like alloc_host(..., pinned = true) memory and counts as pinned: CUDA registers it
  // (cudaHostRegister); the CPU device only counts it. Returns false where refused (the caller
  // then uses alloc_host). The caller unpins the same range before unmapping it.
  virtual bool pin_host(void* ptr, size_t bytes, std::string_view what) = 0;
  virtual void unpin_host(void* ptr, size_t bytes) noexcept = 0;

  virtual std::unique_ptr<Stream> make_stream(std::string name) = 0;
  virtual std::unique_ptr<Event> make_event() = 0;
  virtual Ops& ops() = 0;

  virtual DeviceMemoryStats memory() const = 0;
  virtual void reset_peak() = 0;

  // True when host code may read and write this device's memory directly (the CPU device),
  // so host-side work (the CPU AdamW, accumulation into host gradients) can skip staging copies.
  virtual bool host_addressable() const { return false; }
};

// Which implementation of the CPU ops: the fast path (oneTBB, BLAS, SIMD) or the scalar
// reference (the oracle of the tests; slow).
enum class CpuOpsMode { fast, reference };

struct DeviceOptions {
  uint64_t mem_limit_bytes = 0;  // 0: no cap beyond the physical memory
  int ordinal = 0;               // which CUDA device
  CpuOpsMode cpu_ops = CpuOpsMode::fast;
  // CUDA: the linear ops' GEMMs round their f32 operands to bf16 and multiply them on the tensor
  // cores, accumulating in f32 (train.matmul_precision = bf16). The CPU device has no such mode.
  bool bf16_matmuls = false;
};

// The registry (kernels/registry.cpp): the only place that knows which backends were built.
std::unique_ptr<Device> make_device(DeviceKind kind, const DeviceOptions& options = {});
bool cuda_built();
int cuda_device_count();          // 0 when not built or no device
std::string cuda_describe();      // devices, memory and build architectures, for `strata info`

}  // namespace strata
