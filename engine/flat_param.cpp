// engine/flat_param.cpp — FlatLayout.
#include "engine/flat_param.h"

#include <algorithm>

#include "core/error.h"
#include "core/size.h"

namespace strata {

size_t ParamView::global_numel() const {
  size_t n = 1;
  for (int64_t d : global_shape) n *= size_t(d);
  return n;
}

std::vector<GlobalRuns> ParamView::global_runs(size_t begin, size_t end) const {
  STRATA_CHECK(begin <= end && end <= numel, "flat_param::global_runs", "elements [", begin, ", ", end,
               ") of ", name, " (", numel, ")");
  std::vector<GlobalRuns> runs;
  if (begin == end) return runs;
  if (split_dim != 1 || shape[1] == global_shape[1]) {  // contiguous in the global tensor
    runs.push_back(GlobalRuns{begin, global_index(begin), 1, 0, end - begin});
    return runs;
  }
  const size_t cols = size_t(shape[1]), width = size_t(global_shape[1]);
  const size_t r0 = begin / cols, c0 = begin % cols, r1 = end / cols, c1 = end % cols;
  if (r0 == r1) {  // inside one row
    runs.push_back(GlobalRuns{begin, global_index(begin), 1, 0, end - begin});
    return runs;
  }
  size_t row = r0;
  if (c0 > 0) {  // the rest of the first row
    runs.push_back(GlobalRuns{begin, global_index(begin), 1, 0, cols - c0});
    ++row;
  }
  if (row < r1) {  // whole rows
    const size_t rows = r1 - row;
    runs.push_back(GlobalRuns{row * cols, global_index(row * cols), rows, rows > 1 ? width : 0, cols});
  }
  if (c1 > 0) runs.push_back(GlobalRuns{r1 * cols, global_index(r1 * cols), 1, 0, c1});  // last row's start
  return runs;
}

void FlatLayout::add(std::string name, std::vector<int64_t> shape, bool is_norm) {
  std::vector<int64_t> global = shape;
  add_slice(std::move(name), std::move(shape), std::move(global), -1, 0, true, is_norm);
}

void FlatLayout::add_slice(std::string name, std::vector<int64_t> shape,
                           std::vector<int64_t> global_shape, int split_dim, int64_t begin,
                           bool primary, bool is_norm) {
  STRATA_CHECK(dp_ == 0, "flat_param::add", "layout already finalized");
  STRATA_CHECK(shape.size() == global_shape.size() && split_dim >= -1 &&
                   split_dim < int(shape.size()) && (split_dim < 0 || shape.size() == 2),
               "flat_param::add", "bad slice of ", name);
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool split = int(d) == split_dim;
    STRATA_CHECK(split ? (begin >= 0 && begin + shape[d] <= global_shape[d])
                       : shape[d] == global_shape[d],
                 "flat_param::add", "slice of ", name, " does not lie inside its global shape");
  }
  size_t n = 1;
  for (int64_t d : shape) {
    STRATA_CHECK(d > 0, "flat_param::add", "non-positive dimension in ", name);
    n = checked_mul(n, static_cast<size_t>(d), [&] { return str("parameter ", name, " numel"); });
  }
  const size_t offset = numel_;
  numel_ = checked_add(numel_, n, [&] { return str("unit numel with ", name); });
  ParamView v;
  v.name = std::move(name);
  v.shape = std::move(shape);
  v.offset = offset;
  v.numel = n;
  v.is_norm = is_norm;
  v.global_shape = std::move(global_shape);
  v.split_dim = split_dim;
  v.split_begin = split_dim < 0 ? 0 : begin;
  v.primary = primary;
  views_.push_back(std::move(v));
}

void FlatLayout::finalize(int dp) {
  STRATA_CHECK(dp >= 1, "flat_param::finalize", "dp = ", dp);
  dp_ = dp;
  size_t unit = kShardAlignElems * static_cast<size_t>(dp);
  padded_ = checked_add(numel_, unit - 1, "padded unit numel") / unit * unit;
  if (padded_ == 0) padded_ = unit;
  shard_ = padded_ / static_cast<size_t>(dp);
}

const ParamView* FlatLayout::find(const std::string& name) const {
  for (const auto& v : views_)
    if (v.name == name) return &v;
  return nullptr;
}

const ParamView& FlatLayout::view(const std::string& name) const {
  const ParamView* v = find(name);
  if (!v) fail("flat_param::view", str("no parameter named '", name, "' in this unit"));
  return *v;
}

std::vector<std::pair<size_t, size_t>> norm_ranges(const FlatLayout& layout, size_t shard_begin,
                                                   size_t shard_numel) {
  bool all_primary = true;
  for (const auto& v : layout.views()) all_primary = all_primary && v.primary;
  if (all_primary) return {{0, shard_numel}};
  std::vector<std::pair<size_t, size_t>> ranges;
  const size_t shard_end = shard_begin + shard_numel;
  for (const auto& v : layout.views()) {
    if (!v.primary) continue;
    const size_t b = std::max(shard_begin, v.offset), e = std::min(shard_end, v.offset + v.numel);
    if (b >= e) continue;
    if (!ranges.empty() && ranges.back().first + ranges.back().second == b - shard_begin)
      ranges.back().second += e - b;  // adjacent primary views: one range
    else
      ranges.emplace_back(b - shard_begin, e - b);
  }
  return ranges;
}

}  // namespace strata
