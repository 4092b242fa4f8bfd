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
#include <utility>
#include <vector>

namespace strata {

// Shards start on 2048-element boundaries: 8 KiB in f32, 4 KiB in bf16 (O_DIRECT-aligned).
inline constexpr size_t kShardAlignElems = 2048;

// Local elements of a view in global coordinates: `rows` runs of `count` elements, the first
// starting at global (row-major) index `start`, each next one `row_stride` elements after the
// previous; they hold the local elements from `local` on, in order.
struct GlobalRuns {
  size_t local = 0;
  size_t start = 0;
  size_t rows = 1;
  size_t row_stride = 0;  // 0 when rows == 1
  size_t count = 0;
  size_t numel() const { return rows * count; }
};

// A view is this rank's tensor-parallel slice of a global tensor: the whole tensor
// (split_dim -1), a block of rows (0: column-parallel weights, vocabulary parts) or a block of
// columns (1: row-parallel weights). Initialization, --init-from, --out and checkpoints address
// elements by their global index. Replicated tensors (norm weights on every tp rank, kv heads
// shared by several tp ranks) are `primary` on exactly one of the ranks holding them: that copy
// is the one counted in the gradient norm and written out.
struct ParamView {
  std::string name;            // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // this rank's slice, e.g. {n_heads / tp * head_dim, dim}
  size_t offset = 0;           // in elements, from the start of the unit's flat buffer
  size_t numel = 0;
  bool is_norm = false;        // 1-D norm weight (initialized to ones)
  std::vector<int64_t> global_shape;  // the whole tensor, e.g. {n_heads * head_dim, dim}
  int split_dim = -1;          // -1: whole, 0: rows, 1: columns
  int64_t split_begin = 0;     // first global row / column of the slice
  bool primary = true;

  // Global flat (row-major) index of local element i.
  size_t global_index(size_t i) const {
    if (split_dim == 0) return i + size_t(split_begin) * size_t(shape[1]);
    if (split_dim == 1) {
      const size_t cols = size_t(shape[1]);
      return (i / cols) * size_t(global_shape[1]) + size_t(split_begin) + i % cols;
    }
    return i;
  }
  size_t global_numel() const;
  // Local elements [begin, end) as global runs: one run (rows 1) for a whole view, a block of
  // rows or a column slice as wide as the tensor; for a narrower column slice at most three —
  // the rest of the first row, the whole rows (rows > 1), the start of the last row — e.g.
  // columns [32, 64) of a (4, 64) tensor (local shape (4, 32)), local elements [16, 112):
  // {local 16, start 48, count 16}, {local 32, start 96, rows 2, stride 64, count 32},
  // {local 96, start 224, count 16}.
  std::vector<GlobalRuns> global_runs(size_t begin, size_t end) const;
};

class FlatLayout {
 public:
  void add(std::string name, std::vector<int64_t> shape, bool is_norm = false);
  // A tensor-parallel slice: `shape` of `global_shape`, split on `split_dim` from `begin`
  // (split_dim -1: a replica of the whole tensor, primary or not).
  void add_slice(std::string name, std::vector<int64_t> shape, std::vector<int64_t> global_shape,
                 int split_dim, int64_t begin, bool primary, bool is_norm = false);
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

// The ranges [begin, begin + count) of shard elements (relative to the shard, which starts at
// flat element shard_begin and holds shard_numel) that lie in primary views — what the gradient
// norm counts. One range covering the whole shard when every view is primary.
std::vector<std::pair<size_t, size_t>> norm_ranges(const FlatLayout& layout, size_t shard_begin,
                                                   size_t shard_numel);

}  // namespace strata
