// engine/zero.cpp — the ZeRO engine's store: every state of every unit placed on its tier as
// offload/placement.h decides (device or host memory, or an extent of the NVMe swap space),
// the parameter and gradient slots, the pinned staging pools and the swapper; host access to a
// shard on any tier; the engine's own accounting of memory and traffic.
//
// It decides no placement itself (offload/placement.h does, for the plan too) and runs no part
// of the schedule or the step: the gather protocol is engine/zero_schedule.cpp, AdamW over the
// tiers engine/zero_step.cpp, weights in and out engine/zero_weights.cpp.
#include "engine/zero.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "engine/test_hooks.h"
#include "engine/zero_state.h"
#include "io/backend.h"
#include "io/file_io.h"
#include "offload/pinned_pool.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"

namespace strata {

namespace {

// Slot classes for a schedule holding `window` consecutive units (and the tied embedding).
std::vector<SlotClass> slot_classes_of(const LlamaModel& m, int window, bool keep_first) {
  std::vector<int> kinds;
  std::vector<uint64_t> numel;
  for (const auto& u : m.units()) {
    kinds.push_back(static_cast<int>(u.kind));
    numel.push_back(u.layout.padded_numel());
  }
  return Placement::slot_classes(kinds, numel, window, keep_first);
}

size_t max_shard(const LlamaModel& m) {
  size_t n = 0;
  for (const auto& u : m.units()) n = std::max(n, u.layout.shard_numel());
  return n;
}

}  // namespace

// The trainer holds a unit and the zero.prefetch units gathered ahead of it (all of them when
// they stay gathered from forward to backward), and the tied embedding through the step; in
// backward one gradient per unit plus the tied embedding's, in grad_slots() slots so that a
// reduction finishing late does not stall the next unit.
std::vector<SlotClass> param_slot_classes(const LlamaModel& model, const Placement& p) {
  const int keep = p.keep_embedding ? 1 : 0;
  return slot_classes_of(model, p.param_slots(model.num_units()) - (p.reshard_after_forward ? keep : 0),
                         p.keep_embedding);
}

std::vector<SlotClass> grad_slot_classes(const LlamaModel& model, const Placement& p) {
  return slot_classes_of(model, p.grad_slots() - (p.keep_embedding ? 1 : 0), p.keep_embedding);
}

int optimizer_host_units(const LlamaModel& model, const Placement& p) {
  if (p.optimizer != Tier::nvme || !p.optimizer_host_bytes) return 0;
  uint64_t used = 0;
  int n = 0;
  for (const auto& u : model.units()) {
    used += uint64_t(u.layout.shard_numel()) * p.optimizer_state_bytes();
    if (used > p.optimizer_host_bytes) break;
    ++n;
  }
  return n;
}

uint64_t optimizer_host_elems(const LlamaModel& model, const Placement& p) {
  uint64_t elems = 0;
  const int n = optimizer_host_units(model, p);
  for (int u = 0; u < n; ++u) elems += model.unit(u).layout.shard_numel();
  return elems;
}

int read_ahead_buffers(const LlamaModel& model, const Placement& p) {
  const size_t shard = max_shard(model);
  const uint64_t chunk = p.chunk_bytes(shard, kShardAlignElems) / 4;  // elements
  uint64_t chunks = 0;  // of the states on NVMe: those kept in host memory are not read
  for (int u = optimizer_host_units(model, p); u < model.num_units(); ++u)
    chunks += div_ceil(model.unit(u).layout.shard_numel(), chunk);
  return p.read_ahead_buffers(shard, kShardAlignElems, chunks);
}

uint64_t nvme_swap_bytes(const LlamaModel& model, uint64_t nvme_bytes, size_t dirs,
                         uint64_t stripe_bytes) {
  return swap_capacity(nvme_bytes, uint64_t(model.num_units()) * 4, dirs, stripe_bytes);
}

uint64_t read_ahead_bytes(const LlamaModel& model, const Placement& p) {
  return uint64_t(read_ahead_buffers(model, p)) * p.chunk_bytes(max_shard(model), kShardAlignElems);
}

PinnedStaging pinned_staging(const LlamaModel& model, const Placement& p, uint64_t pinned_mem_limit,
                             int nvme_prefetch) {
  PinnedStaging s;
  const size_t shard = max_shard(model);
  s.chunk_bytes = p.chunk_bytes(shard, kShardAlignElems);
  // The pipeline's staging serves NVMe states and a compute copy written to NVMe; with every
  // unit's states kept in host memory (offload.optimizer_host_bytes) only the latter.
  const bool states_io =
      p.optimizer == Tier::nvme && optimizer_host_units(model, p) < model.num_units();
  const bool copy_io = p.params == Tier::nvme && !p.param_is_master();  // (none when rounded)
  s.chunk_buffers = states_io || copy_io ? p.chunk_buffers() : 0;
  s.ahead_buffers = read_ahead_buffers(model, p);
  // (Every unit's states kept in host memory leaves nothing to read ahead: no error then.)
  s.read_ahead_below_chunk = p.optimizer_read_ahead && states_io && !s.ahead_buffers;
  if (p.nvme_grads()) {
    for (int u = optimizer_host_units(model, p); u < model.num_units(); ++u)
      s.grad_shard_bytes = std::max<uint64_t>(s.grad_shard_bytes,
                                              uint64_t(model.unit(u).layout.shard_numel()) * 4);
    s.grad_shards = s.grad_shard_bytes ? p.grad_slots() : 0;
  }
  if (p.nvme_params()) {
    s.param_shard_bytes = uint64_t(shard) * p.param_read_bytes();
    s.forward_shard_bytes = uint64_t(shard) * p.param_elem_bytes();
    // Whole shards of `shard` bytes the budget leaves once `taken` is (as many as wanted
    // without a budget).
    auto shards_left = [&](uint64_t taken, uint64_t want, uint64_t shard) {
      if (!pinned_mem_limit) return want;
      return pinned_mem_limit > taken ? (pinned_mem_limit - taken) / shard : 0;
    };
    const uint64_t want = uint64_t(nvme_prefetch) + 1;
    s.param_shards = int(std::clamp<uint64_t>(
        shards_left(s.chunk_need() + s.ahead_need() + s.grad_need(), want, s.param_shard_bytes),
        1, want));
    // An update's compute copy, written to NVMe from a chunk buffer (or made for this alone
    // where the gathers round the master), is kept for the next forward only where the budget
    // leaves room: it saves that read, nothing needs it.
    if (!p.param_is_master() || p.param_rounds_master()) {
      const uint64_t want_fwd = PinnedStaging::kForwardShards;
      const uint64_t taken = s.chunk_need() + s.ahead_need() + s.grad_need() + s.param_need();
      s.forward_shards =
          int(std::min(shards_left(taken, want_fwd, s.forward_shard_bytes), want_fwd));
    }
  }
  return s;
}

ZeroOptions zero_options(const Config& cfg) {
  if (cfg.offload.any_auto())
    fail("zero::options",
         str("offload.", cfg.offload.params.automatic ? "params" : cfg.offload.grads.automatic ? "grads" : "optimizer",
             " = \"auto\" has not been resolved to a tier"),
         "resolve it first (engine/step_model.h: choose_placement, then apply_placement); "
         "`strata train` does so before anything is allocated");
  ZeroOptions zo;
  Placement& p = zo.placement;
  p.params = cfg.offload.params;
  p.grads = cfg.offload.grads;
  p.optimizer = cfg.offload.optimizer;
  p.compute = cfg.train.precision == Precision::bf16 ? DType::bf16 : DType::f32;
  p.state = cfg.train.optimizer_state_dtype;
  p.prefetch = cfg.zero.prefetch;
  p.keep_embedding = cfg.model.tie_embeddings;
  p.reshard_after_forward = cfg.zero.reshard_after_forward;
  p.grad_accum = cfg.train.grad_accum;
  p.optimizer_chunk = cfg.offload.optimizer_chunk;
  p.optimizer_read_ahead = cfg.offload.overlap_optimizer ? cfg.offload.optimizer_read_ahead : 0;
  p.optimizer_host_bytes = cfg.offload.optimizer_host_bytes;
  zo.nvme_path = cfg.offload.nvme_path;
  zo.pinned_mem_limit = cfg.offload.pinned_mem_limit;
  zo.nvme_prefetch = cfg.offload.prefetch;
  zo.io_backend = cfg.io.backend;
  zo.io_queue_depth = cfg.io.queue_depth;
  zo.io_block_size = cfg.io.block_size;
  zo.io_submit_batch = cfg.io.submit_batch;
  zo.io_stripe_size = cfg.io.stripe_size;
  zo.timeout_s = cfg.parallel.timeout;
  zo.overlap_optimizer = cfg.offload.overlap_optimizer;
  return zo;
}

ZeroEngine::Impl::Impl(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute,
                       Stream& comm, Stream& reduce, const ZeroOptions& options, Communicator* tp,
                       Communicator* pp)
    : model_(model), device_(device), dp_(dp), tp_(tp), pp_(pp), dp_reduce_(dp.split(0, dp.rank())),
      compute_(compute), comm_(comm), reduce_(reduce), opt_(options),
      grads_tier_(options.placement.grads_tier()) {
  dp_reduce_->set_name(dp.name() + " (reductions)");
  if (opt_.test_hooks) adam_isa_ = opt_.test_hooks->adam_isa;
  STRATA_CHECK(model.unit(0).layout.dp() == dp.size(), "zero::init", "layouts finalized for dp=",
               model.unit(0).layout.dp(), " but the data-parallel group has ", dp.size(), " ranks");
  if (place_.nvme_grads() && place_.grad_accum != 1)
    fail("zero::init",
         str("gradients on NVMe with ", place_.grad_accum, " micro-batches a step (each would "
             "read the gradient back and write it again)"),
         "set offload.grads = host, or train.grad_accum = 1");
  const bool host_ok = device.host_addressable();
  if (!host_ok && place_.optimizer == Tier::device && place_.params != Tier::device)
    fail("zero::init",
         str("offload.params = ", tier_name(place_.params), " with offload.optimizer = device: the "
             "device's AdamW would write the compute copy into memory it cannot address"),
         "offload the optimizer states too (offload.optimizer = host or nvme): they are 12 of the "
         "16 bytes per parameter, the compute copy only 2 or 4");
  const bool bf16 = place_.compute == DType::bf16;
  const size_t esz = param_elem_bytes();
  const size_t ssz = place_.state_elem_bytes();  // m and v: 4 (f32) or 2 (bf16)
  STRATA_CHECK(place_.state == DType::f32 || place_.state == DType::bf16, "zero::init",
               "AdamW states in ", dtype_name(place_.state), " (f32 or bf16 only)");

  // ---- the NVMe tier: swap space, its FileIO and the swapper thread ----
  const bool nvme_params = place_.nvme_params();
  const bool nvme_opt = place_.optimizer == Tier::nvme;
  // offload.optimizer_host_bytes: these first units' states live in host memory, not on NVMe.
  const int opt_host_units = optimizer_host_units(model, place_);
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
    for (int ui = 0; ui < model.num_units(); ++ui) {
      const uint64_t n = model.unit(ui).layout.shard_numel();
      if (nvme_opt && ui >= opt_host_units) need += n * place_.optimizer_state_bytes();
      if (place_.nvme_grads() && ui >= opt_host_units) need += n * 4;
      if (nvme_params && !param_is_master()) need += n * esz;
    }
    IoOptions io;
    io.backend = opt_.io_backend;
    io.queue_depth = opt_.io_queue_depth;
    io.block_size = opt_.io_block_size;
    io.submit_batch = opt_.io_submit_batch;
    io.name = "nvme";
    io_ = make_file_io_with_faults(io, opt_.nvme_path,
                                   opt_.test_hooks ? &opt_.test_hooks->io_faults : nullptr);
    SwapSpaceOptions so;
    so.dirs = opt_.nvme_path;
    so.capacity_bytes = nvme_swap_bytes(model, need, opt_.nvme_path.size(), opt_.io_stripe_size);
    so.stripe_bytes = opt_.io_stripe_size;
    so.name = str("rank", opt_.world_rank >= 0 ? opt_.world_rank : dp.rank());
    swap_ = std::make_unique<SwapSpace>(*io_, so);
    swapper_ = std::make_unique<Swapper>(*io_, opt_.timeout_s);
  }

  // ---- shards ----
  units_.resize(static_cast<size_t>(model.num_units()));
  grad_accumulated_.assign(static_cast<size_t>(model.num_units()), 0);
  grad_written_.assign(static_cast<size_t>(model.num_units()), 0);
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
    const Tier opt_tier = u < opt_host_units ? Tier::host : place_.optimizer;
    // An f32 master that is also the compute copy is pinned like any compute copy in host
    // memory: the gathers copy from it.
    place(s.master, opt_tier, n * 4, k + "master", "master weights shard", param_is_master());
    place(s.m, opt_tier, n * ssz, k + "m", "AdamW m shard", false);
    place(s.v, opt_tier, n * ssz, k + "v", "AdamW v shard", false);
    // Gradients on NVMe: but the first units', whose states stay in host memory.
    const Tier grad_tier =
        grads_tier_ == Tier::nvme && u < opt_host_units ? Tier::host : grads_tier_;
    place(s.grad, grad_tier, n * 4, k + "grad", "gradient shard", true);
    if (!param_is_master())
      place(s.param, place_.params, n * esz, k + "param", bf16 ? "bf16 parameter shard" : "f32 parameter shard", true);
  }

  // ---- slots, sized per unit kind ----
  const size_t shard = max_shard(model);
  auto make_slots = [&](std::vector<Slot>& pool, const std::vector<SlotClass>& classes, bool params) {
    for (const SlotClass& c : classes)
      for (int i = 0; i < c.slots; ++i) {
        Slot& sl = pool.emplace_back();
        sl.numel = c.numel;
        sl.kinds = c.kinds;
        sl.full = device.alloc(c.numel * 4, params ? "gathered parameters" : "full gradient");
        if (params && bf16) sl.full16 = device.alloc(c.numel * 2, "gathered bf16 parameters");
        if (params && place_.param_shard_staged(dp.size(), host_ok))
          sl.shard = device.alloc(c.numel / size_t(dp.size()) * esz, "staged parameter shard");
        sl.ready = device.make_event();
        sl.free = device.make_event();
      }
  };
  if (!direct_params()) {
    param_slot_limit_ = place_.param_slots(model.num_units());
    make_slots(param_slots_, param_slot_classes(model, place_), true);
  }
  if (!aliased_grads()) {
    grad_slot_limit_ = place_.grad_slots();
    make_slots(grad_slots_, grad_slot_classes(model, place_), false);
    if (dp.size() > 1) reduce_tmp_ = device.alloc(shard * 4, "reduce-scatter result");
    if (grads_tier_ == Tier::host && !host_ok)
      grad_stage_ = device.alloc_host(shard * 4, true, "gradient staging");
  }
  // The CPU AdamW refreshes a device-resident compute copy through pinned staging when the host
  // cannot address device memory.
  if (!host_ok && place_.optimizer != Tier::device && place_.params == Tier::device && !param_is_master()) {
    param_stage_ = device.alloc_host(shard * esz, true, "compute copy staging");
    step_stream_ = device.make_stream("optimizer copy");
  }
  size_t n_ranges = 0;
  for (int u = 0; u < model.num_units(); ++u) {
    const FlatLayout& L = model.unit(u).layout;
    norm_first_.push_back(n_ranges);
    norm_ranges_.push_back(norm_ranges(L, size_t(dp.rank()) * L.shard_numel(), L.shard_numel()));
    n_ranges += norm_ranges_.back().size();
  }
  if (overlapped_step()) {  // what an unclipped step's updates during the backward need
    for (int u = 0; u < model.num_units(); ++u) final_events_.push_back(device.make_event());
    norm_stream_ = device.make_stream("optimizer norm");
  }
  n_ranges = std::max(n_ranges, units_.size());
  norm_parts_ = device.alloc(n_ranges * 8, "gradient norm partial sums");
  norm_host_ = device.alloc_host(n_ranges * 8, true, "gradient norm partial sums");

  // ---- pinned staging pools (budget offload.pinned_mem_limit) ----
  const PinnedStaging staging =
      pinned_staging(model, place_, opt_.pinned_mem_limit, opt_.nvme_prefetch);
  const uint64_t chunk_bytes = staging.chunk_bytes;
  if (staging.read_ahead_below_chunk)
    fail("zero::init",
         str("offload.optimizer_read_ahead = ", format_bytes(place_.optimizer_read_ahead),
             " holds no whole chunk of the optimizer states (",
             place_.read_ahead_buffers_per_chunk(), " x ", format_bytes(chunk_bytes), ")"),
         "raise it, or set 0 to read only the pipeline's next chunk ahead");
  if (opt_.pinned_mem_limit && opt_.pinned_mem_limit < staging.minimum()) {
    std::string parts;
    if (staging.chunk_buffers)
      parts = str(staging.chunk_buffers, " optimizer chunks of ", format_bytes(chunk_bytes));
    if (staging.ahead_buffers)
      parts += str(" + ", staging.ahead_buffers, " read ahead (offload.optimizer_read_ahead)");
    if (staging.grad_shards)
      parts += str(" + ", staging.grad_shards, " gradient shards of ",
                   format_bytes(staging.grad_shard_bytes), " (offload.grads = nvme)");
    if (staging.param_shards)
      parts += str(" + one parameter shard of ", format_bytes(staging.param_shard_bytes));
    fail("zero::init",
         str("offload.pinned_mem_limit = ", format_bytes(opt_.pinned_mem_limit),
             " is too small: NVMe staging needs at least ", format_bytes(staging.minimum()), " (",
             parts, ")"),
         str("raise offload.pinned_mem_limit (0 sizes it as needed) or lower offload.",
             staging.ahead_buffers ? "optimizer_read_ahead" : "optimizer_chunk"));
  }
  // Each pool holds exactly the buffers counted above (budget 0: min_buffers of them).
  if (staging.chunk_buffers)
    chunk_pool_ = std::make_unique<PinnedPool>(device, 0, chunk_bytes, staging.chunk_buffers,
                                               "optimizer chunk", opt_.timeout_s);
  if (staging.ahead_buffers)
    ahead_pool_ = std::make_unique<PinnedPool>(device, 0, chunk_bytes, staging.ahead_buffers,
                                               "optimizer read-ahead", opt_.timeout_s);
  if (staging.param_shards)
    param_pool_ = std::make_unique<PinnedPool>(device, 0, staging.param_shard_bytes,
                                               staging.param_shards, "parameter", opt_.timeout_s);
  if (staging.forward_shards) {
    forward_.pool = std::make_unique<PinnedPool>(device, 0, staging.forward_shard_bytes,
                                                 staging.forward_shards, "forwarded compute copy",
                                                 opt_.timeout_s);
    forward_.of_unit.resize(size_t(model.num_units()));
  }
  if (staging.grad_shards) {
    grad_pool_ = std::make_unique<PinnedPool>(device, 0, staging.grad_shard_bytes,
                                              staging.grad_shards, "gradient", opt_.timeout_s);
    for (int u = 0; u < model.num_units(); ++u) grad_events_.push_back(device.make_event());
  }
  // The pools feed the NVMe queue: register them with it once (io_uring fixed buffers). The
  // swapper unregisters them when it stops, before the pools are freed (members' order).
  if (swapper_) {
    std::vector<std::span<std::byte>> staging;
    for (const PinnedPool* pool :
         {chunk_pool_.get(), ahead_pool_.get(), param_pool_.get(), forward_.pool.get(),
          grad_pool_.get()})
      if (pool) staging.push_back(pool->memory());
    if (!staging.empty()) swapper_->register_buffers(staging);
  }

  // ---- zeroed state ----
  std::vector<char> zeros;
  for (int u = 0; u < model.num_units(); ++u) {
    Unit& s = units_[size_t(u)];
    for (Shard* sh : {&s.m, &s.v, &s.grad}) {
      if (sh == &s.grad && sh->tier == Tier::nvme) continue;  // zero until written (grad_written_)
      if (sh->tier == Tier::device) compute.fill_zero(sh->mem.data(), sh->bytes);
      else if (sh->tier == Tier::host) std::memset(sh->mem.data(), 0, sh->bytes);
      else {
        const size_t bytes = sh->bytes;  // n elements of m or v (f32 or bf16; zero bits are 0.0)
        zeros.assign(std::min<size_t>(bytes, chunk_bytes), 0);
        Buffer z = device.alloc_host(zeros.size(), true, "zero staging");
        std::memset(z.data(), 0, z.bytes());
        std::vector<IoRequest> reqs;
        for (size_t off = 0; off < bytes; off += z.bytes())
          reqs.push_back(swap_->request(IoOp::write, sh->key, z.data(), std::min<size_t>(z.bytes(), bytes - off), off));
        swapper_->wait(swapper_->submit(std::move(reqs)));
      }
    }
  }
  compute.synchronize();
}

ZeroEngine::Impl::~Impl() {
  // An optimizer step in flight first: it uses the swapper, the pools and the streams.
  try {
    finish_step();
  } catch (const std::exception& e) {
    log_warn("zero", "error of the optimizer step in flight at shutdown: ", e.what());
  }
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
bool ZeroEngine::Impl::aliased_grads() const {
  return place_.aliased_grads(dp_.size(), device_.host_addressable());
}

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
  // A compute copy kept from the last update is no longer the unit's (no device work reads a
  // kept buffer: a gather takes it out first).
  forward_.release(forward_.take(int(&s - units_.data())), nullptr);
  if (param_is_master()) return;
  if (place_.compute == DType::bf16) {
    std::vector<uint16_t> b(count);
    convert_f32_to_bf16(values, b.data(), count);
    write_shard(s.param, 2, begin, count, b.data());
  } else {
    write_shard(s.param, 4, begin, count, values);
  }
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
  for (const auto* pool :
       {param_pool_.get(), chunk_pool_.get(), ahead_pool_.get(), forward_.pool.get(),
        grad_pool_.get()})
    if (pool) {
      m.pinned_bytes += pool->bytes();
      m.staging_bytes += uint64_t(pool->count()) * pool->buffer_bytes();
    }
  if (param_pool_) m.param_staging_shards = param_pool_->count();
  if (forward_.pool) m.forward_shards = forward_.pool->count();
  return m;
}

ZeroTraffic ZeroEngine::Impl::take_traffic() {
  ZeroTraffic t = traffic_;
  traffic_ = ZeroTraffic{};
  t.h2d_bytes += step_h2d_bytes_.exchange(0);
  t.update_wait_ms = std::exchange(update_wait_ms_, 0.0);
  t.read_ahead_bytes = read_ahead_bytes_.exchange(0);
  if (swapper_) {
    SwapperStats s = swapper_->take_stats();
    t.nvme_read_bytes = s.read_bytes;
    t.nvme_write_bytes = s.write_bytes;
    t.nvme_busy_ms = s.busy_ms;
    t.nvme_wait_ms = s.wait_ms;
  }
  return t;
}

// ---- engine/zero.h: the public calls of this file, forwarded to Impl ----------------------------

ZeroEngine::ZeroEngine(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute,
                       Stream& comm, Stream& reduce, const ZeroOptions& options, Communicator* tp,
                       Communicator* pp)
    : impl_(std::make_unique<Impl>(model, device, dp, compute, comm, reduce, options, tp, pp)) {}
ZeroEngine::~ZeroEngine() = default;
ZeroMemory ZeroEngine::memory() const { return impl_->memory(); }
ZeroTraffic ZeroEngine::take_traffic() { return impl_->take_traffic(); }
int ZeroEngine::dp_size() const { return impl_->dp_.size(); }

}  // namespace strata
