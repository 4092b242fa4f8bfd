// engine/zero_weights.cpp — values in and out of the ZeRO engine's shards: initialization from
// the seed or from Hugging Face safetensors (each rank reads only its own slice), a unit's
// values or gradients gathered to the host, overwriting parameters, and writing the model as
// Hugging Face safetensors + config.json (whole tensors assembled over tp; rank 0 writes).
//
// Checkpoints (master, m and v of any mesh) are engine/zero_checkpoint.cpp; this file touches
// only master weights, the compute copy and (read-only) gradients.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/size.h"
#include "engine/safetensors.h"
#include "engine/tensor_parallel.h"
#include "engine/zero_state.h"

namespace strata {

void ZeroEngine::Impl::init_from_seed(uint64_t seed) {
  finish_step();  // writes states: no optimizer step may be in flight
  const int rank = dp_.rank();
  for (int u = 0; u < model_.num_units(); ++u) {
    const size_t n = model_.unit(u).layout.shard_numel();
    std::vector<float> values(n);
    model_.init_values(u, seed, size_t(rank) * n, n, values.data());
    write_master_values(units_[size_t(u)], 0, n, values.data());
  }
}

void ZeroEngine::Impl::init_from(const SafetensorsReader& reader) {
  finish_step();  // writes states: no optimizer step may be in flight
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
      // A NaN or an infinity would be reported as the run diverging, with the wrong hint.
      const auto first = h.begin() + ptrdiff_t(b - begin), last = h.begin() + ptrdiff_t(e - begin);
      const auto bad = std::find_if(first, last, [](float x) { return !std::isfinite(x); });
      if (bad != last)
        fail("zero::init_from",
             str("tensor '", v.name, "' holds ", *bad, " (element ",
                 v.global_index(size_t(bad - h.begin()) + begin - v.offset), ")"),
             "the weights are damaged or overflowed when they were written (f16?): use another "
             "copy of them");
    }
    write_master_values(units_[size_t(u)], 0, n, h.data());
  }
}

std::vector<float> ZeroEngine::Impl::gather_unit_to_host(int u) {
  return gather_to_host(u, false);
}
std::vector<float> ZeroEngine::Impl::gather_grad_to_host(int u) {
  return gather_to_host(u, true);
}

std::vector<float> ZeroEngine::Impl::gather_to_host(int u, bool grads) {
  settle_step();  // reads what an overlapped optimizer step writes
  const FlatLayout& L = model_.unit(u).layout;
  const size_t n = L.shard_numel();
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  std::vector<float> mine(n);
  const Unit& s = units_[size_t(u)];
  // (A gradient on NVMe not written this step, or consumed by an update, is zero.)
  if (!grads || s.grad.tier != Tier::nvme || grad_written_[size_t(u)])
    read_shard(grads ? s.grad : s.master, 4, 0, n, mine.data());
  Buffer shard = device_.alloc(n * 4, "export staging");
  Buffer full = device_.alloc(L.padded_numel() * 4, "export gather");
  comm_.copy(shard.data(), mine.data(), n * 4);
  dp_.all_gather(comm_, full.data(), shard.data(), n, CommType::f32);
  // The gather is waited for here, under the watchdog: on a CUDA device a copy into pageable
  // memory blocks the host until the stream reaches it, where no watched wait would cover a peer
  // that never joins the gather.
  comm_.synchronize();
  std::vector<float> out(L.padded_numel());
  comm_.copy(out.data(), full.data(), L.padded_numel() * 4);
  comm_.synchronize();
  out.resize(L.numel());
  return out;
}

void ZeroEngine::Impl::set_values(int u, size_t offset, const std::vector<float>& values) {
  finish_step();  // writes states: no optimizer step may be in flight
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

void ZeroEngine::Impl::save(const std::string& dir, DType dtype, const std::string& file, bool config) {
  settle_step();  // reads what an overlapped optimizer step writes
  std::vector<TensorInfo> infos;
  StDType st = dtype == DType::bf16 ? StDType::bf16 : dtype == DType::f16 ? StDType::f16 : StDType::f32;
  for (const auto& unit : model_.units())
    for (const auto& v : unit.layout.views()) infos.push_back(TensorInfo{v.name, st, v.global_shape});
  std::unique_ptr<SafetensorsWriter> writer;
  const bool writes = dp_.rank() == 0 && (!tp_ || tp_->rank() == 0);
  if (writes) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail("zero::save", str("cannot create '", dir, "': ", ec.message()));
    writer = std::make_unique<SafetensorsWriter>(dir + "/" + file, infos,
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
  if (writer) {
    writer->finish();
    // config.json last: a folder that has one holds whole weights (a save cut short, none).
    if (config) write_hf_config(dir, model_.config(), dtype);
  }
  dp_.barrier(comm_);  // when save returns on any rank, the files are in place
  if (tp_) tp_->barrier(comm_);
  comm_.synchronize();
}

// ---- engine/zero.h: the public calls of this file, forwarded to Impl ----------------------------

void ZeroEngine::init_from_seed(uint64_t seed) { impl_->init_from_seed(seed); }
void ZeroEngine::init_from(const SafetensorsReader& reader) { impl_->init_from(reader); }
std::vector<float> ZeroEngine::gather_unit_to_host(int u) { return impl_->gather_unit_to_host(u); }
std::vector<float> ZeroEngine::gather_grad_to_host(int u) { return impl_->gather_grad_to_host(u); }
void ZeroEngine::set_values(int u, size_t offset, const std::vector<float>& values) {
  impl_->set_values(u, offset, values);
}
void ZeroEngine::save(const std::string& dir, DType dtype, const std::string& file, bool config) {
  impl_->save(dir, dtype, file, config);
}

}  // namespace strata
