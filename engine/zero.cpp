// engine/zero.cpp — shards on their tiers, gather/reduce slots, NVMe staging, and the optimizer
// step of the ZeRO-3 engine.
#include "engine/zero.h"
#include "engine/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "engine/safetensors.h"
#include "engine/test_hooks.h"
#include "engine/zero_state.h"
#include "io/backend.h"
#include "io/file_io.h"
#include "kernels/ops.h"
#include "offload/pinned_pool.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"

namespace strata {

namespace {

size_t max_padded(const LlamaModel& m) {
  size_t n = 0;
  for (const auto& u : m.units()) n = std::max(n, u.layout.padded_numel());
  return n;
}

size_t max_shard(const LlamaModel& m) {
  size_t n = 0;
  for (const auto& u : m.units()) n = std::max(n, u.layout.shard_numel());
  return n;
}

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

}  // namespace

ZeroOptions zero_options(const Config& cfg) {
  ZeroOptions zo;
  Placement& p = zo.placement;
  p.params = cfg.offload.params;
  p.grads = cfg.offload.grads;
  p.optimizer = cfg.offload.optimizer;
  p.compute = cfg.train.precision == Precision::bf16 ? DType::bf16 : DType::f32;
  p.prefetch = cfg.zero.prefetch;
  p.keep_embedding = cfg.model.tie_embeddings;
  p.reshard_after_forward = cfg.zero.reshard_after_forward;
  p.grad_accum = cfg.train.grad_accum;
  p.optimizer_chunk = cfg.offload.optimizer_chunk;
  zo.nvme_path = cfg.offload.nvme_path;
  zo.pinned_mem_limit = cfg.offload.pinned_mem_limit;
  zo.nvme_prefetch = cfg.offload.prefetch;
  zo.io_backend = cfg.io.backend;
  zo.io_queue_depth = cfg.io.queue_depth;
  zo.io_block_size = cfg.io.block_size;
  zo.io_stripe_size = cfg.io.stripe_size;
  zo.timeout_s = cfg.parallel.timeout;
  return zo;
}

ZeroEngine::Impl::Impl(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute,
                       Stream& comm, Stream& reduce, const ZeroOptions& options, Communicator* tp)
    : model_(model), device_(device), dp_(dp), tp_(tp), dp_reduce_(dp.split(0, dp.rank())),
      compute_(compute), comm_(comm), reduce_(reduce), opt_(options),
      grads_tier_(options.placement.grads_tier()) {
  dp_reduce_->set_name(dp.name() + " (reductions)");
  if (opt_.test_hooks) adam_isa_ = opt_.test_hooks->adam_isa;
  STRATA_CHECK(model.unit(0).layout.dp() == dp.size(), "zero::init", "layouts finalized for dp=",
               model.unit(0).layout.dp(), " but the data-parallel group has ", dp.size(), " ranks");
  STRATA_CHECK(place_.grads != Tier::nvme, "zero::init", "gradients cannot live on NVMe");
  const bool host_ok = device.host_addressable();
  if (!host_ok && place_.optimizer == Tier::device && place_.params != Tier::device)
    fail("zero::init",
         str("offload.params = ", tier_name(place_.params), " with offload.optimizer = device: the "
             "device's AdamW would write the compute copy into memory it cannot address"),
         "offload the optimizer states too (offload.optimizer = host or nvme): they are 12 of the "
         "16 bytes per parameter, the compute copy only 2 or 4");
  const bool bf16 = place_.compute == DType::bf16;
  const size_t esz = param_elem_bytes();

  // ---- the NVMe tier: swap space, its FileIO and the swapper thread ----
  const bool nvme_params = place_.nvme_params();
  const bool nvme_opt = place_.optimizer == Tier::nvme;
  if (nvme_params || nvme_opt) {
    if (opt_.nvme_path.empty())
      fail("zero::init", "a state is placed on nvme but offload.nvme_path is empty",
           "set offload.nvme_path to one directory per NVMe device, e.g. --set offload.nvme_path=/mnt/nvme0");
    for (const auto& d : opt_.nvme_path) {
      std::error_code ec;
      std::filesystem::create_directories(d, ec);
      if (ec)
        fail("zero::init", str("cannot create offload.nvme_path directory '", d, "': ", ec.message()));
    }
    uint64_t need = 0;
    for (const auto& u : model.units()) {
      uint64_t n = u.layout.shard_numel();
      if (nvme_opt) need += 3 * n * 4;
      if (nvme_params && !param_is_master()) need += n * esz;
    }
    IoOptions io;
    io.backend = opt_.io_backend;
    io.queue_depth = opt_.io_queue_depth;
    io.block_size = opt_.io_block_size;
    io.name = "nvme";
    io_ = make_file_io_with_faults(io, opt_.nvme_path,
                                   opt_.test_hooks ? &opt_.test_hooks->io_faults : nullptr);
    SwapSpaceOptions so;
    so.dirs = opt_.nvme_path;
    so.capacity_bytes = need + uint64_t(model.num_units()) * 4 * opt_.io_stripe_size;
    so.stripe_bytes = opt_.io_stripe_size;
    so.name = str("rank", dp.rank());
    swap_ = std::make_unique<SwapSpace>(*io_, so);
    swapper_ = std::make_unique<Swapper>(*io_, opt_.timeout_s);
  }

  // ---- shards ----
  units_.resize(static_cast<size_t>(model.num_units()));
  auto place = [&](Shard& sh, Tier tier, size_t bytes, const std::string& key, const char* what,
                   bool pinned) {
    sh.tier = tier;
    sh.bytes = bytes;
    if (tier == Tier::device) sh.mem = device.alloc(bytes, what);
    else if (tier == Tier::host) sh.mem = device.alloc_host(bytes, pinned, what);
    else {
      sh.key = key;
      swap_->allocate(key, bytes);
    }
  };
  for (int u = 0; u < model.num_units(); ++u) {
    Unit& s = units_[size_t(u)];
    const size_t n = model.unit(u).layout.shard_numel();
    const std::string k = str("unit", u, "/");
    place(s.master, place_.optimizer, n * 4, k + "master", "master weights shard", false);
    place(s.m, place_.optimizer, n * 4, k + "m", "AdamW m shard", false);
    place(s.v, place_.optimizer, n * 4, k + "v", "AdamW v shard", false);
    place(s.grad, grads_tier_, n * 4, "", "gradient shard", true);
    if (!param_is_master())
      place(s.param, place_.params, n * esz, k + "param", bf16 ? "bf16 parameter shard" : "f32 parameter shard", true);
  }

  // ---- slots ----
  const size_t full = max_padded(model), shard = max_shard(model);
  if (!direct_params()) {
    param_slots_.resize(size_t(place_.param_slots(model.num_units())));
    for (auto& sl : param_slots_) {
      sl.full = device.alloc(full * 4, "gathered parameters");
      if (bf16) sl.full16 = device.alloc(full * 2, "gathered bf16 parameters");
      if (dp.size() > 1 && place_.params != Tier::device)
        sl.shard = device.alloc(shard * esz, "staged parameter shard");
      sl.ready = device.make_event();
      sl.free = device.make_event();
    }
  }
  if (!aliased_grads()) {
    int n_slots = place_.grad_slots();
    grad_slots_.resize(size_t(n_slots));
    for (auto& sl : grad_slots_) {
      sl.full = device.alloc(full * 4, "full gradient");
      sl.ready = device.make_event();
      sl.free = device.make_event();
    }
    if (dp.size() > 1) reduce_tmp_ = device.alloc(shard * 4, "reduce-scatter result");
    if (grads_tier_ == Tier::host && !host_ok)
      grad_stage_ = device.alloc_host(shard * 4, true, "gradient staging");
  }
  // The CPU AdamW refreshes a device-resident compute copy through pinned staging when the host
  // cannot address device memory.
  if (!host_ok && place_.optimizer != Tier::device && place_.params == Tier::device && !param_is_master())
    param_stage_ = device.alloc_host(shard * esz, true, "compute copy staging");
  size_t n_ranges = 0;
  for (int u = 0; u < model.num_units(); ++u) {
    const FlatLayout& L = model.unit(u).layout;
    norm_ranges_.push_back(norm_ranges(L, size_t(dp.rank()) * L.shard_numel(), L.shard_numel()));
    n_ranges += norm_ranges_.back().size();
  }
  n_ranges = std::max(n_ranges, units_.size());
  norm_parts_ = device.alloc(n_ranges * 8, "gradient norm partial sums");
  norm_host_ = device.alloc_host(n_ranges * 8, true, "gradient norm partial sums");

  // ---- pinned staging pools (budget offload.pinned_mem_limit) ----
  const uint64_t chunk_bytes = place_.chunk_bytes(shard, kShardAlignElems);
  const bool chunk_io = place_.chunk_io();
  const uint64_t chunk_need = chunk_io ? 3 * 4 * chunk_bytes : 0;
  const uint64_t pinned_min = chunk_need + (nvme_params ? shard * esz : 0);
  if (opt_.pinned_mem_limit && opt_.pinned_mem_limit < pinned_min)
    fail("zero::init",
         str("offload.pinned_mem_limit = ", format_bytes(opt_.pinned_mem_limit),
             " is too small: NVMe staging needs at least ", format_bytes(pinned_min), " (",
             chunk_io ? str("12 optimizer chunks of ", format_bytes(chunk_bytes)) : std::string(),
             nvme_params ? str(" + one parameter shard of ", format_bytes(shard * esz)) : std::string(), ")"),
         "raise offload.pinned_mem_limit (0 sizes it as needed) or lower offload.optimizer_chunk");
  if (chunk_io)
    chunk_pool_ = std::make_unique<PinnedPool>(device, chunk_need, chunk_bytes, 12, "optimizer chunk",
                                               opt_.timeout_s);
  if (nvme_params) {
    uint64_t budget = 0;
    if (opt_.pinned_mem_limit) {
      budget = opt_.pinned_mem_limit > chunk_need ? opt_.pinned_mem_limit - chunk_need : 0;
      budget = std::min<uint64_t>(budget, uint64_t(opt_.nvme_prefetch + 1) * shard * esz);
    }
    param_pool_ = std::make_unique<PinnedPool>(device, budget, shard * esz,
                                               budget ? 1 : opt_.nvme_prefetch + 1, "parameter",
                                               opt_.timeout_s);
  }

  // ---- zeroed state ----
  std::vector<char> zeros;
  for (int u = 0; u < model.num_units(); ++u) {
    Unit& s = units_[size_t(u)];
    const size_t n = model.unit(u).layout.shard_numel();
    for (Shard* sh : {&s.m, &s.v, &s.grad}) {
      if (sh->tier == Tier::device) compute.fill_zero(sh->mem.data(), sh->bytes);
      else if (sh->tier == Tier::host) std::memset(sh->mem.data(), 0, sh->bytes);
      else {
        zeros.assign(std::min<size_t>(n * 4, chunk_bytes), 0);
        Buffer z = device.alloc_host(zeros.size(), true, "zero staging");
        std::memset(z.data(), 0, z.bytes());
        std::vector<IoRequest> reqs;
        for (size_t off = 0; off < n * 4; off += z.bytes())
          reqs.push_back(swap_->request(IoOp::write, sh->key, z.data(), std::min<size_t>(z.bytes(), n * 4 - off), off));
        swapper_->wait(swapper_->submit(std::move(reqs)));
      }
    }
  }
  compute.synchronize();
}

ZeroEngine::Impl::~Impl() {
  // Nothing the streams or the swapper still do may touch memory freed below: drain every stream
  // (one that fails does not skip the others), then every NVMe job, and stop the swapper before
  // the staging pools it reads and writes are freed (members die in reverse order).
  for (Stream* st : {&compute_, &comm_, &reduce_}) {
    try {
      st->synchronize();
    } catch (const std::exception& e) {
      log_warn("zero", "error while draining stream '", st->name(), "' at shutdown: ", e.what());
    }
  }
  if (swapper_) {
    try {
      swapper_->wait_all();
    } catch (const std::exception& e) {
      log_warn("zero", "error while draining NVMe jobs at shutdown: ", e.what());
    }
    swapper_.reset();
  }
}

bool ZeroEngine::Impl::param_is_master() const { return place_.param_is_master(); }
bool ZeroEngine::Impl::direct_params() const { return place_.direct_params(dp_.size()); }
bool ZeroEngine::Impl::aliased_grads() const { return place_.aliased_grads(dp_.size()); }

const ZeroEngine::Impl::Shard& ZeroEngine::Impl::param_shard(const Unit& s) const {
  return param_is_master() ? s.master : s.param;
}

// ---- host access to shards on any tier ------------------------------------------------------

void ZeroEngine::Impl::read_shard(const Shard& sh, size_t esz, size_t begin, size_t count,
                                  void* host) {
  const size_t off = begin * esz, bytes = count * esz;
  switch (sh.tier) {
    case Tier::device:
      compute_.copy(host, sh.mem.as<char>() + off, bytes);
      compute_.synchronize();
      traffic_.d2h_bytes += bytes;
      return;
    case Tier::host: std::memcpy(host, sh.mem.as<char>() + off, bytes); return;
    case Tier::nvme: {
      // Direct I/O wants aligned memory: go through a staging buffer. Callers move whole shards
      // or chunks, whose offsets and lengths are multiples of 4 KiB.
      STRATA_CHECK(off % 4096 == 0 && bytes % 4096 == 0, "zero::read_shard", "unaligned range");
      Buffer stage = device_.alloc_host(bytes, true, "nvme staging");
      swapper_->wait(swapper_->submit({swap_->request(IoOp::read, sh.key, stage.data(), bytes, off)}));
      std::memcpy(host, stage.data(), bytes);
      return;
    }
  }
}

void ZeroEngine::Impl::write_shard(Shard& sh, size_t esz, size_t begin, size_t count,
                                   const void* host) {
  const size_t off = begin * esz, bytes = count * esz;
  switch (sh.tier) {
    case Tier::device:
      compute_.copy(sh.mem.as<char>() + off, host, bytes);
      compute_.synchronize();
      traffic_.h2d_bytes += bytes;
      return;
    case Tier::host: std::memcpy(sh.mem.as<char>() + off, host, bytes); return;
    case Tier::nvme: {
      STRATA_CHECK(off % 4096 == 0 && bytes % 4096 == 0, "zero::write_shard", "unaligned range");
      Buffer stage = device_.alloc_host(bytes, true, "nvme staging");
      std::memcpy(stage.data(), host, bytes);
      swapper_->wait(swapper_->submit({swap_->request(IoOp::write, sh.key, stage.data(), bytes, off)}));
      return;
    }
  }
}

void ZeroEngine::Impl::write_master_values(Unit& s, size_t begin, size_t count,
                                           const float* values) {
  write_shard(s.master, 4, begin, count, values);
  if (param_is_master()) return;
  if (place_.compute == DType::bf16) {
    std::vector<uint16_t> b(count);
    convert_f32_to_bf16(values, b.data(), count);
    write_shard(s.param, 2, begin, count, b.data());
  } else {
    write_shard(s.param, 4, begin, count, values);
  }
}

// ---- initialization -------------------------------------------------------------------------

void ZeroEngine::Impl::init_from_seed(uint64_t seed) {
  const int rank = dp_.rank();
  for (int u = 0; u < model_.num_units(); ++u) {
    const size_t n = model_.unit(u).layout.shard_numel();
    std::vector<float> values(n);
    model_.init_values(u, seed, size_t(rank) * n, n, values.data());
    write_master_values(units_[size_t(u)], 0, n, values.data());
  }
}

void ZeroEngine::Impl::init_from(const SafetensorsReader& reader) {
  const int rank = dp_.rank();
  for (int u = 0; u < model_.num_units(); ++u) {
    const FlatLayout& L = model_.unit(u).layout;
    size_t n = L.shard_numel(), begin = size_t(rank) * n, end = begin + n;
    std::vector<float> h(n, 0.0f);
    for (const auto& v : L.views()) {
      size_t b = std::max(begin, v.offset), e = std::min(end, v.offset + v.numel);
      if (b >= e) continue;
      const TensorInfo& info = reader.info(v.name);
      if (info.shape != v.global_shape) {
        std::string want, got;
        for (auto d : v.global_shape) want += str(want.empty() ? "" : ", ", d);
        for (auto d : info.shape) got += str(got.empty() ? "" : ", ", d);
        fail("zero::init_from", str("tensor '", v.name, "' has shape [", got, "] but the model needs [",
                                    want, "]"),
             "the checkpoint's config.json and tensors disagree, or the file is from another model");
      }
      // Only this rank's slice, in runs contiguous in the global tensor (a row of a
      // column-split slice; the whole range otherwise).
      const size_t run = v.split_dim == 1 ? size_t(v.shape[1]) : v.numel;
      for (size_t i = b; i < e;) {
        const size_t local = i - v.offset, n_run = std::min(e - i, run - local % run);
        reader.read_f32(v.name, h.data() + (i - begin), int64_t(v.global_index(local)),
                        int64_t(n_run));
        i += n_run;
      }
    }
    write_master_values(units_[size_t(u)], 0, n, h.data());
  }
}

// ---- gather / release -----------------------------------------------------------------------

ZeroEngine::Impl::Slot& ZeroEngine::Impl::take_slot(std::vector<Slot>& pool, int u,
                                                    const char* what) {
  for (auto& sl : pool) {
    if (sl.owner < 0) {
      sl.owner = u;
      return sl;
    }
  }
  std::string owners;
  for (size_t i = 0; i < pool.size(); ++i)
    owners += str(i ? ", " : "", "slot ", i, ": ", model_.unit(pool[i].owner).name);
  protocol_violation(u, str("no free ", what, " slot (", pool.size(), " slots, all owned: ", owners, ")"));
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
  if (!param_pool_) return;
  const int ahead = std::min(opt_.nvme_prefetch, param_pool_->count() - 1);
  for (int k = 0; k < ahead && k < int(order_.size()); ++k) fetch_param(order_[size_t(k)]);
}

// idle → fetching: lease a staging buffer and start the NVMe read of unit u's compute copy.
// A no-op for units whose compute copy is not on NVMe, or that are fetching or gathered already.
void ZeroEngine::Impl::fetch_param(int u) {
  Unit& s = units_[size_t(u)];
  const Shard& src = param_shard(s);
  if (src.tier != Tier::nvme || s.gather != GatherState::idle) return;
  s.fetch_lease = param_pool_->acquire();
  s.fetch_ticket = swapper_->submit({swap_->request(IoOp::read, src.key, s.fetch_lease.data, src.bytes)});
  s.gather = GatherState::fetching;
}

// idle | fetching → gathered: own a slot and enqueue the gather into it on the comm stream.
void ZeroEngine::Impl::prefetch(int u) {
  if (direct_params() || u < 0 || u >= model_.num_units()) return;
  Unit& s = units_[size_t(u)];
  if (s.gather == GatherState::gathered || s.gather == GatherState::held) return;
  const Shard& ps = param_shard(s);
  // The NVMe read must be issued before the slot is owned: a ticket is consumed only once
  // it exists (the hang of offload.prefetch=0 waited for a read that was never issued).
  if (ps.tier == Tier::nvme) {
    fetch_param(u);
    if (s.gather != GatherState::fetching || s.fetch_ticket == 0 || !s.fetch_lease)
      protocol_violation(u, "gather of an NVMe compute copy without a read in flight");
  }
  Slot& sl = take_slot(param_slots_, u, "parameter");
  s.slot = int(&sl - param_slots_.data());
  watchdog_set_unit(model_.unit(u).name);  // the context the gather is reported with
  const FlatLayout& L = model_.unit(u).layout;
  const bool bf16 = place_.compute == DType::bf16;
  const size_t n = L.shard_numel(), bytes = n * param_elem_bytes();
  const CommType ct = bf16 ? CommType::bf16 : CommType::f32;
  void* gathered = bf16 ? sl.full16.data() : sl.full.data();
  comm_.wait(*sl.free);  // the previous occupant's readers are done
  const void* src = nullptr;
  if (ps.tier == Tier::device) {
    src = ps.mem.data();
  } else {
    // Off the device: copy the shard in (host memory or the NVMe staging buffer) on the
    // communication stream, straight into the gathered buffer when there is one rank.
    void* stage = dp_.size() == 1 ? gathered : sl.shard.data();
    if (ps.tier == Tier::host) {
      comm_.copy(stage, ps.mem.data(), bytes);
    } else {
      const uint64_t ticket = std::exchange(s.fetch_ticket, 0);
      swapper_->wait(ticket);
      comm_.copy(stage, s.fetch_lease.data, bytes);
      param_pool_->release(std::exchange(s.fetch_lease, {}), &comm_);
    }
    traffic_.h2d_bytes += bytes;
    src = stage;
  }
  if (bf16 && dp_.size() == 1) {
    device_.ops().cast_bf16_to_f32(comm_, sl.full.as<float>(), static_cast<const uint16_t*>(src), n);
  } else {
    dp_.all_gather(comm_, gathered, src, n, ct);
    traffic_.comm_bytes += L.padded_numel() * param_elem_bytes();
    if (bf16)
      device_.ops().cast_bf16_to_f32(comm_, sl.full.as<float>(), sl.full16.as<uint16_t>(),
                                     L.padded_numel());
  }
  comm_.record(*sl.ready);
  s.gather = GatherState::gathered;
}

// gathered → held (gathering first when needed); held stays held (a tied embedding is acquired
// by the head and by its own unit).
const float* ZeroEngine::Impl::acquire(int u) {
  checked_unit(u, "acquire");
  // Read ahead on NVMe along the pass order, as far as the staging pool allows (unit u's own
  // buffer may still be leased until its gather is enqueued, hence count() - 1).
  if (param_pool_ && !order_.empty()) {
    const int ahead = std::min(opt_.nvme_prefetch, param_pool_->count() - 1);
    auto it = std::find(order_.begin(), order_.end(), u);
    for (int k = 1; k <= ahead && it != order_.end() && it + k < order_.end(); ++k)
      fetch_param(*(it + k));
  }
  Unit& s = units_[size_t(u)];
  watchdog_set_unit(model_.unit(u).name);
  if (direct_params()) return param_shard(s).ptr<float>();
  if (s.gather == GatherState::idle || s.gather == GatherState::fetching) prefetch(u);
  if (s.slot < 0 || param_slots_[size_t(s.slot)].owner != u)
    protocol_violation(u, "acquire of a unit whose parameter slot it does not own");
  Slot& sl = param_slots_[size_t(s.slot)];
  if (s.gather == GatherState::gathered) compute_.wait(*sl.ready);
  s.gather = GatherState::held;
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
  if (aliased_grads()) return s.grad.ptr<float>();  // one rank: accumulate into the shard itself
  if (s.grad_slot >= 0) return grad_slots_[size_t(s.grad_slot)].full.as<float>();
  Slot& sl = take_slot(grad_slots_, u, "gradient");
  s.grad_slot = int(&sl - grad_slots_.data());
  compute_.wait(*sl.free);  // the previous reduction out of this slot has completed
  compute_.fill_zero(sl.full.data(), model_.unit(u).layout.padded_numel() * 4);
  return sl.full.as<float>();
}

void ZeroEngine::Impl::reduce_grad(int u) {
  Unit& s = units_[size_t(checked_unit(u, "reduce_grad"))];
  if (aliased_grads()) return;
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
  float* g = s.grad.ptr<float>();
  if (grads_tier_ == Tier::device || device_.host_addressable()) {
    device_.ops().add(reduce_, g, g, part, n);
    if (grads_tier_ == Tier::host) traffic_.d2h_bytes += n * 4;
  } else {
    float* stage = grad_stage_.as<float>();
    reduce_.copy(stage, part, n * 4);
    reduce_.host_task("accumulate host gradient", [g, stage, n] {
      for (size_t i = 0; i < n; ++i) g[i] += stage[i];
    });
    traffic_.d2h_bytes += n * 4;
  }
  reduce_.record(*sl.free);
  sl.owner = -1;
  s.grad_slot = -1;
}

// ---- the step -------------------------------------------------------------------------------

double ZeroEngine::Impl::grad_norm() {
  watchdog_set_unit("");
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  Ops& ops = device_.ops();
  double* parts = norm_parts_.as<double>();
  double* h = norm_host_.as<double>();
  size_t n = 0;  // partial sums, one per range
  if (grads_tier_ == Tier::device || device_.host_addressable()) {
    for (int u = 0; u < model_.num_units(); ++u)
      for (auto [begin, count] : norm_ranges_[size_t(u)])
        ops.sum_squares(compute_, parts + n++, units_[size_t(u)].grad.ptr<float>() + begin, count);
    compute_.copy(h, parts, n * 8);
    compute_.synchronize();
  } else {
    for (int u = 0; u < model_.num_units(); ++u) {
      const float* g = units_[size_t(u)].grad.ptr<float>();
      for (auto [begin, count] : norm_ranges_[size_t(u)]) {
        double acc = 0;
        for (size_t i = begin; i < begin + count; ++i) acc += double(g[i]) * g[i];
        h[n++] = acc;
      }
    }
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
  return std::sqrt(h[0]);
}

void ZeroEngine::Impl::check_quiescent(const char* op) const {
  for (int u = 0; u < model_.num_units(); ++u) {
    const Unit& s = units_[size_t(u)];
    if (s.gather != GatherState::idle)
      protocol_violation(u, str(op, " while the unit's parameters are still ", gather_state_name(s.gather),
                                " (a gathered copy would be stale after the update)"));
    if (s.grad_slot >= 0)
      protocol_violation(u, str(op, " while the unit's gradient was acquired and never reduced"));
  }
}

void ZeroEngine::Impl::optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale,
                                      bool decay_norms) {
  check_quiescent("optimizer_step");
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  for (int u = 0; u < model_.num_units(); ++u) {
    if (place_.optimizer == Tier::device && !device_.host_addressable())
      step_unit_on_device(u, hyper, step, grad_scale, decay_norms);
    else
      step_unit_chunked(u, hyper, step, grad_scale, decay_norms);
  }
  compute_.synchronize();
  // Every NVMe write of the step was waited for by its chunk pipeline (step_unit_chunked), so the
  // next pass reads what was written. (No wait_all(): a checkpoint save may have reads of its
  // own in flight on the swapper, and their tickets are the writer's to wait for.)
}

// Device-resident states on a device the host cannot address: the device's AdamW kernel.
void ZeroEngine::Impl::step_unit_on_device(int u, const AdamWHyper& hyper, int64_t step,
                                           float grad_scale, bool decay_norms) {
  Unit& s = units_[size_t(u)];
  const FlatLayout& L = model_.unit(u).layout;
  const size_t n = L.shard_numel(), base = size_t(dp_.rank()) * n;
  const bool bf16 = place_.compute == DType::bf16;
  for_each_segment(L, base, base + n, [&](size_t lo, size_t hi, bool is_norm) {
    AdamWHyper h = hyper;
    if (is_norm && !decay_norms) h.weight_decay = 0.0f;
    size_t o = lo - base;
    AdamWTensors t;
    t.param = s.master.ptr<float>() + o;
    t.grad = s.grad.ptr<float>() + o;
    t.m = s.m.ptr<float>() + o;
    t.v = s.v.ptr<float>() + o;
    t.param_bf16 = bf16 ? s.param.ptr<uint16_t>() + o : nullptr;
    t.n = hi - lo;
    adamw_update_on_stream(compute_, h, step, grad_scale, t, adam_isa_);
  });
}

// States the host can address (any tier on the CPU device; host or NVMe otherwise): the CPU
// AdamW over chunks of offload.optimizer_chunk bytes. NVMe-resident arrays stream through three
// staging sets — chunk k+1 is read while k is updated and k−1 is written.
void ZeroEngine::Impl::step_unit_chunked(int u, const AdamWHyper& hyper, int64_t step,
                                         float grad_scale, bool decay_norms) {
  Unit& s = units_[size_t(u)];
  const FlatLayout& L = model_.unit(u).layout;
  const size_t n = L.shard_numel(), base = size_t(dp_.rank()) * n;
  const bool bf16 = place_.compute == DType::bf16;
  const size_t esz = param_elem_bytes();
  const bool separate_param = !param_is_master();
  const size_t chunk = chunk_pool_ ? chunk_pool_->buffer_bytes() / 4 : n;  // elements
  const size_t nchunks = (n + chunk - 1) / chunk;
  Shard* states[3] = {&s.master, &s.m, &s.v};
  const bool opt_nvme = place_.optimizer == Tier::nvme;
  const bool param_nvme = separate_param && s.param.tier == Tier::nvme;

  ChunkSet sets[3];
  // However this returns, no NVMe read or write may still target a chunk buffer once the buffer
  // goes back to the pool (an Error mid-pipeline waits out the rest, keeping the first error).
  struct Drain {
    Impl& e;
    ChunkSet* sets;
    ~Drain() {
      for (int i = 0; i < 3; ++i) {
        for (uint64_t* t : {&sets[i].read, &sets[i].write}) {
          if (!*t) continue;
          try {
            e.swapper_->wait(std::exchange(*t, 0));
          } catch (const std::exception&) {  // the error that unwinds us is the one reported
          }
        }
        if (e.chunk_pool_)
          for (auto& b : sets[i].buf)
            if (b) e.chunk_pool_->release(std::exchange(b, {}));
      }
    }
  } drain{*this, sets};
  auto acquire_set = [&](ChunkSet& set) {
    if (set.write) {
      swapper_->wait(set.write);
      set.write = 0;
    }
    for (int i = 0; i < 4; ++i)
      if (!set.buf[i]) set.buf[i] = chunk_pool_->acquire();
  };
  auto issue_read = [&](size_t k, ChunkSet& set) {
    if (!opt_nvme) return;
    acquire_set(set);
    const size_t lo = k * chunk, cnt = std::min(chunk, n - lo);
    std::vector<IoRequest> reqs;
    for (int i = 0; i < 3; ++i)
      reqs.push_back(swap_->request(IoOp::read, states[i]->key, set.buf[i].data, cnt * 4, lo * 4));
    set.read = swapper_->submit(std::move(reqs));
  };

  if (nchunks > 0) issue_read(0, sets[0]);
  for (size_t k = 0; k < nchunks; ++k) {
    ChunkSet& set = sets[k % 3];
    if (k + 1 < nchunks) issue_read(k + 1, sets[(k + 1) % 3]);
    if (opt_nvme) {
      swapper_->wait(set.read);
      set.read = 0;
    } else if (param_nvme) {
      acquire_set(set);
    }
    const size_t lo = k * chunk, cnt = std::min(chunk, n - lo);
    float* ptr[3];
    for (int i = 0; i < 3; ++i)
      ptr[i] = opt_nvme ? static_cast<float*>(set.buf[i].data) : states[i]->ptr<float>() + lo;
    void* param_out = nullptr;  // where the refreshed compute copy of this chunk goes
    const bool param_staged = separate_param && !param_nvme && param_stage_;  // device, unaddressable
    if (separate_param)
      param_out = param_nvme     ? set.buf[3].data
                  : param_staged ? param_stage_.data()
                                 : static_cast<void*>(s.param.ptr<char>() + lo * esz);
    const float* g = s.grad.ptr<float>() + lo;
    for_each_segment(L, base + lo, base + lo + cnt, [&](size_t a, size_t b, bool is_norm) {
      AdamWHyper h = hyper;
      if (is_norm && !decay_norms) h.weight_decay = 0.0f;
      const size_t o = a - base - lo;
      AdamWTensors t;
      t.param = ptr[0] + o;
      t.grad = g + o;
      t.m = ptr[1] + o;
      t.v = ptr[2] + o;
      t.param_bf16 = (separate_param && bf16) ? static_cast<uint16_t*>(param_out) + o : nullptr;
      t.n = b - a;
      if (adam_isa_) adamw_update_isa(*adam_isa_, h, step, grad_scale, t);
      else adamw_update(h, step, grad_scale, t);
    });
    if (separate_param && !bf16) std::memcpy(param_out, ptr[0], cnt * 4);
    if (param_staged) {
      compute_.copy(s.param.ptr<char>() + lo * esz, param_stage_.data(), cnt * esz);
      compute_.synchronize();  // the staging buffer is refilled by the next chunk
      traffic_.h2d_bytes += cnt * esz;
    }
    if (opt_nvme || param_nvme) {
      std::vector<IoRequest> reqs;
      if (opt_nvme)
        for (int i = 0; i < 3; ++i)
          reqs.push_back(swap_->request(IoOp::write, states[i]->key, set.buf[i].data, cnt * 4, lo * 4));
      if (param_nvme)
        reqs.push_back(swap_->request(IoOp::write, s.param.key, set.buf[3].data, cnt * esz, lo * esz));
      set.write = swapper_->submit(std::move(reqs));
    }
  }
  for (auto& set : sets)
    if (set.write) swapper_->wait(std::exchange(set.write, 0));
  // `drain` returns the buffers.
}

void ZeroEngine::Impl::zero_grads() {
  for (int u = 0; u < model_.num_units(); ++u) {
    Shard& g = units_[size_t(u)].grad;
    if (g.tier == Tier::device) compute_.fill_zero(g.mem.data(), g.bytes);
    else std::memset(g.mem.data(), 0, g.bytes);
  }
}

// ---- export ---------------------------------------------------------------------------------

std::vector<float> ZeroEngine::Impl::gather_unit_to_host(int u) {
  return gather_to_host(u, false);
}
std::vector<float> ZeroEngine::Impl::gather_grad_to_host(int u) {
  return gather_to_host(u, true);
}

std::vector<float> ZeroEngine::Impl::gather_to_host(int u, bool grads) {
  const FlatLayout& L = model_.unit(u).layout;
  const size_t n = L.shard_numel();
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  std::vector<float> mine(n);
  const Unit& s = units_[size_t(u)];
  read_shard(grads ? s.grad : s.master, 4, 0, n, mine.data());
  Buffer shard = device_.alloc(n * 4, "export staging");
  Buffer full = device_.alloc(L.padded_numel() * 4, "export gather");
  comm_.copy(shard.data(), mine.data(), n * 4);
  dp_.all_gather(comm_, full.data(), shard.data(), n, CommType::f32);
  std::vector<float> out(L.padded_numel());
  comm_.copy(out.data(), full.data(), L.padded_numel() * 4);
  comm_.synchronize();
  out.resize(L.numel());
  return out;
}

void ZeroEngine::Impl::set_values(int u, size_t offset, const std::vector<float>& values) {
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  Unit& s = units_[size_t(u)];
  const size_t n = model_.unit(u).layout.shard_numel(), begin = size_t(dp_.rank()) * n;
  size_t b = std::max(begin, offset), e = std::min(begin + n, offset + values.size());
  if (b >= e) return;
  std::vector<float> shard(n);
  read_shard(s.master, 4, 0, n, shard.data());
  std::copy(values.begin() + long(b - offset), values.begin() + long(e - offset),
            shard.begin() + long(b - begin));
  write_master_values(s, 0, n, shard.data());
}

void ZeroEngine::Impl::save(const std::string& dir, DType dtype) {
  std::vector<TensorInfo> infos;
  StDType st = dtype == DType::bf16 ? StDType::bf16 : dtype == DType::f16 ? StDType::f16 : StDType::f32;
  for (const auto& unit : model_.units())
    for (const auto& v : unit.layout.views()) infos.push_back(TensorInfo{v.name, st, v.global_shape});
  std::unique_ptr<SafetensorsWriter> writer;
  const bool writes = dp_.rank() == 0 && (!tp_ || tp_->rank() == 0);
  if (writes) {
    write_hf_config(dir, model_.config(), dtype);
    writer = std::make_unique<SafetensorsWriter>(dir + "/model.safetensors", infos,
                                                 std::map<std::string, std::string>{{"format", "pt"}});
  }
  for (int u = 0; u < model_.num_units(); ++u) {
    std::vector<float> values = gather_unit_to_host(u);  // every rank takes part
    // The whole tensors from every tp rank's slices (collective over tp; tp = 1: the views).
    std::vector<std::vector<float>> tensors = assemble_unit(tp_, device_, comm_, model_, u, values);
    if (!writer) continue;
    const auto& views = model_.unit(u).layout.views();
    for (size_t i = 0; i < views.size(); ++i)
      writer->write_f32(views[i].name, tensors[i].data(), int64_t(tensors[i].size()));
  }
  if (writer) writer->finish();
  dp_.barrier(comm_);  // when save returns on any rank, the files are in place
  if (tp_) tp_->barrier(comm_);
  comm_.synchronize();
}

ZeroMemory ZeroEngine::Impl::memory() const {
  ZeroMemory m;
  for (const auto& s : units_)
    for (const Shard* sh : {&s.master, &s.m, &s.v, &s.grad, &s.param}) {
      if (!sh->bytes) continue;
      if (sh->tier == Tier::device) m.shard_bytes += sh->mem.bytes();
      else if (sh->tier == Tier::host) m.host_bytes += sh->mem.bytes();
      else m.nvme_bytes += sh->bytes;
    }
  for (const auto& sl : param_slots_) m.gathered_bytes += sl.full.bytes() + sl.full16.bytes() + sl.shard.bytes();
  for (const auto& sl : grad_slots_) m.gathered_bytes += sl.full.bytes();
  if (param_pool_) m.pinned_bytes += param_pool_->bytes();
  if (chunk_pool_) m.pinned_bytes += chunk_pool_->bytes();
  return m;
}

ZeroTraffic ZeroEngine::Impl::take_traffic() {
  ZeroTraffic t = traffic_;
  traffic_ = ZeroTraffic{};
  if (swapper_) {
    SwapperStats s = swapper_->take_stats();
    t.nvme_read_bytes = s.read_bytes;
    t.nvme_write_bytes = s.write_bytes;
    t.nvme_busy_ms = s.busy_ms;
    t.nvme_wait_ms = s.wait_ms;
  }
  return t;
}

// ---- ZeroEngine: the public calls of engine/zero.h, forwarded to Impl ----------------------

ZeroEngine::ZeroEngine(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute,
                       Stream& comm, Stream& reduce, const ZeroOptions& options, Communicator* tp)
    : impl_(std::make_unique<Impl>(model, device, dp, compute, comm, reduce, options, tp)) {}
ZeroEngine::~ZeroEngine() = default;

void ZeroEngine::init_from_seed(uint64_t seed) { impl_->init_from_seed(seed); }
void ZeroEngine::init_from(const SafetensorsReader& reader) { impl_->init_from(reader); }
void ZeroEngine::begin_pass(const std::vector<int>& order) { impl_->begin_pass(order); }
void ZeroEngine::prefetch(int u) { impl_->prefetch(u); }
const float* ZeroEngine::acquire(int u) { return impl_->acquire(u); }
void ZeroEngine::release(int u) { impl_->release(u); }
float* ZeroEngine::acquire_grad(int u) { return impl_->acquire_grad(u); }
void ZeroEngine::reduce_grad(int u) { impl_->reduce_grad(u); }
double ZeroEngine::grad_norm() { return impl_->grad_norm(); }
void ZeroEngine::optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale,
                                bool decay_norms) {
  impl_->optimizer_step(hyper, step, grad_scale, decay_norms);
}
void ZeroEngine::zero_grads() { impl_->zero_grads(); }
std::vector<float> ZeroEngine::gather_unit_to_host(int u) { return impl_->gather_unit_to_host(u); }
std::vector<float> ZeroEngine::gather_grad_to_host(int u) { return impl_->gather_grad_to_host(u); }
void ZeroEngine::set_values(int u, size_t offset, const std::vector<float>& values) {
  impl_->set_values(u, offset, values);
}
void ZeroEngine::save(const std::string& dir, DType dtype) { impl_->save(dir, dtype); }
CheckpointSource& ZeroEngine::checkpoint_source() { return impl_->checkpoint_source(); }
void ZeroEngine::load_checkpoint(const std::string& step_dir, const CheckpointManifest& manifest) {
  impl_->load_checkpoint(step_dir, manifest);
}
ZeroMemory ZeroEngine::memory() const { return impl_->memory(); }
ZeroTraffic ZeroEngine::take_traffic() { return impl_->take_traffic(); }
int ZeroEngine::dp_size() const { return impl_->dp_.size(); }

}  // namespace strata
