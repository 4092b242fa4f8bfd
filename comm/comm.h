// comm/comm.h — the communicator seam: collectives and point-to-point transfers of one group
// of ranks, each enqueued on a stream and asynchronous to the caller.
//
// Every rank of the group must enqueue the same collectives in the same order. Buffers are
// device memory (or host memory on the CPU device) and must stay alive until the stream has run
// the operation. Counts are in elements of `type`. Backends: Solo (one rank; collectives are
// copies), MPI (CPU buffers; a worker thread issues the MPI calls in stream order), NCCL (CUDA).
// Errors surface at the stream's synchronize(), as for any stream work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

class Stream;

enum class CommType : uint8_t { f32, bf16, f64, i32, u8 };
enum class ReduceOp : uint8_t { sum, max };

size_t comm_type_bytes(CommType t);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "solo", "mpi", "nccl"
  // The group's role ("world", "dp", "tp", ...), for messages and the watchdog's reports.
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // A new communicator over the ranks that pass the same color, ordered by key (MPI_Comm_split).
  // Collective over this communicator; called from the host, not on a stream.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // recv (size × count) = concatenation of every rank's send (count), in rank order.
  virtual void all_gather(Stream& s, void* recv, const void* send, size_t count, CommType t) = 0;
  // recv (count) = op over ranks of their send[rank × count, (rank+1) × count).
  virtual void reduce_scatter(Stream& s, void* recv, const void* send, size_t count, CommType t,
                              ReduceOp op) = 0;
  // buf (count) = op over ranks of buf, in place.
  virtual void all_reduce(Stream& s, void* buf, size_t count, CommType t, ReduceOp op) = 0;
  virtual void broadcast(Stream& s, void* buf, size_t count, CommType t, int root) = 0;
  virtual void send(Stream& s, const void* buf, size_t count, CommType t, int peer, int tag) = 0;
  virtual void recv(Stream& s, void* buf, size_t count, CommType t, int peer, int tag) = 0;
  virtual void barrier(Stream& s) = 0;

 private:
  std::string name_ = "world";
};

// The communicator of a single process (rank 0 of 1).
std::unique_ptr<Communicator> make_solo_communicator();

}  // namespace strata
