// kernels/cuda/cuda_stream.h — the CUDA Stream and Event of the device seam, in plain C++ (CUDA
// handles are held as void*), shared by the device (cuda_device.cpp), the op launchers
// (cuda_ops.cpp and the *.cu files) and, through cuda_backend.h's native_stream(), the CUDA-aware
// files outside kernels/ (the NCCL communicator, the device AdamW).
//
// Errors: kernels cannot throw, so a kernel that meets bad input (a token or target out of
// range) records the first such fault in the stream's KernelFault (device memory); argument
// errors found when an op is launched, enqueue failures and exceptions of host tasks poison the
// stream. synchronize() rethrows whichever it finds (host-side first), clearing it. While a
// stream is poisoned by a host-side error, later launches, copies and host tasks on it are
// skipped, as on the CPU device; record() and wait() always run.
// Not here: device memory (cuda_device.cpp), the op math (the *.cu files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "kernels/device.h"

namespace strata::cuda {

// The first bad input a kernel met on a stream. Written by kernels (first fault wins through
// an atomicCAS on `code`), read back and cleared by CudaStream::synchronize().
struct KernelFault {
  int32_t code;   // 0: no fault; otherwise a FaultOp
  int32_t pad;
  int64_t row;    // the row (token) that held the bad value
  int64_t value;  // the bad value
  int64_t limit;  // the allowed range was [0, limit)
};

enum FaultOp : int32_t {
  kFaultNone = 0,
  kFaultEmbeddingFwd = 1,
  kFaultEmbeddingBwd = 2,
  kFaultCrossEntropyFwd = 3,
  kFaultCrossEntropyBwd = 4,
};

// What the stream needs of its device; owned by the device, outlives every stream.
struct DeviceContext {
  int ordinal = 0;
  void* lt_handle = nullptr;        // cublasLtHandle_t
  struct GemmCache* gemm_cache = nullptr;  // kernels/cuda/gemm.h
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int ordinal);  // cudaEventDisableTiming
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool query() override;        // cudaEventQuery: never-recorded events are complete
  void synchronize() override;  // cudaEventSynchronize
  void* native() const { return event_; }  // cudaEvent_t
  int ordinal() const { return ordinal_; }
  // The stream of the latest record, for the watchdog's report (CudaStream::record sets it).
  void set_recorded_on(const std::string& stream);

 private:
  void* event_ = nullptr;
  int ordinal_ = 0;
  std::mutex m_;
  std::string recorded_on_;
};

class CudaStream final : public Stream {
 public:
  // Host-side error of the stream, shared with host-task callbacks that may outlive a call.
  struct HostErrors {
    std::mutex m;
    std::exception_ptr error;
  };

  CudaStream(Device& device, const DeviceContext& ctx, std::string name);  // non-blocking
  ~CudaStream() override;  // waits for the stream's work; never throws
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  Device& device() override { return device_; }
  const std::string& name() const override { return name_; }
  void copy(void* dst, const void* src, size_t bytes) override;  // cudaMemcpyAsync(Default)
  void fill_zero(void* dst, size_t bytes) override;               // cudaMemsetAsync
  void host_task(std::string_view label, std::function<void()> fn) override;  // cudaLaunchHostFunc
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;

  void* native() const { return stream_; }  // cudaStream_t
  int ordinal() const { return ctx_.ordinal; }
  const DeviceContext& context() const { return ctx_; }
  KernelFault* fault() const { return fault_dev_; }  // device memory

  // Device scratch of at least `bytes` (256-byte aligned) for work enqueued on this stream from
  // now on; a later call may replace it (the old block is freed in stream order, after the
  // work already enqueued). Stream-ordered allocation (cudaMallocAsync); outside the device cap.
  void* scratch(size_t bytes);
  // The cuBLASLt workspace of this stream (kGemmWorkspaceBytes; allocated on first use).
  void* gemm_workspace(size_t* bytes);

  bool poisoned();
  // Records a host-side error (the first one wins); non-strata exceptions become Errors.
  void poison(std::exception_ptr error, std::string_view what);
  // Makes this stream's device current on the calling host thread (cudaSetDevice when needed).
  void make_current() const;

 private:
  void* grow(void*& block, size_t& capacity, size_t bytes, const char* what);
  void release() noexcept;

  Device& device_;
  DeviceContext ctx_;
  std::string name_;
  void* stream_ = nullptr;
  KernelFault* fault_dev_ = nullptr;
  KernelFault* fault_host_ = nullptr;  // pinned mirror, filled by synchronize()
  std::shared_ptr<HostErrors> errors_ = std::make_shared<HostErrors>();
  std::mutex scratch_m_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// 32 MiB: what NVIDIA recommends for cuBLASLt on Hopper, enough for every split-K algorithm.
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

// The CUDA stream behind s; Error naming `where` when s belongs to another kind of device.
CudaStream& cuda_stream(Stream& s, std::string_view where);
CudaEvent& cuda_event(Event& e, std::string_view where);

// Splits one scratch block into 256-byte-aligned pieces: take<T>(count) returns the next piece.
class ScratchCarver {
 public:
  static size_t piece_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }
  explicit ScratchCarver(void* base) : p_(static_cast<char*>(base)) {}
  template <class T>
  T* take(size_t count) {
    T* out = reinterpret_cast<T*>(p_);
    p_ += piece_bytes(count * sizeof(T));
    return out;
  }

 private:
  char* p_;
};

}  // namespace strata::cuda
