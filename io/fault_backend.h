// io/fault_backend.h — a backend that wraps another and makes chosen operations misbehave, so
// tests can hold FileIO's checks (requeue, resubmit the rest, drain, then throw) to account.
//
// A rule matches operations by kind and starting file offset; it fires `times` times after
// skipping `skip` matches. A short transfer really moves only the first `short_bytes` through the
// inner backend and reports that count; -EAGAIN, -EIO and -ENOSPC move nothing and are reported
// from reap() as if the device had answered. It injects nothing else (no delays, no corruption).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "io/backend.h"

namespace strata {

enum class Fault : uint8_t { short_transfer, again, io_error, no_space };

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
  FaultBackend(std::unique_ptr<IoBackend> inner, std::vector<FaultRule> rules);

  std::string_view name() const override { return name_; }
  int add_file(int fd) override { return inner_->add_file(fd); }
  void remove_file(int file) override { inner_->remove_file(file); }
  bool register_buffers(std::span<const iovec> regions) override {
    return inner_->register_buffers(regions);
  }
  void submit(std::span<const RawOp> ops) override;
  size_t reap(std::span<RawResult> out, size_t min_results) override;
  size_t in_flight() const override { return inner_->in_flight() + injected_.size(); }

  int fired() const { return fired_; }         // faults injected so far
  size_t inner_in_flight() const { return inner_->in_flight(); }
  void add_rule(const FaultRule& rule) { rules_.push_back({rule, 0}); }

 private:
  struct Armed {
    FaultRule rule;
    int seen = 0;  // matches so far
  };
  const FaultRule* match(const RawOp& op);

  std::unique_ptr<IoBackend> inner_;
  std::vector<Armed> rules_;
  std::deque<RawResult> injected_;  // results that never reached the inner backend
  std::vector<RawOp> forward_;
  std::string name_;
  int fired_ = 0;
};

std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner,
                                              std::vector<FaultRule> rules);

}  // namespace strata
