// tests/fuzz/fuzz_hf_config.cpp — fuzz target: a Hugging Face config.json (read_hf_config).
//
// Input: the whole config.json. An accepted config that also passes validate() (as the trainer
// checks it after --init-from) must survive write_hf_config and read back field for field.
#include "core/error.h"
#include "engine/config.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {
namespace {

bool same(const ModelConfig& a, const ModelConfig& b) {
  return a.dim == b.dim && a.n_layers == b.n_layers && a.n_heads == b.n_heads &&
         a.n_kv_heads == b.n_kv_heads && a.ffn_dim == b.ffn_dim && a.vocab_size == b.vocab_size &&
         a.max_seq_len == b.max_seq_len && a.rope_theta == b.rope_theta &&
         a.norm_eps == b.norm_eps && a.tie_embeddings == b.tie_embeddings &&
         a.init_std == b.init_std;
}

}  // namespace

void hf_config(Bytes input) {
  static const std::string dir = fresh_dir("hf_in");
  static const std::string out = fresh_dir("hf_out");
  write_file(dir + "/config.json", as_text(input));
  Config config;
  config.model = read_hf_config(dir);
  validate(config);  // an Error here is a clean refusal too
  write_hf_config(out, config.model, DType::bf16);
  ModelConfig again;
  try {
    again = read_hf_config(out);
  } catch (const Error& e) {
    broken(str("config.json written from an accepted config is refused: ", e.what()));
  }
  if (!same(again, config.model)) broken("config.json does not read back as it was written");
}

}  // namespace strata::fuzz
