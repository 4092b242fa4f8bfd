// The LR schedules and global-norm clipping against PyTorch's own values (fixtures written by
// tools/make_schedule_golden.py, committed under tests/optimizer/data; no Python is needed here).
//
// Schedules: LrSchedule::at for every step of each case against torch.optim.lr_scheduler
// (SequentialLR of LinearLR and CosineAnnealingLR / ConstantLR, see the script for the mapping).
// strata computes the rate in double and returns it as float, the type AdamW takes; torch's value
// is a double. So each rate must be within half a float ulp of torch's (2^-24 relative: the final
// rounding) plus 1e-12 relative for the difference between the two double computations (torch
// updates the cosine recursively; the script checks it against the closed form to 1e-12).
//
// Clipping: the global norm as the engine computes it over shards (each rank's Ops::sum_squares
// in double over its slice of the zero-padded flat gradient, the partial sums added, the square
// root), for 1 to 4 shards, and clip_coefficient, against torch.nn.utils.clip_grad_norm_:
//   norm vs torch's float64 run: 1e-12 relative (both sum float32 values exactly in double, up to
//     the order of the additions, ~1e-16 each);
//   norm vs torch's float32 run: 1e-6 relative (torch sums float32 squares in float32);
//   coefficient vs the factor torch's float64 run applied: 2^-24 + 1e-12 relative (strata rounds
//     its double coefficient to float once); exactly 1 where torch does not clip;
//   clipped gradients (float32 g · coefficient, as AdamW applies them) vs torch's float32 run:
//     4 float ulps (4 · 2^-23) relative per element: torch's float32 norm is off its float64
//     value by up to 6.4e-8 relative in these sets, its coefficient is rounded to float32 and so
//     is each product (at most ~2.4e-7 together), half of that bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/device.h"
#include "kernels/ops.h"
#include "optimizer/schedule.h"

using namespace strata;
using nlohmann::json;

namespace {

json load(const char* file) {
  const std::string path = std::string(STRATA_TEST_DATA_DIR) + "/" + file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  return json::parse(in);
}

constexpr double kHalfFloatUlp = 0x1p-24;  // relative rounding bound of float
constexpr double kDoubleSlack = 1e-12;

// The global L2 norm of `grads` as the engine computes it over `shards` ranks: the gradients
// concatenated, zero-padded to a multiple of `shards`, each shard's sum of squares by the
// device's sum_squares op (in double), the partial sums added in rank order, the square root.
double sharded_norm(Device& dev, const std::vector<std::vector<float>>& grads, size_t shards) {
  std::vector<float> flat;
  for (const auto& g : grads) flat.insert(flat.end(), g.begin(), g.end());
  const size_t shard = (flat.size() + shards - 1) / shards;
  flat.resize(shard * shards, 0.0f);
  Buffer data = dev.alloc(flat.size() * 4 + 4, "gradient shards");
  Buffer parts = dev.alloc(shards * 8, "partial sums");
  std::memcpy(data.data(), flat.data(), flat.size() * 4);
  auto s = dev.make_stream("norm");
  for (size_t r = 0; r < shards; ++r)
    dev.ops().sum_squares(*s, parts.as<double>() + r, data.as<float>() + r * shard, shard);
  s->synchronize();
  double total = 0;
  for (size_t r = 0; r < shards; ++r) total += parts.as<double>()[r];
  return std::sqrt(total);
}

}  // namespace

TEST(LrScheduleGolden, EveryStepMatchesTorchSchedulers) {
  const json fx = load("schedule_golden.json");
  ASSERT_GE(fx.at("cases").size(), 10u);
  int checked = 0;
  double worst = 0;  // relative
  for (const json& c : fx.at("cases")) {
    LrSchedule s;
    const std::string shape = c.at("shape");
    ASSERT_TRUE(shape == "cosine" || shape == "constant") << shape;
    s.shape = shape == "cosine" ? LrShape::cosine : LrShape::constant;
    s.lr = float(c.at("lr").get<double>());
    s.warmup_steps = c.at("warmup_steps");
    s.total_steps = c.at("total_steps");
    s.min_ratio = float(c.at("min_ratio").get<double>());
    const auto want = c.at("lrs").get<std::vector<double>>();
    ASSERT_EQ(int64_t(want.size()), s.total_steps);
    for (int64_t step = 0; step < s.total_steps; ++step) {
      const double w = want[size_t(step)];
      EXPECT_NEAR(double(s.at(step)), w, (kHalfFloatUlp + kDoubleSlack) * std::fabs(w))
          << shape << " lr " << s.lr << " warmup " << s.warmup_steps << " total " << s.total_steps
          << " min_ratio " << s.min_ratio << ": step " << step;
      if (w != 0) worst = std::max(worst, std::fabs(double(s.at(step)) - w) / std::fabs(w));
      ++checked;
    }
  }
  std::printf("[schedule] %d learning rates from %zu cases against torch %s: worst relative "
              "difference %.3g (bound %.3g)\n", checked, fx.at("cases").size(),
              fx.at("torch_version").get<std::string>().c_str(), worst,
              kHalfFloatUlp + kDoubleSlack);
}

TEST(ClipGolden, ShardedNormAndCoefficientMatchClipGradNorm) {
  const json fx = load("clip_golden.json");
  ASSERT_GE(fx.at("sets").size(), 5u);
  auto dev = make_device(DeviceKind::cpu);
  bool saw_unclipped = false, saw_clipped = false, saw_zero = false;
  double worst64 = 0, worst32 = 0, worst_coef = 0, worst_clipped = 0;  // relative
  for (const json& set : fx.at("sets")) {
    const std::string name = set.at("name");
    SCOPED_TRACE(name);
    const float max_norm = float(set.at("max_norm").get<double>());
    std::vector<std::vector<float>> grads;
    for (const json& g : set.at("grads")) {
      grads.emplace_back();
      for (double x : g.get<std::vector<double>>()) grads.back().push_back(float(x));
    }
    const double norm64 = set.at("norm_f64"), norm32 = set.at("norm_f32");
    const double want_coef = set.at("coefficient_f64");
    for (size_t shards : {1, 2, 3, 4}) {
      const double norm = sharded_norm(*dev, grads, shards);
      EXPECT_NEAR(norm, norm64, kDoubleSlack * norm64) << shards << " shards: vs torch float64";
      EXPECT_NEAR(norm, norm32, 1e-6 * norm32) << shards << " shards: vs torch float32";
      if (norm64 > 0) {
        worst64 = std::max(worst64, std::fabs(norm - norm64) / norm64);
        worst32 = std::max(worst32, std::fabs(norm - norm32) / norm32);
      }
    }
    const double norm = sharded_norm(*dev, grads, 1);
    const float coef = clip_coefficient(norm, max_norm);
    if (want_coef == 1.0) {
      EXPECT_EQ(coef, 1.0f) << "torch does not clip this set";
    } else {
      EXPECT_NEAR(double(coef), want_coef, (kHalfFloatUlp + kDoubleSlack) * want_coef);
      EXPECT_LT(coef, 1.0f);
      worst_coef = std::max(worst_coef, std::fabs(double(coef) - want_coef) / want_coef);
    }
    saw_unclipped = saw_unclipped || (want_coef == 1.0 && norm > 0);
    saw_clipped = saw_clipped || want_coef < 1.0;
    saw_zero = saw_zero || norm == 0;
    const json& clipped = set.at("clipped_f32");
    ASSERT_EQ(clipped.size(), grads.size());
    for (size_t t = 0; t < grads.size(); ++t) {
      const auto want = clipped[t].get<std::vector<double>>();
      ASSERT_EQ(want.size(), grads[t].size());
      for (size_t i = 0; i < want.size(); ++i) {
        const float got = grads[t][i] * coef;  // what AdamW's fused grad_scale computes
        EXPECT_NEAR(double(got), want[i], 4 * 0x1p-23 * std::fabs(want[i]))
            << "tensor " << t << " element " << i;
        if (want[i] != 0)
          worst_clipped =
              std::max(worst_clipped, std::fabs(double(got) - want[i]) / std::fabs(want[i]));
      }
    }
  }
  EXPECT_TRUE(saw_unclipped && saw_clipped && saw_zero) << "the fixture lost a case";
  std::printf("[clip] %zu sets, 1-4 shards: worst relative difference of the norm %.3g vs torch "
              "float64 (bound %.3g), %.3g vs torch float32 (bound 1e-6); coefficient %.3g (bound "
              "%.3g); clipped gradients %.3g (bound %.3g)\n",
              fx.at("sets").size(), worst64, kDoubleSlack, worst32, worst_coef,
              kHalfFloatUlp + kDoubleSlack, worst_clipped, 4 * 0x1p-23);
}

// Where strata's clipping deliberately departs from clip_grad_norm_ (no torch value to match).
TEST(ClipCoefficient, ZeroMaxNormTurnsClippingOffAndNonFiniteNormsScaleNothing) {
  // torch's clip_grad_norm_(max_norm = 0) would zero every gradient; strata's grad_clip = 0
  // means "off" (engine/config.h).
  EXPECT_EQ(clip_coefficient(5.0, 0.0f), 1.0f);
  // A non-finite norm leaves the gradient alone; the trainer stops such a step with an error
  // before AdamW runs (engine/trainer.cpp), so nothing is ever scaled by 0 or NaN.
  EXPECT_EQ(clip_coefficient(INFINITY, 1.0f), 1.0f);
  EXPECT_EQ(clip_coefficient(NAN, 1.0f), 1.0f);
}
