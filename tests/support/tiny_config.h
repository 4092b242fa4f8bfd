// tests/support/tiny_config.h — the small Llama the engine tests train: the given shape on the
// built-in words corpus (config.h's default data), no evaluation and no progress lines; each
// test then sets what it varies (steps, learning rate, accumulation, precision, placement).
#pragma once

#include "engine/config.h"

namespace strata::test {

struct TinyShape {
  int dim = 48, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 80, max_seq_len = 32;
};

inline Config tiny_config(const TinyShape& shape, int seq_len, int micro_batch) {
  Config c;
  c.model.dim = shape.dim;
  c.model.n_layers = shape.n_layers;
  c.model.n_heads = shape.n_heads;
  c.model.n_kv_heads = shape.n_kv_heads;
  c.model.ffn_dim = shape.ffn_dim;
  c.model.max_seq_len = shape.max_seq_len;
  c.data.seq_len = seq_len;
  c.data.micro_batch = micro_batch;
  c.eval.batches = 0;
  c.log.every = 1000;
  return c;
}

}  // namespace strata::test
