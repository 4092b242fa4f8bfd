// io/fault_backend.cpp — FaultBackend: matches rules against each operation on its way to the
// inner backend and shortens it or answers it with an error instead.
#include "io/fault_backend.h"

#include <algorithm>
#include <cerrno>

#include "core/error.h"

namespace strata {

FaultBackend::FaultBackend(std::unique_ptr<IoBackend> inner, std::vector<FaultRule> rules)
    : inner_(std::move(inner)) {
  STRATA_CHECK(inner_ != nullptr, "io::fault", "no inner backend");
  for (const FaultRule& r : rules) rules_.push_back({r, 0});
  name_ = str("fault(", inner_->name(), ")");
}

const FaultRule* FaultBackend::match(const RawOp& op) {
  for (Armed& a : rules_) {
    const FaultRule& r = a.rule;
    if (r.op >= 0 && r.op != int(op.op)) continue;
    if (r.offset != UINT64_MAX && r.offset != op.offset) continue;
    int n = a.seen++;
    if (n >= r.skip && n < r.skip + r.times) return &r;
  }
  return nullptr;
}

void FaultBackend::submit(std::span<const RawOp> ops) {
  forward_.clear();
  for (const RawOp& op : ops) {
    const FaultRule* r = match(op);
    if (!r) {
      forward_.push_back(op);
      continue;
    }
    ++fired_;
    switch (r->fault) {
      case Fault::short_transfer: {
        uint32_t n = r->short_bytes ? r->short_bytes : std::max<uint32_t>(op.length / 2 / 4096 * 4096, 4096);
        RawOp shortened = op;
        shortened.length = std::min(n, op.length);
        forward_.push_back(shortened);
        break;
      }
      case Fault::again: injected_.push_back({op.id, -EAGAIN}); break;
      case Fault::io_error: injected_.push_back({op.id, -EIO}); break;
      case Fault::no_space: injected_.push_back({op.id, -ENOSPC}); break;
    }
  }
  if (!forward_.empty()) inner_->submit(forward_);
}

size_t FaultBackend::reap(std::span<RawResult> out, size_t min_results) {
  size_t n = 0;
  while (n < out.size() && !injected_.empty()) {
    out[n++] = injected_.front();
    injected_.pop_front();
  }
  size_t need = min_results > n ? min_results - n : 0;
  if (n < out.size() && (need > 0 || inner_->in_flight() > 0))
    n += inner_->reap(out.subspan(n), need);
  return n;
}

std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner,
                                              std::vector<FaultRule> rules) {
  return std::make_unique<FaultBackend>(std::move(inner), std::move(rules));
}

}  // namespace strata
