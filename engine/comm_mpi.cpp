// engine/comm_mpi.cpp — the MPI communicator: CPU buffers; every operation is a task on the
// stream it is enqueued on, so the stream's worker thread issues the MPI call in stream order
// and communication overlaps compute running on other streams.
//
// MPI is initialized with MPI_THREAD_MULTIPLE: two communication streams (all-gathers and
// reduce-scatters, each on its own communicator) and the host thread may call MPI at once.
// It does not stage device memory: with a CUDA device, NCCL is the communicator.
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/comm.h"
#include "engine/comm_mpi.h"
#include "kernels/device.h"

namespace strata {
namespace {

// bf16 sums: MPI has no bf16 type, so a user op adds in f32 and rounds back (nearest even).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16_bits(bf16_bits_to_f32(a[i]) + bf16_bits_to_f32(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16_bits_to_f32(a[i]) > bf16_bits_to_f32(b[i])) b[i] = a[i];
}

struct MpiRuntime {
  int provided = 0;
  MPI_Op bf16_sum_op = MPI_OP_NULL, bf16_max_op = MPI_OP_NULL;

  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      STRATA_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE)
      fail("comm::mpi_init", str("the MPI library offers thread level ", provided,
                                 "; strata needs MPI_THREAD_MULTIPLE (gathers and reductions run "
                                 "on two streams at once)"),
           "use an MPI built with thread support (Debian's Open MPI is)");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    STRATA_MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &bf16_sum_op));
    STRATA_MPI_CHECK(MPI_Op_create(&bf16_max, 1, &bf16_max_op));
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
};

MpiRuntime& runtime() {
  static MpiRuntime rt;
  return rt;
}

MPI_Datatype mpi_type(CommType t) {
  switch (t) {
    case CommType::f32: return MPI_FLOAT;
    case CommType::bf16: return MPI_UINT16_T;
    case CommType::f64: return MPI_DOUBLE;
    case CommType::i32: return MPI_INT32_T;
    case CommType::u8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(CommType t, ReduceOp op) {
  if (t == CommType::bf16) return op == ReduceOp::sum ? runtime().bf16_sum_op : runtime().bf16_max_op;
  return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
}

int checked_count(size_t count, const char* what) {
  if (count > size_t(INT_MAX))
    fail(str("comm::", what), str(count, " elements exceed MPI's int count limit (", INT_MAX, ")"),
         "split the transfer; units this large need smaller shards (more data-parallel ranks)");
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm out;
    STRATA_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
    return std::make_unique<MpiCommunicator>(out, true);
  }

  void all_gather(Stream& s, void* recv, const void* send, size_t count, CommType t) override {
    int n = checked_count(count, "all_gather");
    MPI_Comm c = comm_;
    check_host(s, "all_gather");
    s.host_task("all_gather", [=] {
      STRATA_MPI_CHECK(MPI_Allgather(send == recv ? MPI_IN_PLACE : send, n, mpi_type(t), recv, n,
                                     mpi_type(t), c));
    });
  }

  void reduce_scatter(Stream& s, void* recv, const void* send, size_t count, CommType t,
                      ReduceOp op) override {
    int n = checked_count(count, "reduce_scatter");
    MPI_Comm c = comm_;
    check_host(s, "reduce_scatter");
    s.host_task("reduce_scatter", [=] {
      STRATA_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(t, op), c));
    });
  }

  void all_reduce(Stream& s, void* buf, size_t count, CommType t, ReduceOp op) override {
    int n = checked_count(count, "all_reduce");
    MPI_Comm c = comm_;
    check_host(s, "all_reduce");
    s.host_task("all_reduce", [=] {
      STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_type(t), mpi_op(t, op), c));
    });
  }

  void broadcast(Stream& s, void* buf, size_t count, CommType t, int root) override {
    int n = checked_count(count, "broadcast");
    STRATA_CHECK(root >= 0 && root < size_, "comm::broadcast", "root ", root, " of ", size_, " ranks");
    MPI_Comm c = comm_;
    check_host(s, "broadcast");
    s.host_task("broadcast", [=] { STRATA_MPI_CHECK(MPI_Bcast(buf, n, mpi_type(t), root, c)); });
  }

  void send(Stream& s, const void* buf, size_t count, CommType t, int peer, int tag) override {
    int n = checked_count(count, "send");
    STRATA_CHECK(peer >= 0 && peer < size_, "comm::send", "peer ", peer, " of ", size_, " ranks");
    MPI_Comm c = comm_;
    check_host(s, "send");
    s.host_task("send", [=] { STRATA_MPI_CHECK(MPI_Send(buf, n, mpi_type(t), peer, tag, c)); });
  }

  void recv(Stream& s, void* buf, size_t count, CommType t, int peer, int tag) override {
    int n = checked_count(count, "recv");
    STRATA_CHECK(peer >= 0 && peer < size_, "comm::recv", "peer ", peer, " of ", size_, " ranks");
    MPI_Comm c = comm_;
    check_host(s, "recv");
    s.host_task("recv", [=] {
      STRATA_MPI_CHECK(MPI_Recv(buf, n, mpi_type(t), peer, tag, c, MPI_STATUS_IGNORE));
    });
  }

  void barrier(Stream& s) override {
    MPI_Comm c = comm_;
    check_host(s, "barrier");
    s.host_task("barrier", [=] { STRATA_MPI_CHECK(MPI_Barrier(c)); });
  }

 private:
  static void check_host(Stream& s, const char* what) {
    if (s.device().kind() != DeviceKind::cpu)
      fail(str("comm::", what), "the MPI communicator moves host (CPU device) buffers only",
           "use the NCCL communicator with a CUDA device");
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool mpi_built() { return true; }

void mpi_abort_if_running(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<Communicator> make_mpi_world() {
  runtime();
  MPI_Comm dup;
  STRATA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::make_unique<MpiCommunicator>(dup, true);
}

}  // namespace strata
