// Sizes derived from model shapes are 64-bit and overflow-checked (core/size.h): the largest
// shape the config allows gives exact counts and a memory plan, while absurd shapes built by
// hand (skipping validate) give an Error instead of a wrapped size.
#include <gtest/gtest.h>

#include <climits>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "tests/engine/test_util.h"

using namespace strata;

namespace {

// Every width at the top of its range (engine/config.cpp), 2^24 tokens per micro-batch.
Config largest() {
  Config c;
  c.model.dim = 65536;
  c.model.n_layers = 4096;
  c.model.n_heads = 4096;
  c.model.n_kv_heads = 4096;
  c.model.ffn_dim = 1048576;
  c.model.vocab_size = 16777216;
  c.model.max_seq_len = 16777216;
  c.data.seq_len = 4096;
  c.data.micro_batch = 4096;
  return c;
}

}  // namespace

TEST(ModelSizes, LargestAllowedShapeIsExact) {
  const Config c = largest();
  ASSERT_NO_THROW(validate(c));
  const LlamaModel model(c.model);
  const int64_t C = 65536, F = 1048576, V = 16777216, L = 4096;
  const int64_t block = 4 * C * C + 3 * F * C + 2 * C;  // q, k, v, o; gate, up, down; 2 norms
  EXPECT_EQ(model.num_params(), L * block + 2 * V * C + C);  // + embedding, lm_head, final norm
  // Activations: at least the SwiGLU inputs of every layer, 4 x L x N x 3F bytes = 3 x 2^58.
  const uint64_t acts = activation_bytes(c.model, 4096, 4096, false);
  EXPECT_GE(acts, 3ull << 58);
  PlanMachine one;
  one.ranks_here = 1;
  one.host_memory = 1ull << 40;
  one.device_capacity = 1ull << 40;
  const MemoryPlan plan = plan_memory(c, 1, one);
  EXPECT_GE(plan.device_bytes(), uint64_t(model.num_params()) * 16);  // master, m, v, grads
  EXPECT_FALSE(plan.fits());
  // Host memory of 2^31 - 1 such ranks on one machine does not fit in 64 bits: an Error.
  PlanMachine crowded = one;
  crowded.ranks_here = INT_MAX;
  EXPECT_ERROR_HAS(plan_memory(c, 1, crowded), "memory plan bytes", "does not fit in uint64");
}

TEST(ModelSizes, AbsurdShapesAreErrors) {
  ModelConfig m;  // never validated: a block of 7 matrices of (2^31 - 1)^2 elements
  m.dim = INT_MAX;
  m.n_heads = 1;
  m.n_kv_heads = 1;
  m.ffn_dim = INT_MAX;
  m.vocab_size = 1;
  m.n_layers = 1;
  EXPECT_ERROR_HAS(LlamaModel{m}, "model.layers.0", "does not fit in uint64");

  ModelConfig deep = largest().model;
  deep.n_layers = INT_MAX;
  EXPECT_ERROR_HAS(activation_bytes(deep, 4096, 4096, false), "activation floats",
                   "does not fit in uint64");
  EXPECT_ERROR_HAS(activation_bytes(largest().model, INT_MAX, INT_MAX, true), "activation floats");
}
