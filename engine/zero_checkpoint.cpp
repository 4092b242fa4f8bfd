// engine/zero_checkpoint.cpp — the ZeRO engine's side of checkpoints: the blocks a save reads
// (from memory, a snapshot or NVMe) and loading a checkpoint of any mesh into this rank's shards
// (its tensor-parallel slice of each tensor, read in global coordinates).
//
// The format, the commit protocol and the writer thread are engine/checkpoint.h and
// checkpoint_writer.h; this file neither writes files nor hashes.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "engine/checkpoint.h"
#include "engine/zero_state.h"
#include "offload/swap_space.h"
#include "offload/swapper.h"

namespace strata {

ZeroEngine::Impl::Shard& ZeroEngine::Impl::Source::state(const CheckpointBlock& b) {
  STRATA_CHECK(b.unit >= 0 && b.unit < e_.model_.num_units() && b.state >= 0 && b.state < kCheckpointStates,
               "zero::checkpoint", "block of unit ", b.unit, " state ", b.state);
  Unit& s = e_.units_[size_t(b.unit)];
  return b.state == 0 ? s.master : b.state == 1 ? s.m : s.v;
}

const void* ZeroEngine::Impl::Source::block_memory(const CheckpointBlock& b) {
  Shard& sh = state(b);
  STRATA_CHECK(b.bytes() == sh.bytes, "zero::checkpoint", "block of ", b.shard_numel, " elements of ",
               b.elem_bytes, " bytes for a shard of ", sh.bytes, " bytes");
  if (sh.tier == Tier::nvme) return nullptr;
  if (sh.tier == Tier::device && !e_.device_.host_addressable())
    return snapshots_.at(size_t(b.unit) * kCheckpointStates + size_t(b.state)).data();
  return sh.mem.data();
}

uint64_t ZeroEngine::Impl::Source::read_block(const CheckpointBlock& b, uint64_t offset,
                                              void* buffer, uint64_t bytes) {
  Shard& sh = state(b);
  STRATA_CHECK(sh.tier == Tier::nvme, "zero::checkpoint", "read_block of a block in memory");
  return e_.swapper_->submit({e_.swap_->request(IoOp::read, sh.key, buffer, bytes, offset)});
}

void ZeroEngine::Impl::Source::wait_read(uint64_t ticket) { e_.swapper_->wait(ticket); }

void ZeroEngine::Impl::Source::snapshot() {
  if (e_.device_.host_addressable()) return;
  snapshots_.resize(e_.units_.size() * kCheckpointStates);
  for (size_t u = 0; u < e_.units_.size(); ++u) {
    Unit& s = e_.units_[u];
    Shard* states[kCheckpointStates] = {&s.master, &s.m, &s.v};
    for (int k = 0; k < kCheckpointStates; ++k) {
      if (states[k]->tier != Tier::device) continue;
      Buffer& snap = snapshots_[u * kCheckpointStates + size_t(k)];
      if (!snap) snap = e_.device_.alloc_host(states[k]->bytes, true, "checkpoint snapshot");
      e_.compute_.copy(snap.data(), states[k]->mem.data(), states[k]->bytes);
      e_.traffic_.d2h_bytes += states[k]->bytes;
    }
  }
  e_.compute_.synchronize();
}

CheckpointSource& ZeroEngine::Impl::checkpoint_source() {
  settle_step();  // the save reads the step's results
  check_quiescent("a checkpoint save");
  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  if (!checkpoint_source_) checkpoint_source_ = std::make_unique<Source>(*this);
  checkpoint_source_->snapshot();
  return *checkpoint_source_;
}

void ZeroEngine::Impl::load_checkpoint(const std::string& step_dir,
                                       const CheckpointManifest& manifest) {
  finish_step();  // writes states: no optimizer step may be in flight
  // The model's tensors, by name and global shape, are exactly the checkpoint's.
  size_t views = 0;
  CheckpointReader reader(step_dir, manifest);
  for (const auto& unit : model_.units())
    for (const auto& v : unit.layout.views()) {
      ++views;
      const CheckpointTensor& t = reader.tensor(v.name);
      if (t.shape != v.global_shape) {
        std::string want, got;
        for (auto d : v.global_shape) want += str(want.empty() ? "" : ", ", d);
        for (auto d : t.shape) got += str(got.empty() ? "" : ", ", d);
        fail("zero::load_checkpoint",
             str("tensor '", v.name, "' has shape [", got, "] in the checkpoint but the model needs [", want, "]"),
             "resume with the model settings the checkpoint was written with (strata checkpoint inspect)");
      }
    }
  // Other pipeline stages hold the rest of the checkpoint's tensors: count the whole model's.
  views = 0;
  for (const auto& unit : model_.all_units()) views += unit.layout.views().size();
  if (manifest.tensors.size() != views)
    fail("zero::load_checkpoint",
         str("the checkpoint holds ", manifest.tensors.size(), " tensors but the model has ", views),
         "resume with the model settings the checkpoint was written with (strata checkpoint inspect)");

  compute_.synchronize();
  comm_.synchronize();
  reduce_.synchronize();
  // m and v are read as f32 whatever the checkpoint stores (bf16 widens exactly) and stored in
  // this run's dtype: bf16 states round them to nearest even — the identity on bf16 values, so a
  // bf16 checkpoint resumes bit-exactly; f32 states take them as they are.
  const bool bf16_states = place_.state == DType::bf16;
  std::vector<uint16_t> rounded;
  if (manifest.optimizer_state_dtype != place_.state && dp_.rank() == 0)
    log_info("checkpoint", "the checkpoint stores AdamW m and v in ", dtype_name(manifest.optimizer_state_dtype),
             "; this run keeps them in ", dtype_name(place_.state), " (train.optimizer_state_dtype): ",
             bf16_states ? "rounded to nearest even on load" : "widened exactly on load");
  const int rank = dp_.rank();
  // Chunks of 1M elements: a multiple of 2048, so every chunk of an NVMe shard (f32 or bf16)
  // starts and ends on a 4 KiB boundary.
  constexpr size_t kChunk = size_t(1) << 20;
  std::vector<float> values;
  for (int u = 0; u < model_.num_units(); ++u) {
    Unit& s = units_[size_t(u)];
    const FlatLayout& L = model_.unit(u).layout;
    const size_t n = L.shard_numel(), base = size_t(rank) * n;
    Shard* states[kCheckpointStates] = {&s.master, &s.m, &s.v};
    for (int k = 0; k < kCheckpointStates; ++k) {
      for (size_t lo = 0; lo < n; lo += kChunk) {
        const size_t cnt = std::min(kChunk, n - lo);
        values.assign(cnt, 0.0f);  // padding past the last tensor stays zero
        const size_t a = base + lo, b = base + lo + cnt;
        // Each view's local elements [x, y) in global coordinates: one range for a whole view
        // or a row slice, a column slice row by row. Replicas (norm weights, shared kv heads)
        // read the same ranges as their primary.
        for (const auto& v : L.views()) {
          const size_t x = std::max(a, v.offset), y = std::min(b, v.offset + v.numel);
          if (x >= y) continue;
          for (const GlobalRuns& r : v.global_runs(x - v.offset, y - v.offset)) {
            float* dst = values.data() + (v.offset + r.local - a);
            for (size_t i = 0; i < r.rows; ++i)
              reader.read(v.name, k, r.start + i * r.row_stride, r.count, dst + i * r.count);
          }
        }
        if (k == 0) {
          write_master_values(s, lo, cnt, values.data());
        } else if (bf16_states) {
          rounded.resize(cnt);
          convert_f32_to_bf16(values.data(), rounded.data(), cnt);
          write_shard(*states[k], 2, lo, cnt, rounded.data());
        } else {
          write_shard(*states[k], 4, lo, cnt, values.data());
        }
      }
    }
  }
  compute_.synchronize();
}

// ---- engine/zero.h: the public calls of this file, forwarded to Impl ----------------------------

CheckpointSource& ZeroEngine::checkpoint_source() { return impl_->checkpoint_source(); }
void ZeroEngine::load_checkpoint(const std::string& step_dir, const CheckpointManifest& manifest) {
  impl_->load_checkpoint(step_dir, manifest);
}

}  // namespace strata
