// io/fault_backend.cpp — FaultBackend: matches rules against each operation on its way to the
// inner backend and shortens it, answers it with an error instead, or makes the backend itself
// fail around it (a throwing submit or reap, an unknown id, a stall).
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
  for (size_t i = 0; i < ops.size(); ++i) {
    const RawOp& op = ops[i];
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
      case Fault::submit_throws:
        if (!forward_.empty()) inner_->submit(forward_);
        fail("io::fault",
             str("injected submit failure at op ", i, " of ", ops.size(), " (", io_op_name(op.op),
                 " at offset ", op.offset, "); the ", i, " before it were accepted"));
      case Fault::reap_throws:  // counted in fired() when the reap throws
        --fired_;
        reap_traps_.insert(op.id);
        forward_.push_back(op);
        break;
      case Fault::unknown_id:
        relabel_.insert(op.id);
        forward_.push_back(op);
        break;
      case Fault::stall: {
        std::lock_guard<std::mutex> lock(stall_mu_);
        stalled_.push_back(op);
        break;
      }
    }
  }
  if (!forward_.empty()) inner_->submit(forward_);
}

void FaultBackend::release_stalled() {
  {
    std::lock_guard<std::mutex> lock(stall_mu_);
    released_.insert(released_.end(), stalled_.begin(), stalled_.end());
    stalled_.clear();
  }
  stall_cv_.notify_all();
}

size_t FaultBackend::stalled() const {
  std::lock_guard<std::mutex> lock(stall_mu_);
  return stalled_.size();
}

size_t FaultBackend::in_flight() const {
  std::lock_guard<std::mutex> lock(stall_mu_);
  return inner_->in_flight() + injected_.size() + kept_.size() + stalled_.size() + released_.size();
}

// Released stalls go to the inner backend now, on the thread that drives this backend.
void FaultBackend::forward_released() {
  std::vector<RawOp> go;
  {
    std::lock_guard<std::mutex> lock(stall_mu_);
    go.swap(released_);
  }
  if (!go.empty()) inner_->submit(go);
}

size_t FaultBackend::reap(std::span<RawResult> out, size_t min_results) {
  if (failing_reaps_ > 0) {
    --failing_reaps_;
    ++fired_;
    fail("io::fault", str("injected reap failure (", failing_reaps_, " more to come)"));
  }
  forward_released();
  size_t n = 0;
  while (n < out.size() && !kept_.empty()) {
    out[n++] = kept_.front();
    kept_.pop_front();
  }
  while (n < out.size() && !injected_.empty()) {
    out[n++] = injected_.front();
    injected_.pop_front();
  }
  const size_t first_inner = n;
  for (;;) {
    size_t need = min_results > n ? min_results - n : 0;
    size_t inner_held = inner_->in_flight();
    if (n < out.size() && inner_held > 0 && (need > 0 || min_results == 0))
      n += inner_->reap(out.subspan(n), std::min(need, inner_held));
    if (n >= min_results) break;
    // Short of what was asked: only stalled operations can still answer. Wait for them.
    std::unique_lock<std::mutex> lock(stall_mu_);
    if (stalled_.empty() && released_.empty()) break;
    stall_cv_.wait(lock, [&] { return !released_.empty(); });
    lock.unlock();
    forward_released();
  }
  bool trapped = false;
  for (size_t i = first_inner; i < n; ++i) {
    if (reap_traps_.erase(out[i].id)) trapped = true;
    if (relabel_.erase(out[i].id)) out[i].id |= kUnknownIdBit;
  }
  if (trapped) {
    ++fired_;
    kept_.insert(kept_.begin(), out.begin(), out.begin() + ptrdiff_t(n));
    fail("io::fault", str("injected reap failure (", n, " result(s) kept for the next reap)"));
  }
  return n;
}

std::unique_ptr<IoBackend> make_fault_backend(std::unique_ptr<IoBackend> inner,
                                              std::vector<FaultRule> rules) {
  return std::make_unique<FaultBackend>(std::move(inner), std::move(rules));
}

}  // namespace strata
