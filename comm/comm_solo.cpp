// comm/comm_solo.cpp — the one-rank communicator: gathers and reductions are copies on the
// stream (nothing at all when source and destination are the same memory).
#include <cstring>

#include "core/error.h"
#include "comm/comm.h"
#include "kernels/device.h"

namespace strata {

size_t comm_type_bytes(CommType t) {
  switch (t) {
    case CommType::f32: return 4;
    case CommType::bf16: return 2;
    case CommType::f64: return 8;
    case CommType::i32: return 4;
    case CommType::u8: return 1;
  }
  return 1;
}

namespace {

class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "solo"; }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SoloCommunicator>();
  }
  void all_gather(Stream& s, void* recv, const void* send, size_t count, CommType t) override {
    if (recv != send) s.copy(recv, send, count * comm_type_bytes(t));
  }
  void reduce_scatter(Stream& s, void* recv, const void* send, size_t count, CommType t,
                      ReduceOp) override {
    if (recv != send) s.copy(recv, send, count * comm_type_bytes(t));
  }
  void all_reduce(Stream&, void*, size_t, CommType, ReduceOp) override {}
  void broadcast(Stream&, void*, size_t, CommType, int root) override {
    STRATA_CHECK(root == 0, "comm::broadcast", "root ", root, " out of range for 1 rank");
  }
  void send(Stream&, const void*, size_t, CommType, int peer, int) override {
    fail("comm::send", str("a single-rank communicator has no peer ", peer));
  }
  void recv(Stream&, void*, size_t, CommType, int peer, int) override {
    fail("comm::recv", str("a single-rank communicator has no peer ", peer));
  }
  void barrier(Stream&) override {}
};

}  // namespace

std::unique_ptr<Communicator> make_solo_communicator() {
  return std::make_unique<SoloCommunicator>();
}

}  // namespace strata
