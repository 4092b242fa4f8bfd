// comm/comm_mpi.cpp — the MPI communicator: CPU buffers; every operation is a task on the
// stream it is enqueued on, so the stream's worker thread issues the MPI call in stream order
// and communication overlaps compute running on other streams.
//
// MPI is initialized with MPI_THREAD_MULTIPLE: two communication streams (all-gathers and
// reduce-scatters, each on its own communicator) and the host thread may call MPI at once.
// It does not stage device memory: with a CUDA device, NCCL is the communicator.
//
// Arrival tracking (for the watchdog): one RMA window over MPI_COMM_WORLD holds, on every rank, a
// counter per communicator of the collectives that rank has entered. A rank updates only its own
// counters (plain atomic stores into its window memory); when a collective outlasts
// parallel.timeout, the watchdog reads every member's counter (MPI_Get under a shared lock, which
// needs no help from the target on shared memory) and names the ranks that never arrived.
// Communicators are numbered in creation order, which is the same on every rank (creation is
// collective and strata is SPMD).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "comm/comm.h"
#include "core/watchdog.h"
#include "comm/comm_mpi.h"
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

struct MpiRuntime;
MpiRuntime& runtime();

constexpr int kTrackedComms = 256;  // communicators with arrival counters (more are untracked)

struct MpiRuntime {
  int provided = 0;
  MPI_Op bf16_sum_op = MPI_OP_NULL, bf16_max_op = MPI_OP_NULL;
  MPI_Win progress_win = MPI_WIN_NULL;  // kTrackedComms int64 counters per rank
  int64_t* progress = nullptr;          // this rank's counters (the window's memory)
  std::atomic<int> next_comm_id{0};

  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    // Setup and teardown are bounded like every other wait: a rank the launcher never started,
    // or one that died before it got here, leaves the others blocked in them, and the watchdog
    // ends the job after the timeout (the handler, MPI_Abort, is installed before this runs).
    if (!initialized) {
      WatchedWait w("MPI_Init_thread (the launcher connecting every rank)", WaitKind::collective);
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
    {
      WatchedWait w("MPI_Win_allocate of the arrival counters on MPI_COMM_WORLD",
                    WaitKind::collective);
      STRATA_MPI_CHECK(MPI_Win_allocate(MPI_Aint(kTrackedComms * sizeof(int64_t)),
                                        sizeof(int64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &progress,
                                        &progress_win));
    }
    for (int i = 0; i < kTrackedComms; ++i) std::atomic_ref<int64_t>(progress[i]).store(0);
    MPI_Win_set_errhandler(progress_win, MPI_ERRORS_RETURN);
    {
      WatchedWait w("barrier on MPI_COMM_WORLD after setup", WaitKind::collective);
      STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // every counter is zero before anyone reads
    }
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      // Both are collective over the world: a rank that never exits holds the others here.
      // (The watchdog's state outlives static destruction: watched from an exit handler too.)
      WatchedWait w("MPI_Finalize at exit (every rank must reach it)", WaitKind::collective);
      MpiRuntime& rt = runtime();
      if (rt.progress_win != MPI_WIN_NULL) MPI_Win_free(&rt.progress_win);
      MPI_Finalize();
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

const char* type_name(CommType t) {
  switch (t) {
    case CommType::f32: return "f32";
    case CommType::bf16: return "bf16";
    case CommType::f64: return "f64";
    case CommType::i32: return "i32";
    case CommType::u8: return "u8";
  }
  return "?";
}

// What the watchdog needs of one communicator: its arrival counter and its members' world ranks.
// Shared with the tasks in flight, so a report can read it while the communicator goes away.
struct Tracker {
  int id = -1;                  // counter index in the progress window; -1: untracked
  std::vector<int> world_ranks; // member i of the communicator is world rank world_ranks[i]
  std::atomic<int64_t> entered{0};

  // This rank enters its next collective; returns its sequence number (1, 2, ...).
  int64_t enter() {
    const int64_t seq = entered.fetch_add(1) + 1;
    if (id >= 0) std::atomic_ref<int64_t>(runtime().progress[id]).store(seq, std::memory_order_release);
    return seq;
  }

  // Which members have not entered collective `seq` yet (run by the watchdog's report).
  std::string arrivals(int64_t seq, const std::string& name) const {
    if (id < 0) return "(arrivals are not tracked for this communicator)";
    MPI_Win win = runtime().progress_win;
    std::string missing, behind;
    for (int w : world_ranks) {
      int64_t v = -1;
      if (MPI_Win_lock(MPI_LOCK_SHARED, w, 0, win) != MPI_SUCCESS) return "(arrivals unreadable)";
      MPI_Get(&v, 1, MPI_INT64_T, w, MPI_Aint(id), 1, MPI_INT64_T, win);
      MPI_Win_unlock(w, win);
      if (v < seq) {
        missing += str(missing.empty() ? "" : ", ", w);
        behind += str(behind.empty() ? "" : ", ", "rank ", w, " entered ", v);
      }
    }
    if (missing.empty())
      return str("every rank of '", name, "' arrived at collective #", seq,
                 " (the collective itself is stuck)");
    return str("ranks that did not arrive: ", missing, " (collective #", seq, " on '", name, "'; ",
               behind, ")");
  }
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    tracker_ = std::make_shared<Tracker>();
    const int id = runtime().next_comm_id.fetch_add(1);
    tracker_->id = id < kTrackedComms ? id : -1;
    MPI_Group mine, world;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks(size_t(size_), 0);
    for (int i = 0; i < size_; ++i) ranks[size_t(i)] = i;
    tracker_->world_ranks.resize(size_t(size_));
    MPI_Group_translate_ranks(mine, size_, ranks.data(), world, tracker_->world_ranks.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!owned_ || finalized) return;
    // Collective in MPI's terms: an implementation may wait here for the other ranks.
    WatchedWait w(str("MPI_Comm_free of a communicator of ", size_, " ranks at teardown"),
                  WaitKind::collective);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm out;
    {
      WatchedWait w(str("MPI_Comm_split of '", name(), "'"), WaitKind::collective, watchdog_context());
      STRATA_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
    }
    auto c = std::make_unique<MpiCommunicator>(out, true);
    c->set_name(name() + ".split");
    return c;
  }

  void all_gather(Stream& s, void* recv, const void* send, size_t count, CommType t) override {
    int n = checked_count(count, "all_gather");
    MPI_Comm c = comm_;
    collective(s, "all_gather", count, t, [=] {
      STRATA_MPI_CHECK(MPI_Allgather(send == recv ? MPI_IN_PLACE : send, n, mpi_type(t), recv, n,
                                     mpi_type(t), c));
    });
  }

  void reduce_scatter(Stream& s, void* recv, const void* send, size_t count, CommType t,
                      ReduceOp op) override {
    int n = checked_count(count, "reduce_scatter");
    MPI_Comm c = comm_;
    collective(s, "reduce_scatter", count, t, [=] {
      STRATA_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(t, op), c));
    });
  }

  void all_reduce(Stream& s, void* buf, size_t count, CommType t, ReduceOp op) override {
    int n = checked_count(count, "all_reduce");
    MPI_Comm c = comm_;
    collective(s, "all_reduce", count, t, [=] {
      STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_type(t), mpi_op(t, op), c));
    });
  }

  void broadcast(Stream& s, void* buf, size_t count, CommType t, int root) override {
    int n = checked_count(count, "broadcast");
    STRATA_CHECK(root >= 0 && root < size_, "comm::broadcast", "root ", root, " of ", size_, " ranks");
    MPI_Comm c = comm_;
    collective(s, "broadcast", count, t, [=] { STRATA_MPI_CHECK(MPI_Bcast(buf, n, mpi_type(t), root, c)); });
  }

  void send(Stream& s, const void* buf, size_t count, CommType t, int peer, int tag) override {
    int n = checked_count(count, "send");
    STRATA_CHECK(peer >= 0 && peer < size_, "comm::send", "peer ", peer, " of ", size_, " ranks");
    MPI_Comm c = comm_;
    point_to_point(s, "send", count, t, peer, [=] {
      MPI_Request req;
      STRATA_MPI_CHECK(MPI_Isend(buf, n, mpi_type(t), peer, tag, c, &req));
      wait_sleeping(req);
    });
  }

  void recv(Stream& s, void* buf, size_t count, CommType t, int peer, int tag) override {
    int n = checked_count(count, "recv");
    STRATA_CHECK(peer >= 0 && peer < size_, "comm::recv", "peer ", peer, " of ", size_, " ranks");
    MPI_Comm c = comm_;
    point_to_point(s, "recv", count, t, peer, [=] {
      MPI_Request req;
      STRATA_MPI_CHECK(MPI_Irecv(buf, n, mpi_type(t), peer, tag, c, &req));
      wait_sleeping(req);
    });
  }

  void barrier(Stream& s) override {
    MPI_Comm c = comm_;
    collective(s, "barrier", 0, CommType::u8, [=] { STRATA_MPI_CHECK(MPI_Barrier(c)); });
  }

 private:
  static void check_host(Stream& s, const char* what) {
    if (s.device().kind() != DeviceKind::cpu)
      fail(str("comm::", what), "the MPI communicator moves host (CPU device) buffers only",
           "use the NCCL communicator with a CUDA device");
  }

  // A collective as a task on `s`: when it runs, this rank counts itself arrived and the call is
  // watched; the watchdog's report names the ranks that never arrived.
  template <class Call>
  void collective(Stream& s, const char* op, size_t count, CommType t, Call call) {
    check_host(s, op);
    s.host_task(op, [call, op, count, t, tracker = tracker_, name = name(), context = watchdog_context()] {
      const int64_t seq = tracker->enter();
      WatchedWait w(str(op, " of ", count, " ", type_name(t), " on '", name, "'"), WaitKind::collective,
                    context, [tracker, seq, name] { return tracker->arrivals(seq, name); });
      call();
    });
  }

  // Point-to-point transfers wait for their peer for as long as the schedule says (a pipeline
  // stage's receive is posted well ahead): polled with a sleep that grows to 100 µs, so a
  // waiting stream thread leaves the cores to compute instead of spinning in MPI_Wait.
  static void wait_sleeping(MPI_Request& req) {
    int done = 0;
    for (int us = 1;; us = std::min(us * 2, 100)) {
      STRATA_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
  }

  template <class Call>
  void point_to_point(Stream& s, const char* op, size_t count, CommType t, int peer, Call call) {
    check_host(s, op);
    const int world_peer = tracker_->world_ranks[size_t(peer)];
    s.host_task(op, [call, op, count, t, world_peer, name = name(), context = watchdog_context()] {
      WatchedWait w(str(op, " of ", count, " ", type_name(t), " with rank ", world_peer, " on '", name, "'"),
                    WaitKind::collective, context);
      call();
    });
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Tracker> tracker_;
};

}  // namespace

bool mpi_built() { return true; }

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void mpi_abort_if_running(int code) {
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, code);
}

std::unique_ptr<Communicator> make_mpi_world() {
  runtime();
  MPI_Comm dup;
  {
    WatchedWait w("MPI_Comm_dup of MPI_COMM_WORLD (every rank must make its world communicator)",
                  WaitKind::collective, watchdog_context());
    STRATA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  }
  return std::make_unique<MpiCommunicator>(dup, true);
}

}  // namespace strata
