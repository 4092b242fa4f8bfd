// engine/flat_param.h — one unit's parameters as one flat buffer with a table of named views.
//
// Views are laid out in the order they are added (Hugging Face names, row-major shapes). The
// flat size is padded to a multiple of dp × kShardAlignElems, so rank r of the data-parallel
// group owns the aligned slice [r·shard, (r+1)·shard). Gradients, master weights, m and v use the
// same layout. A layout holds no memory; the engine pairs it with buffers on the tiers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// Shards start on 2048-element boundaries: 8 KiB in f32, 4 KiB in bf16 (O_DIRECT-aligned).
inline constexpr size_t kShardAlignElems = 2048;

struct ParamView {
  std::string name;            // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // e.g. {n_heads * head_dim, dim}
  size_t offset = 0;           // in elements, from the start of the unit's flat buffer
  size_t numel = 0;
  bool is_norm = false;        // 1-D norm weight (initialized to ones)
};

class FlatLayout {
 public:
  void add(std::string name, std::vector<int64_t> shape, bool is_norm = false);
  void finalize(int dp);  // fixes padding and shard size for `dp` ranks

  const std::vector<ParamView>& views() const { return views_; }
  const ParamView& view(const std::string& name) const;  // Error when absent
  const ParamView* find(const std::string& name) const;
  size_t numel() const { return numel_; }                // sum of the views
  size_t padded_numel() const { return padded_; }        // dp × shard_numel
  size_t shard_numel() const { return shard_; }
  int dp() const { return dp_; }

 private:
  std::vector<ParamView> views_;
  size_t numel_ = 0;
  size_t padded_ = 0;
  size_t shard_ = 0;
  int dp_ = 0;
};

}  // namespace strata
