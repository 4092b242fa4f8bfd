// comm/comm_nccl.cpp — the NCCL communicator: collectives and point-to-point transfers of CUDA
// buffers (see comm_nccl.h for the contract and the bootstrap).
//
// Ordering: each operation records an event on the caller's stream, makes the communicator's
// own stream wait for it, issues the NCCL call there, records a second event and makes the
// caller's stream wait for that — the host never waits. One mutex serializes the host calls on
// one communicator (NCCL communicators are not thread-safe), which also fixes the order in which
// operations reach NCCL: every rank must issue the same operations in the same order.
// Errors: a failed NCCL call, or an asynchronous error NCCL reports before the next call, aborts
// the communicator (ncclCommAbort) and throws; every later call then fails at once.
// Host buffers (pinned or pageable) are staged through a device buffer on the communicator's
// stream; a pageable source is read when the call is made (CUDA copies it at once), a pageable
// destination makes the call wait for the result. Tags of send/recv are not used: NCCL matches
// point-to-point transfers by order between each pair of ranks.
// Not here: grouped send/recv (ncclGroupStart), user buffer registration.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/watchdog.h"
#include "comm/comm_nccl.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device.h"

namespace strata {
namespace {

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::f32: return ncclFloat32;
    case CommType::bf16: return ncclBfloat16;
    case CommType::f64: return ncclFloat64;
    case CommType::i32: return ncclInt32;
    case CommType::u8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

void use_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) STRATA_CUDA_CHECK(cudaSetDevice(device));
}

// Device (or managed) memory NCCL may read and write directly; anything else is staged.
bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

size_t round256(size_t n) { return (n + 255) / 256 * 256; }

// Every live NCCL communicator of the process, so that ending the job can abort them all first
// (ncclCommAbort is safe while another thread is blocked in the same communicator).
std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::set<ncclComm_t>& live_comms() {
  static std::set<ncclComm_t> s;
  return s;
}
void track(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(live_mutex());
  live_comms().insert(c);
}
void untrack(ncclComm_t c) noexcept {
  std::lock_guard<std::mutex> lock(live_mutex());
  live_comms().erase(c);
}

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (aborting it if construction fails).
  NcclCommunicator(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    try {
      use_device(device_);
      STRATA_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
      STRATA_NCCL_CHECK(ncclCommCount(comm_, &size_));
      STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      STRATA_CUDA_CHECK(cudaMalloc(&barrier_, sizeof(float)));
      STRATA_CUDA_CHECK(cudaMemset(barrier_, 0, sizeof(float)));
      track(comm_);
    } catch (...) {
      teardown(true);
      throw;
    }
  }
  ~NcclCommunicator() override { teardown(false); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  // A negative color leaves this rank out (NCCL_SPLIT_NOCOLOR): it gets nullptr.
  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclComm_t out = nullptr;
    {
      std::lock_guard<std::mutex> lock(m_);
      check_alive("split");
      use_device(device_);
      // Collective over this communicator: it returns once every rank has called it.
      WatchedWait w(str("ncclCommSplit of a ", size_, "-rank NCCL communicator"),
                    WaitKind::collective, watchdog_context());
      checked(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, nullptr),
              "ncclCommSplit", __LINE__);
    }
    if (!out) return nullptr;
    return std::make_unique<NcclCommunicator>(out, device_);
  }

  void all_gather(Stream& s, void* recv, const void* send, size_t count, CommType t) override {
    const size_t bytes = count * comm_type_bytes(t);
    if (count == 0) return;
    // send == recv: this rank's piece already sits in recv at its offset (as MPI_IN_PLACE).
    const void* in = send == recv ? static_cast<const char*>(recv) + size_t(rank_) * bytes : send;
    enqueue(s, "all_gather", [&](cudaStream_t st) {
      Io io = stage(st, in, bytes, recv, bytes * size_t(size_));
      checked(ncclAllGather(io.in, io.out, count, nccl_type(t), comm_, st), "ncclAllGather", __LINE__);
      unstage(st, io);
    });
  }

  void reduce_scatter(Stream& s, void* recv, const void* send, size_t count, CommType t,
                      ReduceOp op) override {
    const size_t bytes = count * comm_type_bytes(t);
    if (count == 0) return;
    enqueue(s, "reduce_scatter", [&](cudaStream_t st) {
      Io io = stage(st, send, bytes * size_t(size_), recv, bytes);
      checked(ncclReduceScatter(io.in, io.out, count, nccl_type(t), nccl_op(op), comm_, st),
              "ncclReduceScatter", __LINE__);
      unstage(st, io);
    });
  }

  void all_reduce(Stream& s, void* buf, size_t count, CommType t, ReduceOp op) override {
    const size_t bytes = count * comm_type_bytes(t);
    if (count == 0) return;
    enqueue(s, "all_reduce", [&](cudaStream_t st) {
      Io io = stage(st, buf, bytes, buf, bytes);
      checked(ncclAllReduce(io.in, io.out, count, nccl_type(t), nccl_op(op), comm_, st),
              "ncclAllReduce", __LINE__);
      unstage(st, io);
    });
  }

  void broadcast(Stream& s, void* buf, size_t count, CommType t, int root) override {
    STRATA_CHECK(root >= 0 && root < size_, "comm::broadcast", "root ", root, " of ", size_, " ranks");
    const size_t bytes = count * comm_type_bytes(t);
    if (count == 0) return;
    enqueue(s, "broadcast", [&](cudaStream_t st) {
      Io io = stage(st, buf, bytes, buf, bytes);
      checked(ncclBroadcast(io.in, io.out, count, nccl_type(t), root, comm_, st), "ncclBroadcast",
              __LINE__);
      unstage(st, io);
    });
  }

  void send(Stream& s, const void* buf, size_t count, CommType t, int peer, int /*tag*/) override {
    STRATA_CHECK(peer >= 0 && peer < size_, "comm::send", "peer ", peer, " of ", size_, " ranks");
    const size_t bytes = count * comm_type_bytes(t);
    if (count == 0) return;
    enqueue(s, "send", [&](cudaStream_t st) {
      Io io = stage(st, buf, bytes, nullptr, 0);
      checked(ncclSend(io.in, count, nccl_type(t), peer, comm_, st), "ncclSend", __LINE__);
    });
  }

  void recv(Stream& s, void* buf, size_t count, CommType t, int peer, int /*tag*/) override {
    STRATA_CHECK(peer >= 0 && peer < size_, "comm::recv", "peer ", peer, " of ", size_, " ranks");
    const size_t bytes = count * comm_type_bytes(t);
    if (count == 0) return;
    enqueue(s, "recv", [&](cudaStream_t st) {
      Io io = stage(st, nullptr, 0, buf, bytes);
      checked(ncclRecv(io.out, count, nccl_type(t), peer, comm_, st), "ncclRecv", __LINE__);
      unstage(st, io);
    });
  }

  // NCCL has no barrier: an all-reduce of one float that every rank must join.
  void barrier(Stream& s) override {
    enqueue(s, "barrier", [&](cudaStream_t st) {
      checked(ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm_, st), "ncclAllReduce",
              __LINE__);
    });
  }

 private:
  // Device addresses of one operation's input and output. When the caller's output is host
  // memory, host_out and out_bytes say where unstage() copies the result back.
  struct Io {
    const void* in = nullptr;
    void* out = nullptr;
    void* host_out = nullptr;
    size_t out_bytes = 0;
  };

  // The operation body runs with the mutex held, on the communicator's stream `st`, after the
  // caller's stream (event ready_), and the caller's stream then waits for it (event done_).
  // Enqueueing is watched: NCCL can block the host in it (connecting to a peer on first use, or
  // a full work queue behind a peer that never joins), and other threads wait on the mutex.
  template <class F>
  void enqueue(Stream& s, const char* what, F&& body) {
    cudaStream_t caller = static_cast<cudaStream_t>(cuda::native_stream(s));
    WatchedWait w(str("enqueueing an NCCL ", what, " on '", name(), "'"), WaitKind::collective,
                  watchdog_context());
    std::lock_guard<std::mutex> lock(m_);
    check_alive(what);
    use_device(device_);
    STRATA_CUDA_CHECK(cudaEventRecord(ready_, caller));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    body(stream_);
    STRATA_CUDA_CHECK(cudaEventRecord(done_, stream_));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(caller, done_, 0));
  }

  // Throws unless the communicator is usable: not aborted, no asynchronous NCCL error.
  void check_alive(const char* what) {
    if (!comm_)
      fail(str("comm::nccl::", what), "the NCCL communicator was aborted after an earlier error",
           "the run cannot continue on this communicator; restart from the last checkpoint");
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
    if (rc != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      const ncclResult_t bad = rc != ncclSuccess ? rc : async;
      abort_now();
      detail::api_failed("nccl", str("asynchronous error before ", what).c_str(), __FILE__, __LINE__,
                         static_cast<long>(bad), ncclGetErrorString(bad));
    }
  }

  void checked(ncclResult_t rc, const char* call, int line) {
    if (rc == ncclSuccess) return;
    abort_now();
    detail::api_failed("nccl", call, __FILE__, line, static_cast<long>(rc), ncclGetErrorString(rc));
  }

  void abort_now() noexcept {
    if (!comm_) return;
    log_warn("comm::nccl", "aborting the NCCL communicator (rank ", rank_, " of ", size_, ")");
    untrack(comm_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Staging buffer of at least `bytes` on the communicator's stream (stream-ordered growth).
  char* staging(cudaStream_t st, size_t bytes) {
    if (bytes > staging_bytes_) {
      const size_t want = std::max(bytes, 2 * staging_bytes_);
      if (staging_) STRATA_CUDA_CHECK(cudaFreeAsync(staging_, st));
      staging_ = nullptr;
      staging_bytes_ = 0;
      STRATA_CUDA_CHECK(cudaMallocAsync(&staging_, want, st));
      staging_bytes_ = want;
    }
    return static_cast<char*>(staging_);
  }

  Io stage(cudaStream_t st, const void* in, size_t in_bytes, void* out, size_t out_bytes) {
    Io io{in, out, nullptr, 0};
    const bool host_in = in && !on_device(in);
    const bool host_out = out && !on_device(out);
    if (!host_in && !host_out) return io;
    const bool in_place = in == out;
    const size_t need = in_place ? round256(out_bytes)
                                 : (host_in ? round256(in_bytes) : 0) + (host_out ? round256(out_bytes) : 0);
    char* base = staging(st, need);
    if (in_place) {  // both host: one region, copied in and back
      STRATA_CUDA_CHECK(cudaMemcpyAsync(base, in, in_bytes, cudaMemcpyHostToDevice, st));
      return Io{base, base, out, out_bytes};
    }
    if (host_in) {
      STRATA_CUDA_CHECK(cudaMemcpyAsync(base, in, in_bytes, cudaMemcpyHostToDevice, st));
      io.in = base;
      base += round256(in_bytes);
    }
    if (host_out) {
      io.out = base;
      io.host_out = out;
      io.out_bytes = out_bytes;
    }
    return io;
  }

  void unstage(cudaStream_t st, const Io& io) {
    if (io.host_out)
      STRATA_CUDA_CHECK(cudaMemcpyAsync(io.host_out, io.out, io.out_bytes, cudaMemcpyDeviceToHost, st));
  }

  void teardown(bool abort) noexcept {
    cudaSetDevice(device_);
    if (comm_) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (abort || (async != ncclSuccess && async != ncclInProgress)) {
        abort_now();
      } else {
        if (stream_) {  // every operation issued has completed (a peer that never joins: watched)
          WatchedWait w(str("the stream of NCCL communicator '", name(),
                            "' drains before ncclCommDestroy"),
                        WaitKind::collective, watchdog_context());
          cudaStreamSynchronize(stream_);
        }
        untrack(comm_);
        const ncclResult_t rc = ncclCommDestroy(comm_);
        if (rc != ncclSuccess) log_warn("comm::nccl", "ncclCommDestroy: ", ncclGetErrorString(rc));
        comm_ = nullptr;
      }
    }
    if (stream_) {
      if (staging_) cudaFreeAsync(staging_, stream_);
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (barrier_) cudaFree(barrier_);
    if (done_) cudaEventDestroy(done_);
    if (ready_) cudaEventDestroy(ready_);
    stream_ = nullptr;
    staging_ = barrier_ = nullptr;
    done_ = ready_ = nullptr;
    cudaGetLastError();
  }

  std::mutex m_;
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  void* barrier_ = nullptr;
};

}  // namespace

bool nccl_built() { return true; }

void nccl_abort_all() noexcept {
  std::lock_guard<std::mutex> lock(live_mutex());
  for (ncclComm_t c : live_comms()) ncclCommAbort(c);
  live_comms().clear();
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device) {
  const int devices = cuda::device_count();
  if (cuda_device < 0 || cuda_device >= devices)
    fail("comm::nccl", str("CUDA device ", cuda_device, " does not exist (", devices, " visible)"),
         "give each rank a device below the GPU count of its node (e.g. its node-local rank)");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (bootstrap.rank() == 0) STRATA_NCCL_CHECK(ncclGetUniqueId(&id));
  if (bootstrap.size() > 1) {
    // The id's bytes go from rank 0 to all over the bootstrap communicator, in host memory.
    auto host = make_device(DeviceKind::cpu);
    auto stream = host->make_stream("nccl bootstrap");
    Buffer bytes = host->alloc_host(sizeof(id), false, "ncclUniqueId");
    std::memcpy(bytes.data(), &id, sizeof(id));
    bootstrap.broadcast(*stream, bytes.data(), sizeof(id), CommType::u8, 0);
    stream->synchronize();
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  use_device(cuda_device);
  ncclComm_t comm = nullptr;
  {
    // Connects to every rank of the group: returns once all of them have called it.
    WatchedWait w(str("ncclCommInitRank of a ", bootstrap.size(), "-rank NCCL communicator"),
                  WaitKind::collective, watchdog_context());
    STRATA_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  }
  return std::make_unique<NcclCommunicator>(comm, cuda_device);
}

}  // namespace strata
