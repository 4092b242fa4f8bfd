// engine/zero.cpp — shards, gather/reduce slots and the optimizer step of the ZeRO-3 engine.
#include "engine/zero.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "engine/safetensors.h"
#include "kernels/ops.h"

namespace strata {

struct ZeroEngine::Unit {
  Buffer master;  // (shard) f32 — in fp32 also the compute copy
  Buffer m, v;    // (shard) f32
  Buffer grad;    // (shard) f32, accumulated over micro-batches
  Buffer param16; // (shard) bf16 compute copy, bf16 precision only
  int slot = -1;       // parameter slot holding the gathered unit, -1 when not gathered
  int grad_slot = -1;  // gradient slot during backward
};

struct ZeroEngine::Slot {
  Buffer full;     // (padded_numel) f32: gathered parameters or a full gradient
  Buffer full16;   // (padded_numel) bf16: gathered compute copy before the cast (bf16 only)
  std::unique_ptr<Event> ready;  // the gather (or the backward) into `full` has completed
  std::unique_ptr<Event> free;   // the last reader of `full` has completed
  int owner = -1;  // unit held, -1 when free
};

namespace {
size_t max_padded(const LlamaModel& m) {
  size_t n = 0;
  for (const auto& u : m.units()) n = std::max(n, u.layout.padded_numel());
  return n;
}
}  // namespace

ZeroEngine::ZeroEngine(const LlamaModel& model, Device& device, Communicator& dp, Stream& compute,
                       Stream& comm, const ZeroOptions& options)
    : model_(model), device_(device), dp_(dp), compute_(compute), comm_(comm), opt_(options) {
  STRATA_CHECK(model.unit(0).layout.dp() == dp.size(), "zero::init", "layouts finalized for dp=",
               model.unit(0).layout.dp(), " but the data-parallel group has ", dp.size(), " ranks");
  const bool bf16 = opt_.precision == Precision::bf16;
  units_.resize(static_cast<size_t>(model.num_units()));
  for (int u = 0; u < model.num_units(); ++u) {
    Unit& s = units_[size_t(u)];
    size_t n = model.unit(u).layout.shard_numel();
    s.master = device.alloc(n * 4, "master weights shard");
    s.m = device.alloc(n * 4, "AdamW m shard");
    s.v = device.alloc(n * 4, "AdamW v shard");
    s.grad = device.alloc(n * 4, "gradient shard");
    if (bf16) s.param16 = device.alloc(n * 2, "bf16 parameter shard");
    compute.fill_zero(s.m.data(), n * 4);
    compute.fill_zero(s.v.data(), n * 4);
    compute.fill_zero(s.grad.data(), n * 4);
  }
  size_t full = max_padded(model);
  if (!aliased_params()) {
    int n_slots = opt_.prefetch + 1 + (opt_.keep_embedding ? 1 : 0);
    param_slots_.resize(size_t(n_slots));
    for (auto& sl : param_slots_) {
      sl.full = device.alloc(full * 4, "gathered parameters");
      if (bf16) sl.full16 = device.alloc(full * 2, "gathered bf16 parameters");
      sl.ready = device.make_event();
      sl.free = device.make_event();
    }
  }
  if (!aliased_grads()) {
    int n_slots = 2 + (opt_.keep_embedding ? 1 : 0);
    grad_slots_.resize(size_t(n_slots));
    for (auto& sl : grad_slots_) {
      sl.full = device.alloc(full * 4, "full gradient");
      sl.ready = device.make_event();
      sl.free = device.make_event();
    }
    size_t shard = 0;
    for (const auto& u : model.units()) shard = std::max(shard, u.layout.shard_numel());
    reduce_tmp_ = device.alloc(shard * 4, "reduce-scatter result");
  }
  norm_parts_ = device.alloc(units_.size() * 8, "gradient norm partial sums");
  norm_host_ = device.alloc_host(units_.size() * 8, true, "gradient norm partial sums");
}

ZeroEngine::~ZeroEngine() {
  try {
    compute_.synchronize();
    comm_.synchronize();
  } catch (const std::exception& e) {
    log_warn("zero", "error while draining streams at shutdown: ", e.what());
  }
}

bool ZeroEngine::aliased_params() const {
  return dp_.size() == 1 && opt_.precision == Precision::fp32;
}
bool ZeroEngine::aliased_grads() const { return dp_.size() == 1; }

// ---- initialization -------------------------------------------------------------------------

void ZeroEngine::init_from_seed(uint64_t seed) {
  const int rank = dp_.rank();
  for (int u = 0; u < model_.num_units(); ++u) {
    const FlatLayout& L = model_.unit(u).layout;
    size_t n = L.shard_numel();
    Buffer host = device_.alloc_host(n * 4, true, "initialization staging");
    model_.init_values(u, seed, size_t(rank) * n, n, host.as<float>());
    compute_.copy(units_[size_t(u)].master.data(), host.data(), n * 4);
    compute_.synchronize();  // the staging buffer is reused/freed next
  }
  if (opt_.precision == Precision::bf16) {
    for (int u = 0; u < model_.num_units(); ++u) {
      Unit& s = units_[size_t(u)];
      device_.ops().cast_f32_to_bf16(compute_, s.param16.as<uint16_t>(), s.master.as<float>(),
                                     model_.unit(u).layout.shard_numel());
    }
    compute_.synchronize();
  }
}

void ZeroEngine::init_from(const SafetensorsReader& reader) {
  const int rank = dp_.rank();
  for (int u = 0; u < model_.num_units(); ++u) {
    const FlatLayout& L = model_.unit(u).layout;
    size_t n = L.shard_numel(), begin = size_t(rank) * n, end = begin + n;
    Buffer host = device_.alloc_host(n * 4, true, "checkpoint staging");
    float* h = host.as<float>();
    std::memset(h, 0, n * 4);
    for (const auto& v : L.views()) {
      size_t b = std::max(begin, v.offset), e = std::min(end, v.offset + v.numel);
      if (b >= e) continue;
      const TensorInfo& info = reader.info(v.name);
      if (info.shape != v.shape) {
        std::string want, got;
        for (auto d : v.shape) want += str(want.empty() ? "" : ", ", d);
        for (auto d : info.shape) got += str(got.empty() ? "" : ", ", d);
        fail("zero::init_from", str("tensor '", v.name, "' has shape [", got, "] but the model needs [",
                                    want, "]"),
             "the checkpoint's config.json and tensors disagree, or the file is from another model");
      }
      reader.read_f32(v.name, h + (b - begin), int64_t(b - v.offset), int64_t(e - b));
    }
    compute_.copy(units_[size_t(u)].master.data(), h, n * 4);
    compute_.synchronize();
  }
  if (opt_.precision == Precision::bf16) {
    for (int u = 0; u < model_.num_units(); ++u) {
      Unit& s = units_[size_t(u)];
      device_.ops().cast_f32_to_bf16(compute_, s.param16.as<uint16_t>(), s.master.as<float>(),
                                     model_.unit(u).layout.shard_numel());
    }
    compute_.synchronize();
  }
}

// ---- gather / release -----------------------------------------------------------------------

ZeroEngine::Slot& ZeroEngine::take_slot(std::vector<Slot>& pool, int u, const char* what) {
  for (auto& sl : pool) {
    if (sl.owner < 0) {
      sl.owner = u;
      return sl;
    }
  }
  fail("zero::schedule", str("no free ", what, " slot for unit ", model_.unit(u).name, " (",
                             pool.size(), " slots all held)"),
       "this is a scheduling bug: more units acquired or prefetched than the pool allows");
}

void ZeroEngine::prefetch(int u) {
  if (aliased_params() || u < 0 || u >= model_.num_units()) return;
  Unit& s = units_[size_t(u)];
  if (s.slot >= 0) return;
  Slot& sl = take_slot(param_slots_, u, "parameter");
  s.slot = int(&sl - param_slots_.data());
  const FlatLayout& L = model_.unit(u).layout;
  comm_.wait(*sl.free);  // the previous occupant's readers are done
  comm_bytes_ += L.padded_numel() * (opt_.precision == Precision::bf16 ? 2 : 4);
  if (opt_.precision == Precision::bf16) {
    dp_.all_gather(comm_, sl.full16.data(), s.param16.data(), L.shard_numel(), CommType::bf16);
    device_.ops().cast_bf16_to_f32(comm_, sl.full.as<float>(), sl.full16.as<uint16_t>(),
                                   L.padded_numel());
  } else {
    dp_.all_gather(comm_, sl.full.data(), s.master.data(), L.shard_numel(), CommType::f32);
  }
  comm_.record(*sl.ready);
}

const float* ZeroEngine::acquire(int u) {
  Unit& s = units_[size_t(u)];
  if (aliased_params()) return s.master.as<float>();
  if (s.slot < 0) prefetch(u);
  Slot& sl = param_slots_[size_t(s.slot)];
  compute_.wait(*sl.ready);
  return sl.full.as<float>();
}

void ZeroEngine::release(int u) {
  if (aliased_params()) return;
  Unit& s = units_[size_t(u)];
  if (s.slot < 0) return;
  Slot& sl = param_slots_[size_t(s.slot)];
  compute_.record(*sl.free);
  sl.owner = -1;
  s.slot = -1;
}

float* ZeroEngine::acquire_grad(int u) {
  Unit& s = units_[size_t(u)];
  if (aliased_grads()) return s.grad.as<float>();  // one rank: accumulate into the shard itself
  if (s.grad_slot >= 0) return grad_slots_[size_t(s.grad_slot)].full.as<float>();
  Slot& sl = take_slot(grad_slots_, u, "gradient");
  s.grad_slot = int(&sl - grad_slots_.data());
  compute_.wait(*sl.free);  // the previous reduce-scatter out of this slot has completed
  compute_.fill_zero(sl.full.data(), model_.unit(u).layout.padded_numel() * 4);
  return sl.full.as<float>();
}

void ZeroEngine::reduce_grad(int u) {
  if (aliased_grads()) return;
  Unit& s = units_[size_t(u)];
  STRATA_CHECK(s.grad_slot >= 0, "zero::reduce_grad", "unit ", u, " has no gradient slot");
  Slot& sl = grad_slots_[size_t(s.grad_slot)];
  const FlatLayout& L = model_.unit(u).layout;
  compute_.record(*sl.ready);
  comm_.wait(*sl.ready);
  dp_.reduce_scatter(comm_, reduce_tmp_.data(), sl.full.data(), L.shard_numel(), CommType::f32,
                     ReduceOp::sum);
  comm_bytes_ += L.padded_numel() * 4;
  device_.ops().add(comm_, s.grad.as<float>(), s.grad.as<float>(), reduce_tmp_.as<float>(),
                    L.shard_numel());
  comm_.record(*sl.free);
  sl.owner = -1;
  s.grad_slot = -1;
}

// ---- the step -------------------------------------------------------------------------------

double ZeroEngine::grad_norm() {
  compute_.synchronize();
  comm_.synchronize();
  Ops& ops = device_.ops();
  double* parts = norm_parts_.as<double>();
  for (int u = 0; u < model_.num_units(); ++u)
    ops.sum_squares(compute_, parts + u, units_[size_t(u)].grad.as<float>(),
                    model_.unit(u).layout.shard_numel());
  compute_.copy(norm_host_.data(), parts, units_.size() * 8);
  compute_.synchronize();
  double local = 0;
  for (size_t u = 0; u < units_.size(); ++u) local += norm_host_.as<double>()[u];
  double* h = norm_host_.as<double>();
  h[0] = local;
  if (dp_.size() > 1) {
    dp_.all_reduce(comm_, h, 1, CommType::f64, ReduceOp::sum);
    comm_.synchronize();
  }
  return std::sqrt(h[0]);
}

void ZeroEngine::optimizer_step(const AdamWHyper& hyper, int64_t step, float grad_scale,
                                bool decay_norms) {
  compute_.synchronize();
  comm_.synchronize();
  STRATA_CHECK(device_.kind() == DeviceKind::cpu, "zero::optimizer_step",
               "device-resident optimizer states need the device's AdamW kernel");
  const int rank = dp_.rank();
  const bool bf16 = opt_.precision == Precision::bf16;
  for (int u = 0; u < model_.num_units(); ++u) {
    Unit& s = units_[size_t(u)];
    const FlatLayout& L = model_.unit(u).layout;
    const size_t n = L.shard_numel(), begin = size_t(rank) * n, end = begin + n;
    // Split the shard at view boundaries so norm weights can skip weight decay; padding is
    // stepped with the preceding view (it stays zero: zero gradient, zero state).
    size_t pos = begin;
    for (size_t vi = 0; vi < L.views().size() && pos < end; ++vi) {
      const ParamView& v = L.views()[vi];
      size_t seg_end = (vi + 1 < L.views().size()) ? std::min(end, L.views()[vi + 1].offset) : end;
      if (seg_end <= pos) continue;
      AdamWHyper h = hyper;
      if (v.is_norm && !decay_norms) h.weight_decay = 0.0f;
      size_t o = pos - begin, cnt = seg_end - pos;
      AdamWTensors t;
      t.param = s.master.as<float>() + o;
      t.grad = s.grad.as<float>() + o;
      t.m = s.m.as<float>() + o;
      t.v = s.v.as<float>() + o;
      t.param_bf16 = bf16 ? s.param16.as<uint16_t>() + o : nullptr;
      t.n = cnt;
      if (opt_.adam_isa) adamw_update_isa(*opt_.adam_isa, h, step, grad_scale, t);
      else adamw_update(h, step, grad_scale, t);
      pos = seg_end;
    }
  }
}

void ZeroEngine::zero_grads() {
  for (int u = 0; u < model_.num_units(); ++u)
    compute_.fill_zero(units_[size_t(u)].grad.data(), model_.unit(u).layout.shard_numel() * 4);
}

void ZeroEngine::set_values(int u, size_t offset, const std::vector<float>& values) {
  compute_.synchronize();
  comm_.synchronize();
  Unit& s = units_[size_t(u)];
  const size_t n = model_.unit(u).layout.shard_numel(), begin = size_t(dp_.rank()) * n;
  size_t b = std::max(begin, offset), e = std::min(begin + n, offset + values.size());
  if (b >= e) return;
  compute_.copy(s.master.as<float>() + (b - begin), values.data() + (b - offset), (e - b) * 4);
  if (opt_.precision == Precision::bf16)
    device_.ops().cast_f32_to_bf16(compute_, s.param16.as<uint16_t>() + (b - begin),
                                   s.master.as<float>() + (b - begin), e - b);
  compute_.synchronize();
}

// ---- export ---------------------------------------------------------------------------------

std::vector<float> ZeroEngine::gather_unit_to_host(int u) {
  return gather_to_host(u, units_[size_t(u)].master);
}

std::vector<float> ZeroEngine::gather_grad_to_host(int u) {
  return gather_to_host(u, units_[size_t(u)].grad);
}

std::vector<float> ZeroEngine::gather_to_host(int u, const Buffer& shard) {
  const FlatLayout& L = model_.unit(u).layout;
  Buffer full = device_.alloc(L.padded_numel() * 4, "export gather");
  compute_.synchronize();
  comm_.synchronize();
  dp_.all_gather(comm_, full.data(), shard.data(), L.shard_numel(), CommType::f32);
  std::vector<float> out(L.padded_numel());
  comm_.copy(out.data(), full.data(), L.padded_numel() * 4);
  comm_.synchronize();
  out.resize(L.numel());
  return out;
}

void ZeroEngine::save(const std::string& dir, DType dtype) {
  std::vector<TensorInfo> infos;
  StDType st = dtype == DType::bf16 ? StDType::bf16 : dtype == DType::f16 ? StDType::f16 : StDType::f32;
  for (const auto& unit : model_.units())
    for (const auto& v : unit.layout.views()) infos.push_back(TensorInfo{v.name, st, v.shape});
  std::unique_ptr<SafetensorsWriter> writer;
  if (dp_.rank() == 0) {
    write_hf_config(dir, model_.config(), dtype);
    writer = std::make_unique<SafetensorsWriter>(dir + "/model.safetensors", infos,
                                                 std::map<std::string, std::string>{{"format", "pt"}});
  }
  for (int u = 0; u < model_.num_units(); ++u) {
    std::vector<float> values = gather_unit_to_host(u);  // every rank takes part
    if (!writer) continue;
    for (const auto& v : model_.unit(u).layout.views())
      writer->write_f32(v.name, values.data() + v.offset, int64_t(v.numel));
  }
  if (writer) writer->finish();
}

uint64_t ZeroEngine::take_comm_bytes() {
  uint64_t b = comm_bytes_;
  comm_bytes_ = 0;
  return b;
}

ZeroMemory ZeroEngine::memory() const {
  ZeroMemory m;
  for (const auto& s : units_)
    m.shard_bytes += s.master.bytes() + s.m.bytes() + s.v.bytes() + s.grad.bytes() + s.param16.bytes();
  for (const auto& sl : param_slots_) m.gathered_bytes += sl.full.bytes() + sl.full16.bytes();
  for (const auto& sl : grad_slots_) m.gathered_bytes += sl.full.bytes();
  return m;
}

}  // namespace strata
