// engine/flat_param.cpp — FlatLayout.
#include "engine/flat_param.h"

#include "core/error.h"
#include "core/size.h"

namespace strata {

void FlatLayout::add(std::string name, std::vector<int64_t> shape, bool is_norm) {
  STRATA_CHECK(dp_ == 0, "flat_param::add", "layout already finalized");
  size_t n = 1;
  for (int64_t d : shape) {
    STRATA_CHECK(d > 0, "flat_param::add", "non-positive dimension in ", name);
    n = checked_mul(n, static_cast<size_t>(d), [&] { return str("parameter ", name, " numel"); });
  }
  const size_t offset = numel_;
  numel_ = checked_add(numel_, n, [&] { return str("unit numel with ", name); });
  views_.push_back(ParamView{std::move(name), std::move(shape), offset, n, is_norm});
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

}  // namespace strata
