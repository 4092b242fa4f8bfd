// tests/engine/reference_trainer.h — an independent training loop for the Llama model, the
// oracle of the single-process ZeRO tests.
//
// It trains a Config the way strata documents it (engine/trainer.h, engine/data.h's window
// contract, torch.optim.AdamW semantics) with none of the engine's machinery: one tensor per
// Hugging Face parameter (q, k, v and gate, up as separate GEMMs, not the engine's fused flat
// layout), the scalar reference ops (kernels/cpu/ref_ops.h) called directly on host vectors, the
// scalar AdamW on whole tensors, no ZeroEngine, no ModelRunner, no device, streams, shards or
// communicators. It covers one data-parallel rank, f32 or bf16 compute weights, gradient
// accumulation, tied embeddings, clipping and the LR schedule; not offload or parallel layouts.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/config.h"

namespace strata::test {

struct ReferenceResult {
  std::vector<double> losses;      // mean loss of each step
  std::vector<double> grad_norms;  // global gradient norm of each step, before clipping
  std::map<std::string, std::vector<float>> weights;  // master weights after the last step
};

// Trains config.train.steps steps from the model's seeded initial values (LlamaModel::
// init_values) on the windows of config.data.path that step s, micro-batch a of a 1-rank run
// reads (s·B·A + a·B + i). Needs data.path to be a built-in task or a file, not a batch source.
ReferenceResult reference_train(const Config& config);

}  // namespace strata::test
