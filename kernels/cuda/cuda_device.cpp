// kernels/cuda/cuda_device.cpp — the CUDA Device: capped device memory, pinned host memory,
// streams and events (cuda_stream.cpp), the op launchers (cuda_ops.cpp); and the backend's entry
// points for the registry and `strata info` (cuda_backend.h).
//
// Device memory: one cudaMalloc per Buffer, counted against a hard cap (DeviceOptions::
// mem_limit_bytes, else the memory free on the GPU when the device is made); past the cap an
// Error names the request, the use and the limit, as on the CPU device. strata allocates its
// buffers once when a run starts, so there is no caching layer: a Buffer's release is a cudaFree
// (which waits for the device to be idle — never in the training loop).
// Pinned host memory: a 4096-aligned allocation registered with cudaHostRegister, so the same
// bytes serve O_DIRECT reads and fast DMA.
// Not counted against the cap: each stream's scratch and cuBLASLt workspace (cuda_stream.h),
// and the CUDA context itself.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <sys/mman.h>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/gemm.h"

#ifndef STRATA_CUDA_ARCHS
#define STRATA_CUDA_ARCHS "unknown"
#endif

namespace strata::cuda {
namespace {

constexpr size_t kDeviceAlign = 256;
constexpr size_t kHostAlign = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

// The lowest compute capability (as 10·major + minor) the build has machine code or PTX for; 0
// when the list is not numeric ("native", "all").
int lowest_built_arch() {
  int lowest = 0;
  std::string archs = STRATA_CUDA_ARCHS;
  for (size_t i = 0; i < archs.size();) {
    if (!std::isdigit(static_cast<unsigned char>(archs[i]))) {
      ++i;
      continue;
    }
    int v = 0;
    while (i < archs.size() && std::isdigit(static_cast<unsigned char>(archs[i]))) v = v * 10 + (archs[i++] - '0');
    while (i < archs.size() && archs[i] != ',') ++i;  // skip suffixes such as -real, a
    if (lowest == 0 || v < lowest) lowest = v;
  }
  return lowest;
}

std::string runtime_versions() {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  cudaGetLastError();
  auto v = [](int x) { return str(x / 1000, ".", (x % 1000) / 10); };
  return str("CUDA runtime ", v(rt), ", driver ", drv ? v(drv) : std::string("none"));
}

// ---- memory ---------------------------------------------------------------------------------

class CudaMemory final : public BufferReleaser {
 public:
  CudaMemory(int ordinal, uint64_t limit) : ordinal_(ordinal), limit_(limit) {}

  Buffer alloc_device(size_t bytes, std::string_view what) {
    const size_t n = round_up(bytes ? bytes : 1, kDeviceAlign);
    std::lock_guard<std::mutex> lock(m_);
    if (used_ + n > limit_)
      fail("cuda::alloc",
           str("device memory exhausted: ", what, " needs ", format_bytes(n), ", ",
               format_bytes(used_), " of ", format_bytes(limit_), " already in use (limit ",
               format_bytes(limit_), ")"),
           "raise offload.device_mem_limit, shrink the model or batch, or offload states to "
           "host/nvme (run `strata plan` to see what each tier needs)");
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal_));
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, n);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      cudaGetLastError();
      fail("cuda::alloc",
           str("cudaMalloc of ", format_bytes(n), " for ", what, " failed: the GPU has ",
               format_bytes(free_bytes), " free of ", format_bytes(total_bytes), " (strata holds ",
               format_bytes(used_), " under a limit of ", format_bytes(limit_), ")"),
           "another process may hold GPU memory; lower offload.device_mem_limit to what the GPU "
           "can give, or offload states to host/nvme");
    }
    STRATA_CUDA_CHECK(rc);
    used_ += n;
    peak_ = std::max(peak_, used_);
    return Buffer(p, n, MemoryKind::device, this);
  }

  // Pinned: aligned_alloc + cudaHostRegister, so the bytes are aligned by construction. Where
  // registering is refused (some sandboxed drivers), cudaHostAlloc, whose memory is page-aligned
  // in practice — checked, since O_DIRECT depends on it.
  // Large buffers sit on 2 MiB boundaries and ask for transparent huge pages, as on the CPU
  // device (larger direct-I/O requests; fewer pages to pin).
  Buffer alloc_host(size_t bytes, bool pinned, std::string_view what) {
    const size_t align = bytes >= kHugePage ? kHugePage : kHostAlign;
    const size_t n = round_up(bytes ? bytes : 1, align);
    void* p = std::aligned_alloc(align, n);
    if (!p) fail("cuda::alloc_host", str("out of host memory allocating ", format_bytes(n), " for ", what));
    if (align == kHugePage) madvise(p, n, MADV_HUGEPAGE);
    if (!pinned) return Buffer(p, n, MemoryKind::host, this);
    const cudaError_t rc = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (rc == cudaSuccess) {
      std::lock_guard<std::mutex> lock(m_);
      pinned_ += n;
      return Buffer(p, n, MemoryKind::host_pinned, this);
    }
    cudaGetLastError();
    std::free(p);
    void* h = nullptr;
    const cudaError_t rc2 = cudaHostAlloc(&h, n, cudaHostAllocPortable);
    if (rc2 != cudaSuccess || reinterpret_cast<uintptr_t>(h) % kHostAlign != 0) {
      cudaGetLastError();
      if (rc2 == cudaSuccess) cudaFreeHost(h);
      fail("cuda::alloc_host",
           str("could not pin ", format_bytes(n), " of host memory for ", what,
               ": cudaHostRegister: ", cudaGetErrorString(rc), "; cudaHostAlloc: ",
               rc2 == cudaSuccess ? "not 4096-aligned" : cudaGetErrorString(rc2)),
           "lower offload.pinned_mem_limit, or raise the locked-memory limit (ulimit -l)");
    }
    if (first_time("cuda::alloc_host fallback"))
      log_warn("cuda::alloc_host", "cudaHostRegister failed (", cudaGetErrorString(rc),
               "); pinned host memory comes from cudaHostAlloc instead");
    std::lock_guard<std::mutex> lock(m_);
    pinned_ += n;
    host_alloced_.insert(h);
    return Buffer(h, n, MemoryKind::host_pinned, this);
  }

  // Caller-mapped memory (huge-page staging): registered in place, released by the caller.
  bool pin(void* p, size_t n, std::string_view what) {
    const cudaError_t rc = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      log_warn_once("cuda::pin_host", "cuda::pin_host", "cudaHostRegister of ", format_bytes(n),
                    " for ", what, " failed (", cudaGetErrorString(rc),
                    "); that memory comes from alloc_host instead");
      return false;
    }
    std::lock_guard<std::mutex> lock(m_);
    pinned_ += n;
    return true;
  }
  void unpin(void* p, size_t n) noexcept {
    cudaError_t rc;
    {
      WatchedWait w = watched_release("cudaHostUnregister", n);
      rc = cudaHostUnregister(p);
    }
    if (rc != cudaSuccess) log_warn("cuda::unpin_host", "cudaHostUnregister failed: ", cudaGetErrorString(rc));
    cudaGetLastError();
    std::lock_guard<std::mutex> lock(m_);
    pinned_ -= n;
  }

  // cudaFree, cudaFreeHost and cudaHostUnregister wait for all the device's work, NCCL kernels
  // included; one held by a peer that never joins would hold them, so they are watched.
  static WatchedWait watched_release(const char* call, size_t bytes) {
    return WatchedWait(str(call, " of ", format_bytes(bytes), " (it waits for the whole device)"),
                       WaitKind::stream, watchdog_context());
  }

  void release(void* ptr, size_t bytes, MemoryKind kind) noexcept override {
    if (kind == MemoryKind::device) {
      cudaSetDevice(ordinal_);
      cudaError_t rc;
      {
        WatchedWait w = watched_release("cudaFree", bytes);
        rc = cudaFree(ptr);
      }
      if (rc != cudaSuccess) log_warn("cuda::free", "cudaFree failed: ", cudaGetErrorString(rc));
      cudaGetLastError();
      std::lock_guard<std::mutex> lock(m_);
      used_ -= bytes;
      return;
    }
    if (kind == MemoryKind::host_pinned) {
      bool host_alloced;
      {
        std::lock_guard<std::mutex> lock(m_);
        pinned_ -= bytes;
        host_alloced = host_alloced_.erase(ptr) > 0;
      }
      cudaError_t rc;
      {
        WatchedWait w =
            watched_release(host_alloced ? "cudaFreeHost" : "cudaHostUnregister", bytes);
        rc = host_alloced ? cudaFreeHost(ptr) : cudaHostUnregister(ptr);
      }
      if (rc != cudaSuccess) log_warn("cuda::free", "releasing pinned memory failed: ", cudaGetErrorString(rc));
      cudaGetLastError();
      if (host_alloced) return;
    }
    std::free(ptr);
  }

  DeviceMemoryStats stats() const {
    std::lock_guard<std::mutex> lock(m_);
    return DeviceMemoryStats{limit_, used_, peak_, pinned_};
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(m_);
    peak_ = used_;
  }

 private:
  int ordinal_;
  uint64_t limit_;
  mutable std::mutex m_;
  uint64_t used_ = 0, peak_ = 0, pinned_ = 0;
  std::unordered_set<void*> host_alloced_;  // pinned blocks from cudaHostAlloc (the fallback)
};

// ---- device ---------------------------------------------------------------------------------

uint64_t free_memory(int ordinal) {
  STRATA_CUDA_CHECK(cudaSetDevice(ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const DeviceOptions& o)
      : ordinal_(o.ordinal),
        memory_(o.ordinal, o.mem_limit_bytes ? o.mem_limit_bytes : free_memory(o.ordinal)) {
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop_, ordinal_));
    const int cc = prop_.major * 10 + prop_.minor;
    const int lowest = lowest_built_arch();
    if (lowest > 0 && cc < lowest)
      fail("cuda::make_device",
           str("device ", ordinal_, " (", prop_.name, ") has compute capability ", prop_.major, ".",
               prop_.minor, " but this strata was built for CUDA architectures ", STRATA_CUDA_ARCHS),
           "rebuild with -DCMAKE_CUDA_ARCHITECTURES=native (or the GPU's own, e.g. 75)");
    cublasLtHandle_t lt = nullptr;
    STRATA_CUBLAS_CHECK(cublasLtCreate(&lt));
    ctx_.ordinal = ordinal_;
    ctx_.lt_handle = lt;
    ctx_.gemm_cache = gemm_cache_create();
    ops_ = make_cuda_ops(o.bf16_matmuls);
    log_debug("cuda", "device ", name(), ", memory limit ", format_bytes(memory_.stats().limit_bytes));
  }

  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    ops_.reset();
    gemm_cache_destroy(ctx_.gemm_cache);
    if (ctx_.lt_handle) cublasLtDestroy(static_cast<cublasLtHandle_t>(ctx_.lt_handle));
    cudaGetLastError();
  }

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override {
    return str("cuda:", ordinal_, " (", prop_.name, ", ", format_bytes(prop_.totalGlobalMem), ", sm_",
               prop_.major, prop_.minor, ")");
  }
  Buffer alloc(size_t bytes, std::string_view what) override {
    return memory_.alloc_device(bytes, what);
  }
  Buffer alloc_host(size_t bytes, bool pinned, std::string_view what) override {
    return memory_.alloc_host(bytes, pinned, what);
  }
  bool pin_host(void* ptr, size_t bytes, std::string_view what) override {
    cudaSetDevice(ordinal_);
    return memory_.pin(ptr, bytes, what);
  }
  void unpin_host(void* ptr, size_t bytes) noexcept override {
    cudaSetDevice(ordinal_);
    memory_.unpin(ptr, bytes);
  }
  std::unique_ptr<Stream> make_stream(std::string name) override {
    return std::make_unique<CudaStream>(*this, ctx_, std::move(name));
  }
  std::unique_ptr<Event> make_event() override { return std::make_unique<CudaEvent>(ordinal_); }
  Ops& ops() override { return *ops_; }
  DeviceMemoryStats memory() const override { return memory_.stats(); }
  void reset_peak() override { memory_.reset_peak(); }

 private:
  int ordinal_;
  cudaDeviceProp prop_{};
  CudaMemory memory_;
  DeviceContext ctx_;
  std::unique_ptr<Ops> ops_;
};

}  // namespace

// ---- entry points (cuda_backend.h) ----------------------------------------------------------

bool built() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error here
    return 0;
  }
  return n;
}

std::string describe() {
  std::string out = str(runtime_versions(), "; built for CUDA architectures ", STRATA_CUDA_ARCHS);
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return str(out, "; no CUDA device (", cudaGetErrorString(rc), ")");
  }
  out += str("; ", n, n == 1 ? " device" : " devices");
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      out += str("; [", i, "] (properties unavailable)");
      continue;
    }
    out += str("; [", i, "] ", p.name, ", ", format_bytes(p.totalGlobalMem), ", compute capability ",
               p.major, ".", p.minor, ", ", p.multiProcessorCount, " SMs");
  }
  return out;
}

std::unique_ptr<Device> make_device(const DeviceOptions& options) {
  const int n = device_count();
  if (n == 0)
    fail("cuda::make_device", str("no CUDA device is available (", describe(), ")"),
         "check nvidia-smi and the driver, or use train.device = cpu");
  if (options.ordinal < 0 || options.ordinal >= n)
    fail("cuda::make_device", str("CUDA device ", options.ordinal, " does not exist: ", n,
                                  n == 1 ? " device is" : " devices are", " visible"),
         "pick an ordinal below the device count (CUDA_VISIBLE_DEVICES renumbers them)");
  return std::make_unique<CudaDevice>(options);
}

void* native_stream(Stream& s) {
  CudaStream& cs = cuda_stream(s, "cuda::native_stream");
  cs.make_current();  // the caller is about to launch on it
  return cs.native();
}

int gemm_bf16_candidates(Stream& s, uint16_t* out, const uint16_t* a, const uint16_t* b, int m,
                         int n, int k) {
  CudaStream& cs = cuda_stream(s, "cuda::gemm_bf16_candidates");
  return gemm_candidates(cs, GemmType::bf16, false, true, m, n, k, a, k, b, k, out, n);
}

void gemm_bf16(Stream& s, uint16_t* out, const uint16_t* a, const uint16_t* b, int m, int n, int k,
               int candidate) {
  CudaStream& cs = cuda_stream(s, "cuda::gemm_bf16");
  gemm(cs, GemmType::bf16, false, true, m, n, k, a, k, b, k, 0.0f, out, n, candidate);
}

}  // namespace strata::cuda
