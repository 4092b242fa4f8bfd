// engine/pipeline.h — pipeline stages: which units each stage owns, and the order in which a
// stage runs its forwards and backwards of the step's micro-batches.
//
// Stages own contiguous units: the first stage the embedding, the last the head, the blocks
// split by parallel.pp_layers or, when it is empty, balanced by unit_cost() (the largest
// stage's cost as small as it can be). Schedules (docs/architecture.md, "Pipeline stages"):
//   gpipe: F0 F1 … F(m−1) B0 B1 … B(m−1) — every micro-batch's activations held at once;
//   1f1b:  stage s runs min(pp − s − 1, m) warm-up forwards, then alternates one forward and
//          one backward, then drains the remaining backwards — at most pp − s micro-batches
//          in flight (the first stage: pp).
// Micro-batches run their backwards in the order of their forwards on every stage, so each
// stage accumulates gradients in micro-batch order, as one rank does.
#pragma once

#include <string>
#include <vector>

#include "engine/config.h"

namespace strata {

// Global unit indices [begin, end) of one stage (unit 0 the embedding, n_layers + 1 the head).
struct StageUnits {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
  bool contains(int u) const { return u >= begin && u < end; }
};

// The cost the default partition balances, for unit u of the whole model with micro-batches of
// B × T tokens: its training FLOPs (forward and backward: 6 per weight per token for the
// matmuls, the causal attention's 6·T·dim per token for a block) plus kPipeFlopsPerByte per
// byte the unit moves each micro-batch (its f32 parameters gathered twice and its gradient
// reduced once, and its output activation sent on). The embedding's lookup counts only bytes.
inline constexpr double kPipeFlopsPerByte = 16;
double unit_cost(const ModelConfig& config, int u, int B, int T);

// Every stage's units: from parallel.pp_layers when given (validated by validate()), else
// balanced by unit_cost. An Error naming parallel.pp when the model has fewer units than stages.
std::vector<StageUnits> pipeline_partition(const Config& config);

// One entry of a stage's schedule: the forward or backward of micro-batch `micro`.
struct PipeOp {
  bool forward = true;
  int micro = 0;
};
std::vector<PipeOp> pipeline_schedule(PipelineSchedule schedule, int pp, int stage, int micro_batches);
// The most micro-batches a schedule holds at once (forward run, backward not yet).
int max_in_flight(const std::vector<PipeOp>& ops);
// "F0 F1 B0 F2 B1 B2": a schedule as text (plans, errors, tests).
std::string schedule_text(const std::vector<PipeOp>& ops);

// The ideal idle share of every stage of a balanced pipeline: (pp − 1) / (m + pp − 1).
inline double ideal_bubble(int pp, int micro_batches) {
  return double(pp - 1) / double(micro_batches + pp - 1);
}

}  // namespace strata
