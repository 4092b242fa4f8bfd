// engine/zero_schedule.cpp — the ZeRO-3 schedule: the gather protocol (idle → fetching →
// gathered → held → idle; docs/architecture.md, "The gather protocol") over the parameter
// slots, the NVMe read-ahead of compute copies along the pass order, and gradient slots that
// are reduce-scattered into this rank's shard. Streams are ordered by events only; a call that
// breaks the protocol is an Error naming the unit and its state, never a wait.
//
// It allocates nothing (engine/zero.cpp sized the slots and pools) and touches no optimizer
// state; a pass reading a unit's compute copy waits for an overlapped optimizer step to have
// updated that unit (await_update, engine/zero_step.cpp).
#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "engine/test_hooks.h"
#include "engine/zero_state.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/ops.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"

namespace strata {

ZeroEngine::Impl::Slot& ZeroEngine::Impl::take_slot(std::vector<Slot>& pool, int limit, int u,
                                                    const char* what) {
  const unsigned kind = 1u << static_cast<unsigned>(model_.unit(u).kind);
  const size_t need = model_.unit(u).layout.padded_numel();
  int owned = 0;
  for (const auto& sl : pool) owned += sl.owner >= 0;
  if (owned < limit)
    for (auto& sl : pool) {
      if (sl.owner < 0 && (sl.kinds & kind)) {
        STRATA_CHECK(sl.numel >= need, "zero::schedule", "a ", what, " slot of ", sl.numel,
                     " elements for unit ", model_.unit(u).name, " of ", need);
        sl.owner = u;
        return sl;
      }
    }
  std::string owners;
  for (size_t i = 0; i < pool.size(); ++i)
    owners += str(i ? ", " : "", "slot ", i, ": ",
                  pool[i].owner < 0 ? std::string("free (another kind)") : model_.unit(pool[i].owner).name);
  protocol_violation(u, str("no free ", what, " slot for its kind (", owned, " of at most ", limit,
                            " owned; ", owners, ")"));
}

void ZeroEngine::Impl::protocol_violation(int u, const std::string& what) const {
  const Unit& s = units_[size_t(u)];
  fail("zero::schedule",
       str("unit ", u, " (", model_.unit(u).name, "): ", what, " [state ",
           gather_state_name(s.gather), ", parameter slot ", s.slot, ", gradient slot ",
           s.grad_slot, ", ticket ", s.fetch_ticket, "]"),
       "this is a scheduling bug in strata (the gather protocol of docs/architecture.md was "
       "broken); please report it with the configuration");
}

int ZeroEngine::Impl::checked_unit(int u, const char* op) const {
  if (u < 0 || u >= model_.num_units())
    fail("zero::schedule", str(op, "(", u, "): no such unit (the model has ", model_.num_units(), ")"));
  return u;
}

void ZeroEngine::Impl::begin_pass(const std::vector<int>& order) {
  for (int u : order) checked_unit(u, "begin_pass");
  // A unit left gathered but never acquired by the previous pass would hold a slot for ever.
  for (int u = 0; u < model_.num_units(); ++u)
    if (units_[size_t(u)].gather == GatherState::gathered)
      protocol_violation(u, "a new pass begins while this unit is gathered but was never acquired");
  order_ = order;
  acquired_at_ = -1;
  if (!param_pool_) return;
  const int ahead = std::min(opt_.nvme_prefetch, param_pool_->count() - 1);
  for (int k = 0; k < ahead && k < int(order_.size()); ++k) fetch_param(order_[size_t(k)]);
}

// idle → fetching: lease a staging buffer and start the NVMe read of unit u's compute copy.
// A no-op for units whose compute copy is not on NVMe, that are fetching or gathered already, or
// whose overlapped update is pending: a read ahead never waits for a later unit's update (the
// unit's own prefetch or acquire waits for it, then reads). A worker that stopped short of u
// leaves it not pending: what is read then is never used, the await_update before u's gather
// rethrows the worker's error.
void ZeroEngine::Impl::fetch_param(int u) {
  Unit& s = units_[size_t(u)];
  const Shard& src = param_shard(s);
  if (src.tier != Tier::nvme || s.gather != GatherState::idle || update_pending(u)) return;
  if (forward_.has(u)) return;  // the update's buffer holds it: prefetch gathers from there
  s.fetch_lease = param_pool_->acquire();
  // Urgent: a pass waits on it, while the optimizer's state reads and writes may be queued.
  s.fetch_ticket = swapper_->submit({swap_->request(IoOp::read, src.key, s.fetch_lease.data, src.bytes)},
                                    IoLane::urgent);
  s.gather = GatherState::fetching;
}

// idle | fetching → gathered: own a slot and enqueue the gather into it on the comm stream.
// A hint (the trainer's look-ahead, called once the compute of the unit before has been
// enqueued) waits for u's update only when u is the unit the pass acquires next — the update the
// next compute needs anyway — and leaves any other unit whose update has not been waited for
// alone (its acquire, or a later hint, gathers it): waiting for it would hold back the compute of
// the units before it. The rule depends on the program's position, not on the worker's pace,
// because the gather is a collective across ranks, which every rank must issue at the same point
// of its program (a rank that skipped it while another did not would reorder it against the
// collectives of other groups, tensor-parallel, that could then wait on each other in a cycle).
void ZeroEngine::Impl::prefetch(int u, bool hint) {
  if (direct_params() || u < 0 || u >= model_.num_units()) return;
  Unit& s = units_[size_t(u)];
  if (s.gather == GatherState::gathered || s.gather == GatherState::held) return;
  if (hint && update_outstanding(u)) {
    const size_t next = size_t(acquired_at_ + 1);
    if (next >= order_.size() || order_[next] != u) return;
  }
  await_update(u);  // an overlapped optimizer step writes the compute copy first
  const Shard& ps = param_shard(s);
  // The NVMe staging buffer (the read's, or the update's kept one): back to its pool behind the
  // comm stream once the gather has been enqueued, or on the way out when enqueuing the copy,
  // gather or cast throws (that error is the one that propagates), so no pool loses a buffer.
  struct StagingLease {
    Impl& e;
    PinnedPool::Lease lease;
    bool kept;
    void give_back() {
      if (!lease) return;
      if (kept) e.forward_.release(std::exchange(lease, {}), &e.comm_);
      else e.param_pool_->release(std::exchange(lease, {}), &e.comm_);
    }
    ~StagingLease() {
      try {
        give_back();
      } catch (const std::exception&) {
      }
    }
  } read_into{*this, {}, false};
  // The update kept the compute copy it wrote (ForwardCopies): gathered from there, unread. (A
  // read issued before, of the same values, is waited out and its buffer returned.)
  if (ps.tier == Tier::nvme) read_into.lease = forward_.take(u);
  read_into.kept = bool(read_into.lease);
  if (read_into.kept && s.gather == GatherState::fetching) {
    swapper_->wait(std::exchange(s.fetch_ticket, 0));
    param_pool_->release(std::exchange(s.fetch_lease, {}));
    s.gather = GatherState::idle;
  }
  // The NVMe read must be issued before the slot is owned: a ticket is consumed only once
  // it exists (the hang of offload.prefetch=0 waited for a read that was never issued).
  if (ps.tier == Tier::nvme && !read_into.kept) {
    fetch_param(u);
    if (s.gather != GatherState::fetching || s.fetch_ticket == 0 || !s.fetch_lease)
      protocol_violation(u, "gather of an NVMe compute copy without a read in flight");
  }
  Slot& sl = take_slot(param_slots_, param_slot_limit_, u, "parameter");
  s.slot = int(&sl - param_slots_.data());
  watchdog_set_unit(model_.unit(u).name);  // the context the gather is reported with
  const FlatLayout& L = model_.unit(u).layout;
  const bool bf16 = place_.compute == DType::bf16;
  const size_t n = L.shard_numel(), bytes = n * param_elem_bytes();
  const CommType ct = bf16 ? CommType::bf16 : CommType::f32;
  void* gathered = bf16 ? sl.full16.data() : sl.full.data();
  comm_.wait(*sl.free);  // the previous occupant's readers are done
  const void* src = nullptr;
  bool rounded = false;  // one rank, the master rounded straight into the slot: nothing follows
  if (place_.param_rounds_master() && !read_into.kept) {
    // The f32 master, in host memory or read from NVMe: rounded to the bf16 compute copy here,
    // as the update rounds it (the same bits), then gathered as that copy is.
    const float* master = ps.tier == Tier::nvme ? static_cast<const float*>(s.fetch_lease.data)
                                                : ps.ptr<float>();
    if (ps.tier == Tier::nvme) {
      swapper_->wait(std::exchange(s.fetch_ticket, 0));
      read_into.lease = std::exchange(s.fetch_lease, {});
    }
    traffic_.h2d_bytes += n * 4;
    if (!device_.host_addressable()) {  // copied in first, into the slot it is rounded in
      comm_.copy(sl.full.data(), master, n * 4);
      master = sl.full.as<float>();
    }
    if (dp_.size() == 1) {
      device_.ops().round_to_bf16(comm_, sl.full.as<float>(), master, n);
      rounded = true;
    } else {
      device_.ops().cast_f32_to_bf16(comm_, sl.shard.as<uint16_t>(), master, n);
      src = sl.shard.data();
    }
  } else if (ps.tier == Tier::device) {
    src = ps.mem.data();
  } else {
    // Off the device: the shard in host memory or in the NVMe staging buffer.
    const void* host = ps.mem.data();
    if (read_into.kept) {
      host = read_into.lease.data;
      traffic_.forwarded_bytes += bytes;
    } else if (ps.tier == Tier::nvme) {
      swapper_->wait(std::exchange(s.fetch_ticket, 0));
      read_into.lease = std::exchange(s.fetch_lease, {});
      host = read_into.lease.data;
    }
    traffic_.h2d_bytes += bytes;
    if (device_.host_addressable() && (bf16 || dp_.size() > 1)) {
      // The device reads host memory: the cast or the all-gather below reads the shard where it
      // is, with no copy first (the values are the same; the copy cost the CPU device's cores).
      src = host;
    } else {
      // Copied in on the communication stream, straight into the gathered buffer when there
      // is one rank.
      void* stage = dp_.size() == 1 ? gathered : sl.shard.data();
      comm_.copy(stage, host, bytes);
      src = stage;
    }
  }
  if (rounded) {
    // The slot holds the compute copy already.
  } else if (bf16 && dp_.size() == 1) {
    device_.ops().cast_bf16_to_f32(comm_, sl.full.as<float>(), static_cast<const uint16_t*>(src), n);
  } else {
    dp_.all_gather(comm_, gathered, src, n, ct);
    traffic_.comm_bytes += L.padded_numel() * param_elem_bytes();
    if (bf16)
      device_.ops().cast_bf16_to_f32(comm_, sl.full.as<float>(), sl.full16.as<uint16_t>(),
                                     L.padded_numel());
  }
  read_into.give_back();
  comm_.record(*sl.ready);
  ++traffic_.gathers;
  s.gather = GatherState::gathered;
}

// gathered → held (gathering first when needed); held stays held (a tied embedding is acquired
// by the head and by its own unit).
const float* ZeroEngine::Impl::acquire(int u) {
  checked_unit(u, "acquire");
  // Read ahead on NVMe along the pass order, as far as the staging pool allows (unit u's own
  // buffer may still be leased until its gather is enqueued, hence count() - 1).
  const auto it = std::find(order_.begin(), order_.end(), u);
  if (it != order_.end()) acquired_at_ = int(it - order_.begin());
  if (param_pool_) {
    const int ahead = std::min(opt_.nvme_prefetch, param_pool_->count() - 1);
    for (int k = 1; k <= ahead && it != order_.end() && it + k < order_.end(); ++k)
      fetch_param(*(it + k));
  }
  Unit& s = units_[size_t(u)];
  watchdog_set_unit(model_.unit(u).name);
  if (direct_params()) {
    await_update(u);
    if (opt_.test_hooks && opt_.test_hooks->after_acquire) opt_.test_hooks->after_acquire(u);
    return param_shard(s).ptr<float>();
  }
  if (s.gather == GatherState::idle || s.gather == GatherState::fetching) prefetch(u);
  if (s.slot < 0 || param_slots_[size_t(s.slot)].owner != u)
    protocol_violation(u, "acquire of a unit whose parameter slot it does not own");
  Slot& sl = param_slots_[size_t(s.slot)];
  if (s.gather == GatherState::gathered) compute_.wait(*sl.ready);
  s.gather = GatherState::held;
  if (opt_.test_hooks && opt_.test_hooks->after_acquire) opt_.test_hooks->after_acquire(u);
  return sl.full.as<float>();
}

// held → idle: compute records that it is done with the slot.
void ZeroEngine::Impl::release(int u) {
  checked_unit(u, "release");
  if (direct_params()) return;
  Unit& s = units_[size_t(u)];
  if (s.gather != GatherState::held) protocol_violation(u, "release of a unit that was not acquired");
  Slot& sl = param_slots_[size_t(s.slot)];
  compute_.record(*sl.free);
  sl.owner = -1;
  s.slot = -1;
  s.gather = GatherState::idle;
}

float* ZeroEngine::Impl::acquire_grad(int u) {
  Unit& s = units_[size_t(checked_unit(u, "acquire_grad"))];
  if (aliased_grads()) {  // one rank: accumulate into the shard itself
    if (s.grad.tier != Tier::nvme) return s.grad.ptr<float>();
    if (!s.grad_lease) {  // on NVMe: into a zeroed staging buffer, written out by reduce_grad
      s.grad_lease = grad_pool_->acquire();
      compute_.fill_zero(s.grad_lease.data, s.grad.bytes);
    }
    return static_cast<float*>(s.grad_lease.data);
  }
  if (s.grad_slot >= 0) return grad_slots_[size_t(s.grad_slot)].full.as<float>();
  Slot& sl = take_slot(grad_slots_, grad_slot_limit_, u, "gradient");
  s.grad_slot = int(&sl - grad_slots_.data());
  compute_.wait(*sl.free);  // the previous reduction out of this slot has completed
  compute_.fill_zero(sl.full.data(), model_.unit(u).layout.padded_numel() * 4);
  return sl.full.as<float>();
}

void ZeroEngine::Impl::reduce_grad(int u) {
  Unit& s = units_[size_t(checked_unit(u, "reduce_grad"))];
  if (aliased_grads()) {  // the backward accumulated into the shard on the compute stream
    if (s.grad.tier == Tier::nvme) {
      if (!s.grad_lease)
        protocol_violation(u, "reduce_grad of a unit whose gradient was not acquired");
      compute_.record(*grad_events_[size_t(u)]);
      reduce_.wait(*grad_events_[size_t(u)]);
      write_grad(u, std::exchange(s.grad_lease, {}));
      mark_final(u, reduce_);  // written, its norm parts taken
    } else {
      mark_final(u, compute_);
    }
    if (opt_.test_hooks && opt_.test_hooks->after_reduce_grad) opt_.test_hooks->after_reduce_grad(u);
    return;
  }
  if (s.grad_slot < 0) protocol_violation(u, "reduce_grad of a unit whose gradient was not acquired");
  watchdog_set_unit(model_.unit(u).name);
  Slot& sl = grad_slots_[size_t(s.grad_slot)];
  const FlatLayout& L = model_.unit(u).layout;
  const size_t n = L.shard_numel();
  compute_.record(*sl.ready);
  reduce_.wait(*sl.ready);
  const float* part = sl.full.as<float>();  // one rank: the full gradient is the shard
  if (dp_.size() > 1) {
    dp_reduce_->reduce_scatter(reduce_, reduce_tmp_.data(), sl.full.data(), n, CommType::f32, ReduceOp::sum);
    traffic_.comm_bytes += L.padded_numel() * 4;
    part = reduce_tmp_.as<float>();
  }
  const bool nvme = s.grad.tier == Tier::nvme;  // (one micro-batch a step: the first is the last)
  PinnedPool::Lease lease = nvme ? grad_pool_->acquire() : PinnedPool::Lease{};
  float* g = nvme ? static_cast<float*>(lease.data) : s.grad.ptr<float>();
  if (nvme && device_.host_addressable()) reduce_.fill_zero(g, n * 4);  // as a host shard
  if (grads_tier_ == Tier::device || device_.host_addressable()) {
    device_.ops().add(reduce_, g, g, part, n);
    if (grads_tier_ != Tier::device) traffic_.d2h_bytes += n * 4;
  } else if (nvme) {
    reduce_.copy(g, part, n * 4);
    traffic_.d2h_bytes += n * 4;
  } else {
    if (!grad_accumulated_[size_t(u)]) {
      reduce_.copy(g, part, n * 4);  // the step's first micro-batch: the shard holds zeros
    } else {
      float* stage = grad_stage_.as<float>();
      reduce_.copy(stage, part, n * 4);
      reduce_.host_task("accumulate host gradient", [g, stage, n] { cpu::fast::add(g, g, stage, n); });
    }
    traffic_.d2h_bytes += n * 4;
  }
  grad_accumulated_[size_t(u)] = 1;
  reduce_.record(*sl.free);
  sl.owner = -1;
  s.grad_slot = -1;
  if (nvme) write_grad(u, lease);
  mark_final(u, reduce_);  // an unclipped step's update of u may start (update_in_backward)
  if (opt_.test_hooks && opt_.test_hooks->after_reduce_grad) opt_.test_hooks->after_reduce_grad(u);
}

void ZeroEngine::Impl::write_grad(int u, PinnedPool::Lease lease) {
  Unit& s = units_[size_t(u)];
  const float* g = static_cast<const float*>(lease.data);
  unit_norm_parts(u, reduce_, g);
  // Blocks the reduce stream's thread, never the backward's: the next unit's gradient is
  // accumulated meanwhile into another buffer. (The bulk lane: a pass's parameter reads and
  // the optimizer's state reads go to the disk first.)
  reduce_.host_task("write gradient", [this, key = s.grad.key, g, bytes = s.grad.bytes] {
    swapper_->wait(swapper_->submit(
        {swap_->request(IoOp::write, key, const_cast<float*>(g), bytes, 0)}, IoLane::bulk));
  });
  grad_pool_->release(lease, &reduce_);  // free once written
  grad_written_[size_t(u)] = 1;
}

void ZeroEngine::Impl::check_quiescent(const char* op) const {
  for (int u = 0; u < model_.num_units(); ++u) {
    const Unit& s = units_[size_t(u)];
    if (s.gather != GatherState::idle)
      protocol_violation(u, str(op, " while the unit's parameters are still ", gather_state_name(s.gather),
                                " (a gathered copy would be stale after the update)"));
    if (s.grad_slot >= 0 || s.grad_lease)  // a gradient slot, or an NVMe gradient's staging
      protocol_violation(u, str(op, " while the unit's gradient was acquired and never reduced"));
  }
}

// ---- engine/zero.h: the public calls of this file, forwarded to Impl ----------------------------

void ZeroEngine::begin_pass(const std::vector<int>& order) { impl_->begin_pass(order); }
void ZeroEngine::prefetch(int u) { impl_->prefetch(u, /*hint=*/true); }
const float* ZeroEngine::acquire(int u) { return impl_->acquire(u); }
void ZeroEngine::release(int u) { impl_->release(u); }
float* ZeroEngine::acquire_grad(int u) { return impl_->acquire_grad(u); }
void ZeroEngine::reduce_grad(int u) { impl_->reduce_grad(u); }

}  // namespace strata
