// engine/hf_config.cpp — Hugging Face config.json for LlamaForCausalLM, in and out.
//
// Reading takes the model shape into a ModelConfig and refuses what the strata model would
// compute differently: an activation other than SiLU, rope_scaling, biases, a head_dim other than
// hidden_size / num_attention_heads, a model_type other than llama. Optional keys take the
// defaults of transformers' LlamaConfig. Writing produces a file transformers loads as is.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/file_util.h"
#include "engine/safetensors.h"

namespace strata {
namespace {

constexpr const char* kRead = "hf_config::read";

std::string config_path(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return (std::filesystem::path(dir) / "config.json").string();
  return dir;
}

}  // namespace

ModelConfig read_hf_config(const std::string& dir) {
  const std::string path = config_path(dir);
  const std::string text = fileutil::read_file(path, kRead);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(kRead, str(path, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) fail(kRead, str(path, ": not a JSON object"));

  auto wrong = [&](const char* key, const char* expected) {
    fail(kRead, str(path, ": '", key, "' must be ", expected, ", got ", j[key].dump()));
  };
  // A positive integer; required unless a fallback is given.
  auto integer = [&](const char* key, const int* fallback) -> int {
    if (!j.contains(key) || j[key].is_null()) {
      if (fallback) return *fallback;
      fail(kRead, str(path, ": required key '", key, "' is missing"),
           "strata reads Llama configs: hidden_size, intermediate_size, num_attention_heads, "
           "num_hidden_layers, vocab_size");
    }
    const auto& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1ll << 31) - 1)
      wrong(key, "a positive integer");
    return v.get<int>();
  };
  auto real = [&](const char* key, float fallback) -> float {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number() || !(j[key].get<double>() > 0)) wrong(key, "a positive number");
    return static_cast<float>(j[key].get<double>());
  };
  auto boolean = [&](const char* key, bool fallback) -> bool {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) wrong(key, "true or false");
    return j[key].get<bool>();
  };
  auto string = [&](const char* key) -> std::string {
    if (!j.contains(key) || j[key].is_null()) return {};
    if (!j[key].is_string()) wrong(key, "a string");
    return j[key].get<std::string>();
  };

  if (std::string type = string("model_type"); !type.empty() && type != "llama")
    fail(kRead, str(path, ": model_type '", type, "' is not supported; allowed: \"llama\""),
         "strata implements LlamaForCausalLM");
  if (std::string act = string("hidden_act"); !act.empty() && act != "silu")
    fail(kRead, str(path, ": hidden_act '", act, "' is not supported; allowed: \"silu\""));
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    fail(kRead, str(path, ": rope_scaling ", j["rope_scaling"].dump(), " is not supported"),
         "strata implements plain rotary embeddings (rope_scaling: null)");
  if (boolean("attention_bias", false) || boolean("mlp_bias", false))
    fail(kRead, str(path, ": attention_bias / mlp_bias are not supported; allowed: false"));

  ModelConfig m;
  m.dim = integer("hidden_size", nullptr);
  m.ffn_dim = integer("intermediate_size", nullptr);
  m.n_heads = integer("num_attention_heads", nullptr);
  m.n_kv_heads = integer("num_key_value_heads", &m.n_heads);
  m.n_layers = integer("num_hidden_layers", nullptr);
  m.vocab_size = integer("vocab_size", nullptr);
  const int default_positions = 2048;  // LlamaConfig's default
  m.max_seq_len = integer("max_position_embeddings", &default_positions);
  m.norm_eps = real("rms_norm_eps", 1e-6f);
  m.rope_theta = real("rope_theta", 10000.0f);
  m.tie_embeddings = boolean("tie_word_embeddings", false);
  if (j.contains("initializer_range") && j["initializer_range"].is_number())
    m.init_std = j["initializer_range"].get<float>();
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    const int head_dim = integer("head_dim", nullptr);
    if (m.dim % m.n_heads != 0 || head_dim != m.dim / m.n_heads)
      fail(kRead, str(path, ": head_dim ", head_dim, " is not hidden_size / num_attention_heads = ",
                      m.dim, " / ", m.n_heads),
           "strata derives the head size from hidden_size and num_attention_heads");
  }
  return m;
}

void write_hf_config(const std::string& dir, const ModelConfig& m, DType dtype) {
  using fileutil::float_as_decimal;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("hf_config::write", str(dir, ": cannot create directory: ", ec.message()));
  const char* torch_dtype = dtype == DType::bf16  ? "bfloat16"
                            : dtype == DType::f16 ? "float16"
                                                  : "float32";
  nlohmann::ordered_json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"hidden_size", m.dim},
      {"intermediate_size", m.ffn_dim},
      {"num_attention_heads", m.n_heads},
      {"num_key_value_heads", m.n_kv_heads},
      {"num_hidden_layers", m.n_layers},
      {"head_dim", m.head_dim()},
      {"vocab_size", m.vocab_size},
      {"max_position_embeddings", m.max_seq_len},
      {"rms_norm_eps", float_as_decimal(m.norm_eps)},
      {"rope_theta", float_as_decimal(m.rope_theta)},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", m.tie_embeddings},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"initializer_range", float_as_decimal(m.init_std)},
      {"torch_dtype", torch_dtype},
  };
  fileutil::write_file_atomic((std::filesystem::path(dir) / "config.json").string(),
                              j.dump(2) + "\n", "hf_config::write");
}

}  // namespace strata
