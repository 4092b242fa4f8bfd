// engine/zero_step.cpp — the optimizer step over the tiers: the global gradient norm (local sum
// of squares per shard, all-reduced over the data-parallel group and the tensor-parallel one),
// AdamW on every shard where its states live (the device's kernel for device states the host
// cannot address; else the CPU AdamW over chunks, NVMe states through a read k+1 / update k /
// write k−1 pipeline), the refreshed compute copy written to its tier in the same pass, and
// zeroing the gradients.
//
// It never changes a number with the placement: every path runs the same AdamW operations on
// the same values (optimizer/adamw.h). Clipping and the LR are the trainer's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"
#include "engine/test_hooks.h"
#include "engine/zero_state.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/ops.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"
#include "optimizer/adamw.h"

namespace strata {

namespace {

// A split step's second worker (run_job): it steps the units held in memory, traces on a track
// of its own and never reads ahead (the read-ahead state is the first worker's own).
thread_local bool t_memory_worker = false;

const char* optimizer_track() { return t_memory_worker ? "optimizer in memory" : "optimizer"; }

// Calls fn(lo, hi, is_norm) for the pieces of flat range [begin, end) that fall in one view
// each; padding past the last view goes with the last view.
template <class Fn>
void for_each_segment(const FlatLayout& L, size_t begin, size_t end, Fn fn) {
  const auto& views = L.views();
  for (size_t vi = 0; vi < views.size(); ++vi) {
    size_t lo = views[vi].offset;
    size_t hi = vi + 1 < views.size() ? views[vi + 1].offset : SIZE_MAX;
    lo = std::max(lo, begin);
    hi = std::min(hi, end);
    if (vi == 0) lo = begin;  // nothing precedes the first view
    if (lo < hi) fn(lo, hi, views[vi].is_norm);
  }
}

// Points t's moments at element o of m and v, in the states' dtype (f32, or bf16: the kernel
// widens them exactly, runs the f32 update and rounds the new moments to nearest even).
void set_moments(AdamWTensors& t, void* m, void* v, size_t o, bool bf16_states) {
  if (bf16_states) {
    t.m_bf16 = static_cast<uint16_t*>(m) + o;
    t.v_bf16 = static_cast<uint16_t*>(v) + o;
  } else {
    t.m = static_cast<float*>(m) + o;
    t.v = static_cast<float*>(v) + o;
  }
}

// Waits out `ticket` (0: none) on a way out: a failure of its own is dropped, so the error that
// unwinds the caller (or the first one reported) is the one that counts. The ticket is 0 after.
void wait_unwinding(Swapper* swapper, uint64_t& ticket) noexcept {
  if (!ticket) return;  // (no swapper without NVMe, and no ticket either)
  try {
    swapper->wait(std::exchange(ticket, 0));
  } catch (const std::exception&) {
  }
}

}  // namespace

void ZeroEngine::Impl::unit_norm_parts(int u, Stream& stream) {
  const Shard& g = units_[size_t(u)].grad;
  if (g.tier != Tier::nvme) unit_norm_parts(u, stream, g.ptr<float>());  // (NVMe: write_grad's)
}

void ZeroEngine::Impl::unit_norm_parts(int u, Stream& stream, const float* g) {
  const auto& ranges = norm_ranges_[size_t(u)];
  if (grads_tier_ == Tier::device || device_.host_addressable()) {
    double* parts = norm_parts_.as<double>() + norm_first_[size_t(u)];
    for (size_t k = 0; k < ranges.size(); ++k)
      device_.ops().sum_squares(stream, parts + k, g + ranges[k].first, ranges[k].second);
  } else {
    double* h = norm_host_.as<double>() + norm_first_[size_t(u)];
    auto sum = [h, g, &ranges] {
      for (size_t k = 0; k < ranges.size(); ++k)
        cpu::fast::sum_squares(h + k, g + ranges[k].first, ranges[k].second);
    };
    // A staging buffer on its way to NVMe is filled by the reduce stream: sum after it.
    if (units_[size_t(u)].grad.tier == Tier::nvme) stream.host_task("gradient norm parts", sum);
    else sum();
  }
}

double ZeroEngine::Impl::grad_norm() {
  if (job_ && job_->eager) {
    await_eager_updates();  // the worker summed each unit's squares before updating it
  } else {
    settle_step();  // a started step zeroes the gradients
  }
  watchdog_set_unit("");
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  const int U = model_.num_units();
  const size_t n = norm_first_[size_t(U - 1)] + norm_ranges_[size_t(U - 1)].size();  // partial sums
  if (!eager_step_)
    for (int u = 0; u < U; ++u) unit_norm_parts(u, compute_);
  double* h = norm_host_.as<double>();
  if (grads_tier_ == Tier::device || device_.host_addressable()) {
    compute_.copy(h, norm_parts_.data(), n * 8);
    compute_.synchronize();
  }
  double local = 0;
  for (size_t i = 0; i < n; ++i) local += h[i];
  h[0] = local;
  if (dp_.size() > 1) {
    dp_.all_reduce(comm_, h, 1, CommType::f64, ReduceOp::sum);
    comm_.synchronize();
  }
  if (tp_ && tp_->size() > 1) {
    tp_->all_reduce(comm_, h, 1, CommType::f64, ReduceOp::sum);
    comm_.synchronize();
  }
  if (pp_ && pp_->size() > 1) {  // every stage's units
    pp_->all_reduce(comm_, h, 1, CommType::f64, ReduceOp::sum);
    comm_.synchronize();
  }
  return std::sqrt(h[0]);
}

bool ZeroEngine::Impl::overlapped_step() const {
  return opt_.overlap_optimizer && place_.optimizer != Tier::device;
}

void ZeroEngine::Impl::prepare_step() {
  if (!overlapped_step() || (job_ && !job_->go)) return;  // serial, or prepared already
  finish_step();  // the previous step (its updates were all awaited by the passes since)
  start_job(false);
}

void ZeroEngine::Impl::await_eager_updates() {
  if (!job_ || !job_->eager) return;
  StepJob& j = *job_;
  // The units the worker has not claimed: their squares are summed here, all enqueued before
  // one synchronize (the work grad_norm does in the serial order, so not an update wait).
  std::vector<int> mine;
  {
    std::lock_guard<std::mutex> lock(j.mu);
    if (j.released) return;
    // The engine's own protocol: the backward reduced every unit. Checked before any is claimed,
    // so that a violation leaves no unit claimed and unsummed for the worker to wait on.
    for (int u = 0; u < model_.num_units(); ++u)
      if (!j.final[size_t(u)])
        protocol_violation(u, "grad_norm / optimizer_step of an unclipped step before the backward reduced this unit");
    for (int u = 0; u < model_.num_units(); ++u) {
      if (j.normed[size_t(u)] == 0) {
        j.normed[size_t(u)] = 1;
        mine.push_back(u);
      }
    }
  }
  for (int u : mine) {
    final_events_[size_t(u)]->synchronize();  // its accumulation has run
    unit_norm_parts(u, compute_);
  }
  compute_.synchronize();
  {
    std::lock_guard<std::mutex> lock(j.mu);
    for (int u : mine) j.normed[size_t(u)] = 2;
  }
  j.cv.notify_all();
  // The units the worker claimed: their sums take milliseconds (ensure_normed waits, bounded).
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t tr0 = trace_enabled() ? trace_now_us() : 0;
  for (int u = 0; u < model_.num_units(); ++u) ensure_normed(j, u, compute_);
  update_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (tr0) trace_span("update waits", "norm", tr0, trace_now_us() - tr0);
  {
    std::lock_guard<std::mutex> lock(j.mu);
    j.released = true;  // the next passes may run, each waiting for its unit's update
  }
  j.cv.notify_all();
}

void ZeroEngine::Impl::update_in_backward(const StepParams& p) {
  if (!overlapped_step()) return;  // serial: optimizer_step() does it all
  STRATA_CHECK(p.grad_scale == 1.0f, "zero::step",
               "update_in_backward with grad_scale ", p.grad_scale, ": only an unclipped step's "
               "updates can run before the norm is known");
  if (eager_step_)
    fail("zero::step", str("update_in_backward for step ", p.step, " while step ", eager_step_->step,
                           "'s updates were never finished by optimizer_step()"));
  finish_step();  // the previous step (overlapped into this step's passes)
  start_job(true, &p);
  eager_step_ = p;
}

void ZeroEngine::Impl::optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale,
                                      bool decay_norms) {
  check_quiescent("optimizer_step");
  // Every gradient of this step has been reduced; each shard is zeroed by its update (or by
  // zero_grads below) before the next step's first reduction into it.
  std::fill(grad_accumulated_.begin(), grad_accumulated_.end(), 0);
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();  // (gradients on NVMe: written)
  std::fill(grad_written_.begin(), grad_written_.end(), 0);  // the updates consume them
  StepParams p{hyper, step, grad_scale, decay_norms};
  if (eager_step_) {  // the backward applied it already (update_in_backward)
    await_eager_updates();
    const StepParams e = *std::exchange(eager_step_, std::nullopt);
    const AdamWHyper& a = e.hyper;
    if (e.step != step || grad_scale != 1.0f || e.decay_norms != decay_norms || a.lr != hyper.lr ||
        a.beta1 != hyper.beta1 || a.beta2 != hyper.beta2 || a.eps != hyper.eps ||
        a.weight_decay != hyper.weight_decay)
      fail("zero::step", str("optimizer_step(step ", step, ", lr ", hyper.lr, ", grad_scale ", grad_scale,
                             ") differs from the update_in_backward(step ", e.step, ", lr ", a.lr,
                             ") whose updates were already applied during the backward"));
    return;
  }
  if (overlapped_step()) {
    if (job_ && job_->go) finish_step();  // a previous step nobody waited for
    if (!job_) start_job(false);
    {
      std::lock_guard<std::mutex> lock(job_->mu);
      job_->params = p;
      job_->go = true;
    }
    job_->cv.notify_all();
    return;
  }
  for (int u = 0; u < model_.num_units(); ++u) update_unit(u, p, nullptr);
  compute_.synchronize();
  zero_grads();
  // Every NVMe write of the step was waited for by its chunk pipeline (step_unit_chunked), so the
  // next pass reads what was written. (No wait_all(): a checkpoint save may have reads of its
  // own in flight on the swapper, and their tickets are the writer's to wait for.)
}

void ZeroEngine::Impl::update_unit(int u, const StepParams& p, StepJob* gate) {
  const int64_t t0 = trace_enabled() ? trace_now_us() : 0;
  if (opt_.test_hooks && opt_.test_hooks->before_unit_update) opt_.test_hooks->before_unit_update(u);
  if (place_.optimizer == Tier::device && !device_.host_addressable()) {
    step_unit_on_device(u, p);  // enqueued on the compute stream: no span of its own
    return;
  }
  step_unit_chunked(u, p, gate);  // with a gate: reads p only after seeing go
  if (!t0 || place_.optimizer == Tier::device) return;
  int64_t from = t0;  // from go on: unit 0's reads ahead fall in the optimizer track's "wait"
  if (gate) {
    std::lock_guard<std::mutex> lock(gate->mu);
    from = std::max(from, gate->go_us);
  }
  trace_span(optimizer_track(), str("update ", model_.unit(u).name), from, trace_now_us() - from);
}

void ZeroEngine::Impl::start_job(bool eager, const StepParams* params) {
  job_ = std::make_unique<StepJob>();
  StepJob& j = *job_;
  j.updated.assign(size_t(model_.num_units()), 0);
  j.awaited.assign(size_t(model_.num_units()), 0);
  j.ahead.resize(size_t(model_.num_units()));
  j.started.assign(size_t(model_.num_units()), 0);
  j.ahead_free = ahead_pool_ ? ahead_pool_->count() : 0;
  j.in_memory.resize(size_t(model_.num_units()));
  for (int u = 0; u < model_.num_units(); ++u) j.in_memory[size_t(u)] = updates_in_memory(u);
  // Eager, the worker follows the backward unit by unit; clipped, every update waits for go,
  // and the units in memory (the first ones, offload.optimizer_host_bytes) would hold back the
  // disk's by the time they take.
  const auto n_in_memory = std::count(j.in_memory.begin(), j.in_memory.end(), char(1));
  j.split = !eager && n_in_memory > 0 && n_in_memory < model_.num_units();
  if (eager) {  // given before the worker exists: it reads them without the lock
    j.eager = j.go = true;
    j.params = *params;
    j.final.assign(size_t(model_.num_units()), 0);
    j.normed.assign(size_t(model_.num_units()), 0);
  }
  j.worker = std::thread([this, &j] { run_job(j); });
}

void ZeroEngine::Impl::mark_final(int u, Stream& accumulating) {
  if (!job_ || !job_->eager) return;
  accumulating.record(*final_events_[size_t(u)]);
  {
    std::lock_guard<std::mutex> lock(job_->mu);
    job_->final[size_t(u)] = 1;
  }
  job_->cv.notify_all();
}

int ZeroEngine::Impl::next_eager_unit(StepJob& j) {
  // final[u] is set when u's accumulation is enqueued, and the engine's thread enqueues ahead of
  // the streams: of the units whose accumulation has run, the lowest index; else the one the
  // streams reach first (the highest index: the backward runs down), final or about to be —
  // its first chunks are read while its gate (ensure_normed) waits.
  std::lock_guard<std::mutex> lock(j.mu);
  int ahead = -1;
  for (int u = 0; u < model_.num_units(); ++u) {
    if (j.updated[size_t(u)]) continue;
    if (j.final[size_t(u)] && final_events_[size_t(u)]->query()) return u;
    ahead = u;
  }
  return ahead;
}

void ZeroEngine::Impl::ensure_normed(StepJob& j, int u, Stream& stream) {
  {
    std::unique_lock<std::mutex> lock(j.mu);
    const auto limit = std::chrono::duration<double>(opt_.timeout_s);
    if (!j.final[size_t(u)]) {  // the worker only: the engine's thread sums final units
      const int64_t t0 = trace_enabled() ? trace_now_us() : 0;
      // Bounded: the engine's thread reduces every unit within one backward pass, itself under
      // the watchdog; past the timeout something upstream is stuck.
      if (!wait_reading_ahead(j, lock, opt_.timeout_s, [&] { return j.final[size_t(u)] || j.abort; }))
        fail("zero::step", str("the optimizer waited ", opt_.timeout_s, " s for unit ", model_.unit(u).name,
                               "'s gradient to become final (parallel.timeout)"));
      if (!j.final[size_t(u)])
        fail("zero::step", str("the unclipped step was abandoned before unit ", model_.unit(u).name,
                               "'s gradient became final; the units updated so far hold the new "
                               "values, the others the old"));
      if (t0) {
        j.go_us = trace_now_us();  // the unit's "update" span starts here
        trace_span("optimizer", "wait", t0, j.go_us - t0);  // for the backward: blocked
      }
    }
    char& n = j.normed[size_t(u)];
    if (n == 1) {  // the other thread is summing it: a few milliseconds
      if (!j.cv.wait_for(lock, limit, [&] { return n == 2 || j.finished || j.abort; }))
        fail("zero::step", str("waited ", opt_.timeout_s, " s for the gradient norm of unit ",
                               model_.unit(u).name, " (parallel.timeout)"));
      if (n != 2) {  // the worker ended while summing it (its error), or the step was abandoned
        if (j.error) std::rethrow_exception(j.error);
        fail("zero::step", str(j.abort ? "the unclipped step was abandoned" : "the optimizer's worker ended",
                               " while the gradient norm of unit ", model_.unit(u).name, " was being summed"));
      }
    }
    if (n == 2) return;
    n = 1;
  }
  final_events_[size_t(u)]->synchronize();  // its accumulation has run
  unit_norm_parts(u, stream);
  stream.synchronize();
  {
    std::lock_guard<std::mutex> lock(j.mu);
    j.normed[size_t(u)] = 2;
  }
  j.cv.notify_all();
}

bool ZeroEngine::Impl::updates_in_memory(int u) const {
  const Unit& s = units_[size_t(u)];
  if (place_.optimizer == Tier::device && !device_.host_addressable()) return false;
  if (s.master.tier == Tier::nvme || s.grad.tier == Tier::nvme) return false;
  return param_is_master() || (s.param.tier != Tier::nvme && !param_stage_);
}

// The worker: every unit in forward order (an eager step: the lowest-index final unit next,
// next_eager_unit), its gradient zeroed once its compute copy holds the new values. A split
// step: the units in memory on a second thread, the others here — each in forward order, so the
// first unit on NVMe has its first chunks read before go and its update begins at go.
void ZeroEngine::Impl::run_job(StepJob& j) {
  std::thread memory_worker;
  try {
    if (j.split)
      memory_worker = std::thread([this, &j] {
        t_memory_worker = true;
        run_units(j, true);
      });
  } catch (...) {  // no thread: this one steps every unit
    j.split = false;
  }
  run_units(j, false);
  if (memory_worker.joinable()) memory_worker.join();  // its waits are bounded, as this one's
  drain_ahead(j);  // an abandoned or failed step's reads ahead
  {
    std::lock_guard<std::mutex> lock(j.mu);
    j.finished = true;
  }
  j.cv.notify_all();
}

void ZeroEngine::Impl::run_units(StepJob& j, bool in_memory) {
  try {
    const int U = model_.num_units();
    for (int i = 0; i < U; ++i) {
      if (j.split && bool(j.in_memory[size_t(i)]) != in_memory) continue;
      read_ahead(j);
      const int u = j.eager ? next_eager_unit(j) : i;
      if (u < 0) break;
      j.started[size_t(u)] = 1;  // its chunks not read ahead by now go through its pipeline
      update_unit(u, j.params, &j);  // (forward order: its first chunks are read before go)
      publish_update(j, u);  // when step_unit_chunked has not (it does before the last writes)
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(j.mu);
    if (!j.error) j.error = std::current_exception();
  }
}

bool ZeroEngine::Impl::read_ahead(StepJob& j) {
  if (!ahead_pool_ || t_memory_worker) return false;
  const int U = model_.num_units();
  const int per = place_.read_ahead_buffers_per_chunk();
  const bool bf16_states = place_.state == DType::bf16;
  const size_t chunk = ahead_pool_->buffer_bytes() / 4;  // elements: step_unit_chunked's chunks
  const size_t ssz = place_.state_elem_bytes();
  const size_t state_bytes[3] = {4, ssz, ssz};
  reap_behind(j);
  int in_flight = 0;
  for (auto& chunks : j.ahead)
    for (AheadChunk& a : chunks) in_flight += a.read && !swapper_->done(a.read);
  for (;;) {
    auto left = [&](int u) {
      const size_t n = model_.unit(u).layout.shard_numel();
      return units_[size_t(u)].master.tier == Tier::nvme && !j.started[size_t(u)] &&
             j.ahead[size_t(u)].size() < div_ceil(n, chunk);
    };
    while (j.ahead_unit < U && !left(j.ahead_unit)) ++j.ahead_unit;
    if (j.ahead_unit >= U || j.ahead_free < per) return false;
    if (in_flight >= kAheadInFlight) return true;
    const int u = j.ahead_unit;
    Unit& s = units_[size_t(u)];
    const size_t n = model_.unit(u).layout.shard_numel();
    const size_t lo = j.ahead[size_t(u)].size() * chunk, cnt = std::min(chunk, n - lo);
    AheadChunk& a = j.ahead[size_t(u)].emplace_back();  // held by the job before anything can throw
    for (int i = 0; i < per; ++i) {
      a.buf[i] = ahead_pool_->acquire();
      --j.ahead_free;
    }
    Shard* states[3] = {&s.master, &s.m, &s.v};
    std::vector<IoRequest> reqs;
    for (int i = 0; i < 3; ++i)
      reqs.push_back(swap_->request(IoOp::read, states[i]->key, staged_state(a.buf, i, bf16_states, chunk * ssz),
                                    cnt * state_bytes[i], lo * state_bytes[i]));
    a.read = swapper_->submit(std::move(reqs));
    const uint64_t bytes = cnt * (state_bytes[0] + state_bytes[1] + state_bytes[2]);
    read_ahead_bytes_ += bytes;
    ++in_flight;
    if (opt_.test_hooks && opt_.test_hooks->after_read_ahead) opt_.test_hooks->after_read_ahead(u, bytes);
  }
}

template <class Pred>
bool ZeroEngine::Impl::wait_reading_ahead(StepJob& j, std::unique_lock<std::mutex>& lock, double limit_s,
                                          Pred pred) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  for (;;) {
    if (pred()) return true;
    lock.unlock();  // the engine's thread may mark units final meanwhile
    const bool more = read_ahead(j);
    lock.lock();
    const auto now = Clock::now();
    if (pred()) return true;
    if (now >= deadline) return false;
    const Clock::duration slice = more ? std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(2))
                                       : deadline - now;
    if (j.cv.wait_for(lock, slice, pred)) return true;
  }
}

void ZeroEngine::Impl::release_ahead(StepJob& j, AheadChunk& a) {
  for (uint64_t* t : {&a.read, &a.write})
    if (*t) swapper_->wait(std::exchange(*t, 0));
  for (auto& b : a.buf)
    if (b) {
      ahead_pool_->release(std::exchange(b, {}));
      ++j.ahead_free;
    }
}

void ZeroEngine::Impl::reap_behind(StepJob& j) {
  size_t kept = 0;
  for (AheadChunk& a : j.behind) {
    if (a.write && !swapper_->done(a.write)) {
      if (&j.behind[kept] != &a) j.behind[kept] = std::move(a);
      ++kept;
      continue;
    }
    release_ahead(j, a);  // its write has ended: the wait returns at once (and reports its error)
  }
  j.behind.resize(kept);
}

void ZeroEngine::Impl::drain_ahead(StepJob& j) noexcept {
  auto drain = [&](std::vector<AheadChunk>& chunks) {
    for (AheadChunk& a : chunks) {
      // The worker's first error is the one reported.
      for (uint64_t* t : {&a.read, &a.write}) wait_unwinding(swapper_.get(), *t);
      try {
        release_ahead(j, a);
      } catch (const std::exception& e) {
        log_error("zero::step", "returning an optimizer read-ahead buffer: ", e.what());
      }
    }
    chunks.clear();
  };
  for (auto& chunks : j.ahead) drain(chunks);
  drain(j.behind);  // write-backs still trailing
}

void ZeroEngine::Impl::await_go(StepJob& j, int u) {
  if (j.eager) {  // the gate of each unit: its squares are in the norm (it is final already)
    ensure_normed(j, u, *norm_stream_);
    return;
  }
  std::unique_lock<std::mutex> lock(j.mu);
  if (j.go) return;
  const int64_t t0 = trace_enabled() ? trace_now_us() : 0;
  // Bounded: the engine's thread gives go (or abandons the job) within one backward pass and
  // the norm, both under the watchdog; past the timeout something upstream is stuck.
  if (!wait_reading_ahead(j, lock, opt_.timeout_s, [&] { return j.go || j.abort; }))
    fail("zero::step", str("the optimizer step's reads waited ", opt_.timeout_s,
                           " s for the gradients to become final (parallel.timeout)"));
  if (j.abort) fail("zero::step", "the prepared optimizer step was abandoned before its update");
  if (t0) {
    j.go_us = trace_now_us();
    trace_span(optimizer_track(), "wait", t0, j.go_us - t0);  // for the norm (go): blocked
  }
}

void ZeroEngine::Impl::await_update(int u) {
  if (!job_) return;
  StepJob& j = *job_;
  std::unique_lock<std::mutex> lock(j.mu);
  // Prepared only: nothing changes before go. Eager, not released: the backward in flight reads
  // a unit only before its gradient is final.
  if (!j.go || (j.eager && !j.released)) return;
  j.awaited[size_t(u)] = 1;  // the engine's thread alone writes it, in program order
  if (j.updated[size_t(u)]) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t tr0 = trace_enabled() ? trace_now_us() : 0;
  {
    WatchedWait w(str("the optimizer's update of unit ", model_.unit(u).name), WaitKind::host,
                  watchdog_context());
    const auto limit = std::chrono::duration<double>(opt_.timeout_s);
    if (!j.cv.wait_for(lock, limit, [&] { return j.updated[size_t(u)] || j.finished; }))
      fail("zero::step", str("waited ", opt_.timeout_s, " s for the optimizer's update of unit ",
                             model_.unit(u).name, " (parallel.timeout)"));
  }
  update_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (tr0) trace_span("update waits", "wait", tr0, trace_now_us() - tr0);
  if (!j.updated[size_t(u)]) {  // the worker stopped early: its error
    lock.unlock();
    finish_step();
    protocol_violation(u, "the optimizer step ended without updating this unit");
  }
}

bool ZeroEngine::Impl::update_pending(int u) {
  if (!job_) return false;
  StepJob& j = *job_;
  std::lock_guard<std::mutex> lock(j.mu);
  // As await_update; a worker that stopped without updating u is not pending: its error is
  // reported by the await_update that follows.
  return j.go && !(j.eager && !j.released) && !j.updated[size_t(u)] && !j.finished;
}

bool ZeroEngine::Impl::update_outstanding(int u) {
  if (!job_) return false;
  StepJob& j = *job_;
  // go, released and awaited are set by this thread (optimizer_step, grad_norm, await_update).
  std::lock_guard<std::mutex> lock(j.mu);
  return j.go && !(j.eager && !j.released) && !j.awaited[size_t(u)];
}

void ZeroEngine::Impl::finish_step() {
  if (!job_) return;
  std::unique_ptr<StepJob> j = std::move(job_);
  bool started;
  {
    std::lock_guard<std::mutex> lock(j->mu);
    started = j->go;
    // A prepared step that never started is abandoned; an eager one stops at the first unit
    // whose gradient is not final (none, after its backward).
    if (!started || j->eager) j->abort = true;
  }
  j->cv.notify_all();
  {
    // The worker's every wait is bounded (the swapper's, the pool's, await_go, next_eager_unit),
    // but a failed step's worker drains its I/O ticket by ticket, each with a fresh
    // parallel.timeout: watched, the join ends the run after one.
    WatchedWait w("the optimizer step's worker finishing its updates", WaitKind::host,
                  watchdog_context());
    j->worker.join();
  }
  if (started && j->error) std::rethrow_exception(j->error);
}

void ZeroEngine::Impl::settle_step() {
  if (job_ && job_->go) finish_step();
}

// Device-resident states on a device the host cannot address: the device's AdamW kernel.
void ZeroEngine::Impl::step_unit_on_device(int u, const StepParams& p) {
  Unit& s = units_[size_t(u)];
  const FlatLayout& L = model_.unit(u).layout;
  const size_t n = L.shard_numel(), base = size_t(dp_.rank()) * n;
  const bool bf16 = place_.compute == DType::bf16;
  const bool bf16_states = place_.state == DType::bf16;
  for_each_segment(L, base, base + n, [&](size_t lo, size_t hi, bool is_norm) {
    AdamWHyper h = p.hyper;
    if (is_norm && !p.decay_norms) h.weight_decay = 0.0f;
    size_t o = lo - base;
    AdamWTensors t;
    t.param = s.master.ptr<float>() + o;
    t.grad = s.grad.ptr<float>() + o;
    set_moments(t, s.m.mem.data(), s.v.mem.data(), o, bf16_states);
    t.param_bf16 = bf16 ? s.param.ptr<uint16_t>() + o : nullptr;
    t.n = hi - lo;
    adamw_update_on_stream(compute_, h, p.step, p.grad_scale, t, adam_isa_);
  });
}

// States the host can address (any tier on the CPU device; host or NVMe otherwise): the CPU
// AdamW over chunks of offload.optimizer_chunk bytes. NVMe-resident arrays stream through three
// staging sets — chunk k+1 is read while k is updated and k−1 is written. A chunk is `chunk`
// elements: master in buf[0] (f32), m and v in buf[1] and buf[2] (f32), or both in buf[1] (bf16:
// m in its first half, v in its second, each half a multiple of 4 KiB), the refreshed compute
// copy in buf[3].
void ZeroEngine::Impl::step_unit_chunked(int u, const StepParams& p, StepJob* gate) {
  Unit& s = units_[size_t(u)];
  const FlatLayout& L = model_.unit(u).layout;
  const size_t n = L.shard_numel(), base = size_t(dp_.rank()) * n;
  const bool bf16 = place_.compute == DType::bf16;
  const size_t esz = param_elem_bytes();
  const bool bf16_states = place_.state == DType::bf16;
  const size_t ssz = place_.state_elem_bytes();
  const size_t state_bytes[3] = {4, ssz, ssz};  // per element of master, m, v
  const bool separate_param = !param_is_master();
  const size_t chunk = chunk_pool_ ? chunk_pool_->buffer_bytes() / 4 : n;  // elements
  const size_t nchunks = div_ceil(n, chunk);
  Shard* states[3] = {&s.master, &s.m, &s.v};
  const bool opt_nvme = s.master.tier == Tier::nvme;  // (offload.optimizer_host_bytes: per unit)
  const bool param_nvme = separate_param && s.param.tier == Tier::nvme;
  // The gathers round the master (Placement::param_rounds_master): its write is what the next
  // pass waits for, so it goes first, in a job of its own, and the unit is published once it
  // is written; m and v may trail. The bf16 copy is made only into a kept buffer.
  const bool rounds = place_.param_rounds_master() && opt_nvme;
  // A gradient on NVMe is read chunk by chunk beside the states, once it is written: a step's
  // worker reads states ahead of go (and of an unclipped step's unit becoming final), the
  // gradient only after (a serial step starts after the backward's writes; a clipped one's go
  // follows them; an unclipped one's unit is final once its write has run).
  const bool grad_nvme = s.grad.tier == Tier::nvme;
  bool grad_written = !gate;
  auto gradient_written = [&] {
    if (!grad_written) {
      std::lock_guard<std::mutex> lock(gate->mu);
      grad_written = gate->go && (!gate->eager || (gate->final[size_t(u)] &&
                                                   final_events_[size_t(u)]->query()));
    }
    return grad_written;
  };
  // Its first chunks read ahead by the worker (read_ahead): updated and written back from there.
  std::vector<AheadChunk>* ahead = gate ? &gate->ahead[size_t(u)] : nullptr;
  const size_t n_ahead = ahead ? ahead->size() : 0;

  // The unit's refreshed compute copy, kept whole for the next forward (ForwardCopies) when a
  // buffer is free as its first chunk is updated: each chunk's copy is written to NVMe from
  // there. Declared before `drain`, which waits for those writes, so it goes back after them
  // when the update does not finish.
  struct Kept {
    ForwardCopies& f;
    PinnedPool::Lease lease;
    ~Kept() {
      try {
        f.release(std::exchange(lease, {}), nullptr);
      } catch (const std::exception&) {
      }
    }
  } kept{forward_, {}};
  ChunkSet sets[3];
  // The master writes of chunks read ahead (rounds): waited for before the unit is published,
  // and on any way out before their buffers can go back (declared after `kept`, before `drain`
  // and the job's own release of the read-ahead buffers).
  struct Tickets {
    Impl& e;
    std::vector<uint64_t> t;
    void wait() {
      for (uint64_t& x : t)
        if (x) e.swapper_->wait(std::exchange(x, 0));
      t.clear();
    }
    ~Tickets() {
      for (uint64_t& x : t) wait_unwinding(e.swapper_.get(), x);
    }
  } ahead_master_writes{*this, {}};
  // However this returns, no NVMe read or write may still target a chunk buffer once the buffer
  // goes back to the pool (an Error mid-pipeline waits out the rest, keeping the first error).
  struct Drain {
    Impl& e;
    ChunkSet* sets;
    ~Drain() {
      for (int i = 0; i < 3; ++i) {
        for (uint64_t* t :
             {&sets[i].read, &sets[i].param_write, &sets[i].write, &sets[i].grad_read})
          wait_unwinding(e.swapper_.get(), *t);
        if (e.chunk_pool_)
          for (auto& b : sets[i].buf)
            if (b) e.chunk_pool_->release(std::exchange(b, {}));
      }
    }
  } drain{*this, sets};
  auto acquire_set = [&](ChunkSet& set) {
    for (uint64_t* t : {&set.param_write, &set.write})
      if (*t) swapper_->wait(std::exchange(*t, 0));
    for (int i = 0; i < 5; ++i)
      if (!set.buf[i] && !(bf16_states && i == 2) && (i < 4 || grad_nvme))
        set.buf[i] = chunk_pool_->acquire();
  };
  auto issue_grad = [&](size_t k, ChunkSet& set) {
    if (!grad_nvme || set.grad_chunk == k || !gradient_written()) return;
    acquire_set(set);
    const size_t lo = k * chunk, cnt = std::min(chunk, n - lo);
    set.grad_chunk = k;
    set.grad_read = swapper_->submit(
        {swap_->request(IoOp::read, s.grad.key, set.buf[4].data, cnt * 4, lo * 4)});
  };
  // Where state i of a chunk is staged (NVMe): its own buffer, or v in the second half of m's.
  auto staged = [&](ChunkSet& set, int i) { return staged_state(set.buf, i, bf16_states, chunk * ssz); };
  auto issue_read = [&](size_t k, ChunkSet& set) {
    issue_grad(k, set);
    if (!opt_nvme || k < n_ahead) return;
    acquire_set(set);
    const size_t lo = k * chunk, cnt = std::min(chunk, n - lo);
    std::vector<IoRequest> reqs;
    for (int i = 0; i < 3; ++i)
      reqs.push_back(swap_->request(IoOp::read, states[i]->key, staged(set, i), cnt * state_bytes[i],
                                    lo * state_bytes[i]));
    set.read = swapper_->submit(std::move(reqs));
  };

  if (nchunks > 0) issue_read(0, sets[0]);
  for (size_t k = 0; k < nchunks; ++k) {
    ChunkSet& set = sets[k % 3];
    AheadChunk* pre = k < n_ahead ? &(*ahead)[k] : nullptr;
    const bool trails = pre && separate_param;  // its write-back trails the unit (write-behind)
    if (k + 1 < nchunks) issue_read(k + 1, sets[(k + 1) % 3]);
    if (pre) {
      if (param_nvme) acquire_set(set);  // for the compute copy's buffer
      swapper_->wait(std::exchange(pre->read, 0));
    } else if (opt_nvme) {
      swapper_->wait(set.read);
      set.read = 0;
    } else if (param_nvme) {
      acquire_set(set);
    }
    if (gate) await_go(*gate, u);  // reads may run ahead; updates wait for the norm (or u final)
    if (grad_nvme) {  // written now: this chunk's gradient, and the next one's behind it
      grad_written = true;
      issue_grad(k, set);
      if (k + 1 < nchunks) issue_grad(k + 1, sets[(k + 1) % 3]);
      swapper_->wait(std::exchange(set.grad_read, 0));
    }
    if (k == 0 && (param_nvme || rounds) && forward_.pool && forwarded_next(u, gate))
      kept.lease = forward_.try_acquire();
    const size_t lo = k * chunk, cnt = std::min(chunk, n - lo);
    char* ptr[3];  // element lo of master, m, v (staged or in memory)
    for (int i = 0; i < 3; ++i)
      ptr[i] = pre        ? staged_state(pre->buf, i, bf16_states, chunk * ssz)
               : opt_nvme ? staged(set, i)
                          : states[i]->ptr<char>() + lo * state_bytes[i];
    float* master = reinterpret_cast<float*>(ptr[0]);
    void* param_out = nullptr;  // where the refreshed compute copy of this chunk goes
    const bool param_staged = separate_param && !param_nvme && param_stage_;  // device, unaddressable
    if (separate_param)
      param_out = param_nvme     ? (kept.lease ? static_cast<char*>(kept.lease.data) + lo * esz
                                               : set.buf[3].data)
                  : param_staged ? param_stage_.data()
                                 : static_cast<void*>(s.param.ptr<char>() + lo * esz);
    else if (rounds && kept.lease)
      param_out = static_cast<char*>(kept.lease.data) + lo * esz;
    const float* g =
        grad_nvme ? static_cast<const float*>(set.buf[4].data) : s.grad.ptr<float>() + lo;
    for_each_segment(L, base + lo, base + lo + cnt, [&](size_t a, size_t b, bool is_norm) {
      AdamWHyper h = p.hyper;
      if (is_norm && !p.decay_norms) h.weight_decay = 0.0f;
      const size_t o = a - base - lo;
      AdamWTensors t;
      t.param = master + o;
      t.grad = g + o;
      set_moments(t, ptr[1], ptr[2], o, bf16_states);
      t.param_bf16 = (bf16 && param_out) ? static_cast<uint16_t*>(param_out) + o : nullptr;
      t.n = b - a;
      if (adam_isa_) adamw_update_isa(*adam_isa_, h, p.step, p.grad_scale, t);
      else adamw_update(h, p.step, p.grad_scale, t);
    });
    if (separate_param && !bf16) std::memcpy(param_out, master, cnt * 4);
    if (param_staged) {  // on a stream of its own: the compute stream may be running a pass
      step_stream_->copy(s.param.ptr<char>() + lo * esz, param_stage_.data(), cnt * esz);
      step_stream_->synchronize();  // the staging buffer is refilled by the next chunk
      step_h2d_bytes_ += cnt * esz;
    }
    // The compute copy first, in a job of its own: the next pass waits for it, not for the states.
    if (param_nvme)
      set.param_write = swapper_->submit({swap_->request(IoOp::write, s.param.key, param_out, cnt * esz, lo * esz)},
                                         IoLane::urgent);
    if (rounds) {
      IoRequest w = swap_->request(IoOp::write, s.master.key, ptr[0], cnt * 4, lo * 4);
      if (pre) {
        ahead_master_writes.t.push_back(swapper_->submit({w}, IoLane::urgent));
      } else {
        if (set.param_write) swapper_->wait(std::exchange(set.param_write, 0));
        set.param_write = swapper_->submit({w}, IoLane::urgent);
      }
    }
    if (opt_nvme) {
      std::vector<IoRequest> reqs;
      for (int i = rounds ? 1 : 0; i < 3; ++i)
        reqs.push_back(swap_->request(IoOp::write, states[i]->key, ptr[i], cnt * state_bytes[i],
                                      lo * state_bytes[i]));
      // A read-ahead chunk's write-back trails (below) in the bulk lane: state reads go first,
      // nothing waits for it but the buffer. The pipeline's own writes stay normal (its next
      // chunk but one reuses their buffers), and so does every write when the master is the
      // compute copy (the unit is published only once its states are written). A master the
      // gathers round went above, on its own: m and v trail as a separate copy's states do.
      const IoLane lane = trails || (pre && rounds) ? IoLane::bulk : IoLane::normal;
      (pre ? pre->write : set.write) = swapper_->submit(std::move(reqs), lane);
    }
    if (trails) {
      // Write-behind: the unit is published without waiting for its states' writes, so the
      // chunk's buffers go back to the pool as its write ends, whatever unit the worker is on —
      // and as they do, later units' states are read into them.
      gate->behind.push_back(std::exchange(*pre, {}));
    }
    if (gate) read_ahead(*gate);
  }
  // (The f32 master that is the compute copy: the unit is published once its states are written.
  // A master the gathers round: once its own writes are.)
  const bool master_in_write = !separate_param && !rounds;
  for (auto& set : sets) {
    if (set.param_write) swapper_->wait(std::exchange(set.param_write, 0));
    if (master_in_write && set.write) swapper_->wait(std::exchange(set.write, 0));
  }
  ahead_master_writes.wait();
  if (kept.lease) forward_.put(u, std::exchange(kept.lease, {}));  // written: no I/O on it
  if (master_in_write)
    for (size_t k = 0; k < n_ahead; ++k)
      if ((*ahead)[k].write) swapper_->wait(std::exchange((*ahead)[k].write, 0));
  // The compute copy holds the new values: a step's worker publishes the unit now, while the
  // states' last writes drain (every reader of the states waits for the whole step).
  if (gate) publish_update(*gate, u);
  // A master the gathers round is written: its chunks read ahead trail with m and v alone.
  if (rounds)
    for (size_t k = 0; k < n_ahead; ++k)
      if ((*ahead)[k].write) gate->behind.push_back(std::exchange((*ahead)[k], {}));
  for (auto& set : sets)
    if (set.write) swapper_->wait(std::exchange(set.write, 0));
  if (ahead) {  // written back: the buffers may read ahead for later units
    for (AheadChunk& a : *ahead) release_ahead(*gate, a);
    ahead->clear();
  }
  // `drain` returns the pipeline's buffers.
}

// Whether unit u's compute copy is worth keeping for the next forward: u is the lowest-index
// unit still to be updated that could take a buffer (units in memory never do: a split step's
// second worker may still be stepping them), the one of those the forward needs next — so the
// few buffers (freed as the forward gathers them) go to units in the order it consumes them, not
// to the units an unclipped step updates during the backward, which the forward needs last. A
// serial step updates in forward order: always.
bool ZeroEngine::Impl::forwarded_next(int u, StepJob* gate) {
  if (!gate) return true;
  std::lock_guard<std::mutex> lock(gate->mu);
  for (int v = 0; v < u; ++v)
    if (!gate->updated[size_t(v)] && !gate->in_memory[size_t(v)]) return false;
  return true;
}

void ZeroEngine::Impl::publish_update(StepJob& j, int u) {
  {
    std::lock_guard<std::mutex> lock(j.mu);
    if (j.updated[size_t(u)]) return;  // step_unit_chunked published it already
  }
  if (j.eager) await_go(j, u);   // a unit without chunks never met its gate
  Shard& g = units_[size_t(u)].grad;
  // Host memory: the optimizer is off the device. (On NVMe the next backward's staging buffer
  // is zeroed instead.)
  if (g.tier != Tier::nvme) cpu::fast::fill_zero(g.mem.data(), g.bytes);
  {
    std::lock_guard<std::mutex> lock(j.mu);
    j.updated[size_t(u)] = 1;
  }
  j.cv.notify_all();
}

void ZeroEngine::Impl::zero_grads() {
  finish_step();
  for (int u = 0; u < model_.num_units(); ++u) {
    Shard& g = units_[size_t(u)].grad;
    if (g.tier == Tier::device) compute_.fill_zero(g.mem.data(), g.bytes);
    else if (g.tier == Tier::host) cpu::fast::fill_zero(g.mem.data(), g.bytes);
  }
  std::fill(grad_accumulated_.begin(), grad_accumulated_.end(), 0);
  std::fill(grad_written_.begin(), grad_written_.end(), 0);
}

// ---- engine/zero.h: the public calls of this file, forwarded to Impl ----------------------------

double ZeroEngine::grad_norm() { return impl_->grad_norm(); }
void ZeroEngine::optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale,
                                bool decay_norms) {
  impl_->optimizer_step(hyper, step, grad_scale, decay_norms);
}
void ZeroEngine::prepare_step() { impl_->prepare_step(); }
void ZeroEngine::update_in_backward(const AdamWHyper& hyper, int64_t step, bool decay_norms) {
  impl_->update_in_backward(Impl::StepParams{hyper, step, 1.0f, decay_norms});
}
void ZeroEngine::finish_step() { impl_->finish_step(); }
void ZeroEngine::zero_grads() { impl_->zero_grads(); }

}  // namespace strata
