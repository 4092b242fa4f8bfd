// kernels/cuda/cuda_stream.cpp — CUDA streams and events: ordering, host tasks, the per-stream
// scratch and cuBLASLt workspace, and error reporting at synchronize() (see cuda_stream.h).
#include "kernels/cuda/cuda_stream.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"

namespace strata::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

const char* fault_op_name(int32_t op) {
  switch (op) {
    case kFaultEmbeddingFwd: return "embedding_fwd";
    case kFaultEmbeddingBwd: return "embedding_bwd";
    case kFaultCrossEntropyFwd: return "cross_entropy_fwd";
    case kFaultCrossEntropyBwd: return "cross_entropy_bwd";
  }
  return "kernel";
}

const char* fault_value_name(int32_t op) {
  return op == kFaultCrossEntropyFwd || op == kFaultCrossEntropyBwd ? "target" : "token";
}

// Turns any exception into the Error a synchronize() rethrows.
std::exception_ptr as_error(std::exception_ptr e, std::string_view what, const std::string& stream) {
  try {
    std::rethrow_exception(e);
  } catch (const Error&) {
    return e;
  } catch (const std::exception& x) {
    return std::make_exception_ptr(
        Error("cuda::stream", str(what, " on stream '", stream, "' failed: ", x.what())));
  } catch (...) {
    return std::make_exception_ptr(
        Error("cuda::stream", str(what, " on stream '", stream, "' failed: unknown exception")));
  }
}

struct HostTask {
  std::shared_ptr<CudaStream::HostErrors> errors;
  std::string label;
  std::string stream;
  std::function<void()> fn;
};

// Runs on CUDA's host-callback thread, in stream order. Must not call CUDA.
void CUDART_CB run_host_task(void* user) {
  std::unique_ptr<HostTask> t(static_cast<HostTask*>(user));
  {
    std::lock_guard<std::mutex> lock(t->errors->m);
    if (t->errors->error) return;  // poisoned: skip work until synchronize() reports it
  }
  try {
    t->fn();
  } catch (...) {
    std::exception_ptr e = as_error(std::current_exception(), str("task '", t->label, "'"), t->stream);
    std::lock_guard<std::mutex> lock(t->errors->m);
    if (!t->errors->error) t->errors->error = e;
  }
}

}  // namespace

// ---- events ---------------------------------------------------------------------------------

CudaEvent::CudaEvent(int ordinal) : ordinal_(ordinal) {
  STRATA_CUDA_CHECK(cudaSetDevice(ordinal));
  cudaEvent_t e;
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
}

CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(as_event(event_));  // no throw; a failure here is unreportable
}

bool CudaEvent::query() {
  const cudaError_t rc = cudaEventQuery(as_event(event_));
  if (rc == cudaSuccess) return true;
  if (rc == cudaErrorNotReady) return false;  // pending, not an error
  STRATA_CUDA_CHECK(rc);
  return false;
}

void CudaEvent::set_recorded_on(const std::string& stream) {
  std::lock_guard<std::mutex> lock(m_);
  recorded_on_ = stream;
}

void CudaEvent::synchronize() {
  if (query()) return;
  std::string on;
  {
    std::lock_guard<std::mutex> lock(m_);
    on = recorded_on_;
  }
  WatchedWait w(str("the host waits for a CUDA event recorded on stream '", on, "'"),
                WaitKind::host, watchdog_context());
  STRATA_CUDA_CHECK(cudaEventSynchronize(as_event(event_)));
}

CudaEvent& cuda_event(Event& e, std::string_view where) {
  auto* ce = dynamic_cast<CudaEvent*>(&e);
  if (!ce)
    fail(std::string(where), "the event was made by another kind of device, not by a CUDA device",
         "make events with the same Device as the streams that record and wait on them");
  return *ce;
}

// ---- streams --------------------------------------------------------------------------------

CudaStream::CudaStream(Device& device, const DeviceContext& ctx, std::string name)
    : device_(device), ctx_(ctx), name_(std::move(name)) {
  make_current();
  cudaStream_t s;
  STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  try {
    void* f = nullptr;
    STRATA_CUDA_CHECK(cudaMalloc(&f, sizeof(KernelFault)));
    fault_dev_ = static_cast<KernelFault*>(f);
    STRATA_CUDA_CHECK(cudaMemsetAsync(fault_dev_, 0, sizeof(KernelFault), s));
    void* h = nullptr;
    STRATA_CUDA_CHECK(cudaHostAlloc(&h, sizeof(KernelFault), cudaHostAllocDefault));
    fault_host_ = static_cast<KernelFault*>(h);
    std::memset(fault_host_, 0, sizeof(KernelFault));
  } catch (...) {
    release();
    throw;
  }
}

CudaStream::~CudaStream() {
  if (!stream_) return;
  cudaSetDevice(ctx_.ordinal);
  cudaError_t rc;
  {
    // Work still queued may be a collective whose peer never joins: bounded like every wait.
    WatchedWait w(str("CUDA stream '", name_, "' drains as it is destroyed"), WaitKind::host,
                  watchdog_context());
    rc = cudaStreamSynchronize(as_stream(stream_));
  }
  if (rc != cudaSuccess)
    log_warn("cuda::stream", "stream '", name_, "' ended with a CUDA error: ", cudaGetErrorString(rc));
  if (errors_->error) {
    try {
      std::rethrow_exception(errors_->error);
    } catch (const std::exception& e) {
      log_warn("cuda::stream", "stream '", name_, "' destroyed with an unreported error: ", e.what());
    }
  }
  release();
}

void CudaStream::release() noexcept {
  cudaStream_t s = as_stream(stream_);
  if (s) {
    if (scratch_) cudaFreeAsync(scratch_, s);
    if (workspace_) cudaFreeAsync(workspace_, s);
    cudaStreamSynchronize(s);
  }
  scratch_ = workspace_ = nullptr;
  if (fault_dev_) cudaFree(fault_dev_);
  if (fault_host_) cudaFreeHost(fault_host_);
  fault_dev_ = fault_host_ = nullptr;
  if (s) cudaStreamDestroy(s);
  stream_ = nullptr;
  cudaGetLastError();  // a failure while tearing down is not the next caller's error
}

void CudaStream::make_current() const {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ctx_.ordinal)
    STRATA_CUDA_CHECK(cudaSetDevice(ctx_.ordinal));
}

bool CudaStream::poisoned() {
  std::lock_guard<std::mutex> lock(errors_->m);
  return errors_->error != nullptr;
}

void CudaStream::poison(std::exception_ptr error, std::string_view what) {
  std::exception_ptr e = as_error(error, what, name_);
  std::lock_guard<std::mutex> lock(errors_->m);
  if (!errors_->error) errors_->error = e;
}

void CudaStream::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || poisoned()) return;
  try {
    make_current();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream_)));
  } catch (...) {
    poison(std::current_exception(), "copy");
  }
}

void CudaStream::fill_zero(void* dst, size_t bytes) {
  if (bytes == 0 || poisoned()) return;
  try {
    make_current();
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, as_stream(stream_)));
  } catch (...) {
    poison(std::current_exception(), "fill_zero");
  }
}

void CudaStream::host_task(std::string_view label, std::function<void()> fn) {
  if (poisoned()) return;
  auto task = std::make_unique<HostTask>(HostTask{errors_, std::string(label), name_, std::move(fn)});
  try {
    make_current();
    STRATA_CUDA_CHECK(cudaLaunchHostFunc(as_stream(stream_), run_host_task, task.get()));
    task.release();  // owned by the callback from here on
  } catch (...) {
    poison(std::current_exception(), str("host task '", label, "'"));
  }
}

void CudaStream::record(Event& event) {
  CudaEvent& e = cuda_event(event, "cuda::record");
  make_current();
  STRATA_CUDA_CHECK(cudaEventRecord(as_event(e.native()), as_stream(stream_)));
  e.set_recorded_on(name_);
}

void CudaStream::wait(Event& event) {
  CudaEvent& e = cuda_event(event, "cuda::wait");
  make_current();
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), as_event(e.native()), 0));
}

void CudaStream::synchronize() {
  make_current();
  cudaStream_t s = as_stream(stream_);
  // The fault record comes back in stream order, after every kernel enqueued so far.
  const cudaError_t copied =
      cudaMemcpyAsync(fault_host_, fault_dev_, sizeof(KernelFault), cudaMemcpyDeviceToHost, s);
  cudaError_t rc;
  {
    WatchedWait w(str("the host waits for CUDA stream '", name_, "'"), WaitKind::host, watchdog_context());
    rc = cudaStreamSynchronize(s);
  }
  std::exception_ptr host_error;
  {
    std::lock_guard<std::mutex> lock(errors_->m);
    std::swap(host_error, errors_->error);
  }
  if (host_error) {
    if (rc != cudaSuccess)
      log_warn("cuda::stream", "stream '", name_, "' also failed in CUDA: ", cudaGetErrorString(rc));
    std::rethrow_exception(host_error);
  }
  if (rc != cudaSuccess)
    detail::api_failed("cuda", str("cudaStreamSynchronize (stream '", name_, "')").c_str(), __FILE__,
                       __LINE__, static_cast<long>(rc), cudaGetErrorString(rc));
  STRATA_CUDA_CHECK(copied);
  const KernelFault f = *fault_host_;
  if (f.code != kFaultNone) {
    std::memset(fault_host_, 0, sizeof(KernelFault));
    STRATA_CUDA_CHECK(cudaMemsetAsync(fault_dev_, 0, sizeof(KernelFault), s));
    fail(str("cuda::", fault_op_name(f.code)),
         str(fault_value_name(f.code), " ", f.value, " at row ", f.row, " is outside [0, ", f.limit,
             ") (stream '", name_, "')"));
  }
}

// The first 256-byte boundary in a block allocated with 256 bytes to spare.
static void* align256(void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((u + 255) / 256 * 256);
}

void* CudaStream::grow(void*& block, size_t& capacity, size_t bytes, const char* what) {
  if (block && bytes <= capacity) return align256(block);
  make_current();
  cudaStream_t s = as_stream(stream_);
  const size_t want = std::max(bytes, 2 * capacity);
  if (block) {
    STRATA_CUDA_CHECK(cudaFreeAsync(block, s));  // after the work already enqueued
    block = nullptr;
    capacity = 0;
  }
  void* p = nullptr;
  const cudaError_t rc = cudaMallocAsync(&p, want + 256, s);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    fail("cuda::scratch",
         str("could not allocate ", format_bytes(want), " of ", what, " for stream '", name_,
             "': ", cudaGetErrorString(rc)),
         "lower offload.device_mem_limit to leave the GPU room for per-stream scratch");
  }
  block = p;
  capacity = want;
  return align256(p);
}

void* CudaStream::scratch(size_t bytes) {
  std::lock_guard<std::mutex> lock(scratch_m_);
  return grow(scratch_, scratch_bytes_, std::max<size_t>(bytes, 1 << 20), "scratch");
}

void* CudaStream::gemm_workspace(size_t* bytes) {
  std::lock_guard<std::mutex> lock(scratch_m_);
  *bytes = kGemmWorkspaceBytes;
  return grow(workspace_, workspace_bytes_, kGemmWorkspaceBytes, "cuBLASLt workspace");
}

CudaStream& cuda_stream(Stream& s, std::string_view where) {
  auto* cs = dynamic_cast<CudaStream*>(&s);
  if (!cs)
    fail(std::string(where),
         str("stream '", s.name(), "' belongs to a ", device_kind_name(s.device().kind()),
             " device, not to a CUDA device"),
         "launch CUDA work on streams made by the CUDA device (train.device = cuda)");
  return *cs;
}

}  // namespace strata::cuda
