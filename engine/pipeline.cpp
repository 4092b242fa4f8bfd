// engine/pipeline.cpp — the stage partition and the 1F1B / GPipe schedules of engine/pipeline.h.
#include "engine/pipeline.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace strata {

double unit_cost(const ModelConfig& c, int u, int B, int T) {
  const double N = double(B) * T, C = c.dim, V = c.vocab_size, F = c.ffn_dim;
  const double D = c.head_dim(), H = c.n_heads, KVH = c.n_kv_heads;
  double weights = 0, flops = 0;
  if (u == 0) {
    weights = V * C;  // a lookup: no FLOPs to speak of
  } else if (u <= c.n_layers) {
    weights = 2 * C + (H + 2 * KVH) * D * C + C * H * D + 3 * F * C;
    flops = 6 * N * (weights - 2 * C) + 6 * N * T * C;
  } else {
    weights = C + (c.tie_embeddings ? 0 : V * C);
    flops = 6 * N * V * C;
  }
  const double bytes = 3 * 4 * weights + 4 * N * C;
  return flops + kPipeFlopsPerByte * bytes;
}

std::vector<StageUnits> pipeline_partition(const Config& config) {
  const ModelConfig& m = config.model;
  const int pp = config.parallel.pp, U = m.n_layers + 2;
  if (pp < 1 || pp > U)
    fail("pipeline::partition", str("parallel.pp = ", pp, " stages for ", U, " units"),
         str("allowed: 1 <= parallel.pp <= model.n_layers + 2 = ", U));
  std::vector<StageUnits> stages;
  const std::vector<int>& layers = config.parallel.pp_layers;
  if (!layers.empty()) {
    STRATA_CHECK(int(layers.size()) == pp &&
                     std::accumulate(layers.begin(), layers.end(), 0) == m.n_layers,
                 "pipeline::partition", "parallel.pp_layers does not match parallel.pp and "
                 "model.n_layers (validate() checks this)");
    int u = 0;
    for (int s = 0; s < pp; ++s) {
      const int n = layers[size_t(s)] + (s == 0) + (s == pp - 1);
      stages.push_back({u, u + n});
      u += n;
    }
    return stages;
  }
  std::vector<double> cost(size_t(U), 0.0);
  for (int u = 0; u < U; ++u) cost[size_t(u)] = unit_cost(m, u, config.data.micro_batch, config.data.seq_len);
  // Greedy packing under a cost limit, every stage at least one unit: it succeeds exactly when
  // a partition with that largest stage exists; the smallest such limit is found by bisection.
  auto pack = [&](double limit, std::vector<StageUnits>* out) {
    int u = 0;
    for (int s = 0; s < pp; ++s) {
      if (u >= U || cost[size_t(u)] > limit) return false;
      const int begin = u;
      double acc = cost[size_t(u++)];
      const int keep = pp - s - 1;  // units left for the stages after this one
      while (u < U - keep && acc + cost[size_t(u)] <= limit) acc += cost[size_t(u++)];
      if (out) out->push_back({begin, u});
    }
    return u == U;
  };
  double lo = *std::max_element(cost.begin(), cost.end());
  double hi = std::accumulate(cost.begin(), cost.end(), 0.0);
  if (!pack(lo, nullptr)) {
    for (int i = 0; i < 100 && hi - lo > 1e-9 * hi; ++i) {
      const double mid = 0.5 * (lo + hi);
      (pack(mid, nullptr) ? hi : lo) = mid;
    }
    lo = hi;
  }
  STRATA_CHECK(pack(lo, &stages), "pipeline::partition", "no partition of ", U, " units into ", pp,
               " stages under the cost limit");
  return stages;
}

std::vector<PipeOp> pipeline_schedule(PipelineSchedule schedule, int pp, int stage, int m) {
  STRATA_CHECK(pp >= 1 && stage >= 0 && stage < pp && m >= 1, "pipeline::schedule", "stage ",
               stage, " of ", pp, ", ", m, " micro-batches");
  std::vector<PipeOp> ops;
  if (schedule == PipelineSchedule::gpipe) {
    for (int i = 0; i < m; ++i) ops.push_back({true, i});
    for (int i = 0; i < m; ++i) ops.push_back({false, i});
    return ops;
  }
  const int warmup = std::min(pp - stage - 1, m);
  for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int i = 0; i < m - warmup; ++i) {
    ops.push_back({true, warmup + i});
    ops.push_back({false, i});
  }
  for (int i = m - warmup; i < m; ++i) ops.push_back({false, i});
  return ops;
}

int max_in_flight(const std::vector<PipeOp>& ops) {
  int now = 0, most = 0;
  for (const PipeOp& op : ops) {
    now += op.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

std::string schedule_text(const std::vector<PipeOp>& ops) {
  std::string s;
  for (const PipeOp& op : ops) s += str(s.empty() ? "" : " ", op.forward ? "F" : "B", op.micro);
  return s;
}

}  // namespace strata
