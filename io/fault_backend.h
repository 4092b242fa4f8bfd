// io/fault_backend.h — a backend that wraps another and makes chosen operations misbehave, so
// tests can hold FileIO's checks (requeue, resubmit the rest, drain, then throw) and its
// accounting of the backend's own failures to account.
//
// A rule matches operations by kind and starting file offset; it fires `times` times after
// skipping `skip` matches. Transfer faults: a short transfer really moves only the first
// `short_bytes` through the inner backend and reports that count; -EAGAIN, -EIO and -ENOSPC move
// nothing and are reported from reap() as if the device had answered. Backend faults (each keeps
// the accounting contract of io/backend.h, as a real backend failing that way would):
//   submit_throws  submit() accepts the ops before the matching one, then throws; the matching
//                  op and the rest of that call were never started.
//   reap_throws    the op runs; the reap() that would return its result throws instead and keeps
//                  every result it had collected for the next reap().
//   unknown_id     the op runs; its result comes back under an id FileIO never issued.
//   stall          the op is held, not started, until release_stalled() (from any thread).
// fail_next_reaps(n) makes the next n reap() calls throw before they touch anything, whatever
// is in flight (a backend that cannot be reaped for a while, or for good).
// It injects nothing else (no delays beyond a stall, no corruption).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "io/backend.h"

namespace strata {

enum class Fault : uint8_t {
  short_transfer, again, io_error, no_space,         // transfers
  submit_throws, reap_throws, unknown_id, stall,     // the backend itself
};

struct FaultRule {
  Fault fault = Fault::io_error;
  int op = -1;                   // -1: reads and writes; else int(IoOp)
  uint64_t offset = UINT64_MAX;  // only operations starting at this file offset; MAX: any offset
  int skip = 0;                  // matches to let through first
  int times = 1;                 // then fire this many times
  uint32_t short_bytes = 0;      // short_transfer: bytes to move (0: half, rounded down to 4096)
};

class FaultBackend final : public IoBackend {
 public:
  static constexpr uint64_t kUnknownIdBit = 1ull << 40;  // unknown_id: the id reported is id | bit

  FaultBackend(std::unique_ptr<IoBackend> inner, std::vector<FaultRule> rules);

  std::string_view name() const override { return name_; }
  int add_file(int fd) override { return inner_->add_file(fd); }
  void remove_file(int file) override { inner_->remove_file(file); }
  bool file_registered(int file) const override { return inner_->file_registered(file); }
  bool register_buffers(std::span<const iovec> regions) override {
    return inner_->register_buffers(regions);
  }
  void submit(std::span<const RawOp> ops) override;
  size_t reap(std::span<RawResult> out, size_t min_results) override;
  size_t in_flight() const override;

  int fired() const { return fired_; }  // faults injected so far
  size_t inner_in_flight() const { return inner_->in_flight(); }
  void add_rule(const FaultRule& rule) { rules_.push_back({rule, 0}); }
  void fail_next_reaps(int n) { failing_reaps_ = n; }
  // Lets every stalled operation go on to the inner backend (thread-safe; a reap() blocked
  // waiting for them wakes up).
  void release_stalled();
  size_t stalled() const;

 private:
  struct Armed {
    FaultRule rule;
    int seen = 0;  // matches so far
  };
  const FaultRule* match(const RawOp& op);
  void forward_released();

  std::unique_ptr<IoBackend> inner_;
  std::vector<Armed> rules_;
  std::deque<RawResult> injected_;  // results that never reached the inner backend
  std::deque<RawResult> kept_;      // results a thrown reap() kept for the next one
  std::unordered_set<uint64_t> relabel_, reap_traps_;  // ids with unknown_id / reap_throws
  std::vector<RawOp> forward_;
  std::string name_;
  int fired_ = 0;
  int failing_reaps_ = 0;

  // Stalled operations: the only state another thread touches.
  mutable std::mutex stall_mu_;
  std::condition_variable stall_cv_;
  std::vector<RawOp> stalled_, released_;
};

std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner,
                                              std::vector<FaultRule> rules);

}  // namespace strata
