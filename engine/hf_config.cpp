// engine/hf_config.cpp — Hugging Face config.json for LlamaForCausalLM, in and out.
//
// Reading takes the model shape into a ModelConfig and refuses what the strata model would
// compute differently: an activation other than SiLU, a rope type other than default / linear /
// llama3, partial rotary, biases, a head_dim other than hidden_size / num_attention_heads, a
// model_type other than llama. Rotary settings are read from transformers 5's rope_parameters
// and from transformers 4's top-level rope_theta / rope_scaling; where both layouts give a value
// they must agree. Optional keys take the defaults of transformers' LlamaConfig. Writing produces
// the layout transformers 5 writes (rope_parameters), which it loads as is.
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
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

using nlohmann::json;

// Two JSON values denote the same setting (numbers compare by value: 10000 == 10000.0).
bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// The rotary settings of a config.json, from transformers 5's `rope_parameters` or transformers
// 4's `rope_scaling` (same keys; "type" is the old spelling of "rope_type"), plus the top-level
// `rope_theta`, `original_max_position_embeddings` and `partial_rotary_factor` that transformers
// also reads. A value given in two places must be the same in both.
class RopeReader {
 public:
  RopeReader(const json& j, const std::string& path) : j_(j), path_(path) {
    const json* params = object("rope_parameters");
    const json* scaling = object("rope_scaling");
    if (params && scaling) {
      std::set<std::string> keys;
      for (const auto& [k, v] : params->items()) keys.insert(k);
      for (const auto& [k, v] : scaling->items()) keys.insert(k);
      for (const std::string& k : keys) {
        const bool in_p = params->contains(k), in_s = scaling->contains(k);
        if (in_p && in_s && same_value((*params)[k], (*scaling)[k])) continue;
        fail(kRead,
             str(path_, ": rope_parameters and rope_scaling disagree: rope_parameters.", k, " = ",
                 in_p ? (*params)[k].dump() : "(absent)", ", rope_scaling.", k, " = ",
                 in_s ? (*scaling)[k].dump() : "(absent)"),
             "transformers 5 reads rope_parameters, transformers 4 rope_scaling: keep one of "
             "them, or make them equal");
      }
    }
    dict_ = params ? params : scaling;
    dict_name_ = params ? "rope_parameters" : "rope_scaling";
  }

  // Fills the rope settings of m (whose max_seq_len is already read).
  void read(ModelConfig& m) {
    const std::string type = rope_type();
    if (type == "default") m.rope_type = RopeType::plain;
    else if (type == "linear") m.rope_type = RopeType::linear;
    else if (type == "llama3") m.rope_type = RopeType::llama3;
    else
      fail(kRead,
           str(path_, ": ", type_where_, " \"", type,
               "\" is not supported; allowed: \"default\", \"linear\", \"llama3\""),
           "strata computes these rope types exactly as transformers does; the others (yarn, "
           "dynamic, longrope, ...) scale attention or depend on the sequence length");

    if (Setting v = value("rope_theta")) {
      const double theta = positive(v);
      if (theta > std::numeric_limits<float>::max())
        fail(kRead, str(path_, ": ", v.where, " = ", v.node->dump(), " does not fit a float"));
      m.rope_theta = float(theta);
    }
    if (Setting v = value("partial_rotary_factor"); v && !same_value(*v.node, json(1.0)))
      fail(kRead, str(path_, ": ", v.where, " = ", v.node->dump(), " is not supported; allowed: 1"),
           "strata rotates the whole head (partial rotary embeddings are not implemented)");
    if (m.rope_type != RopeType::plain) m.rope_factor = positive(required("factor", type));
    if (m.rope_type == RopeType::llama3) {
      const Setting low = required("low_freq_factor", type);
      const Setting high = required("high_freq_factor", type);
      m.rope_low_freq_factor = positive(low);
      m.rope_high_freq_factor = positive(high);
      if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
        fail(kRead, str(path_, ": ", high.where, " = ", high.node->dump(), " must be greater than ",
                        low.where, " = ", low.node->dump()));
      m.rope_original_max_position = m.max_seq_len;  // transformers' fallback when absent
      if (Setting v = value("original_max_position_embeddings")) {
        const double n = v.node->is_number() ? v.node->get<double>() : 0;
        if (!(n >= 1 && n <= 2147483647.0 && std::floor(n) == n))
          fail(kRead,
               str(path_, ": ", v.where, " must be a positive integer, got ", v.node->dump()));
        m.rope_original_max_position = int(n);
      }
    }
    if (dict_)
      for (const auto& [k, v] : dict_->items())
        if (!used_.count(k))
          log_warn("hf_config", path_, ": ", dict_name_, ".", k, " is not used by rope_type \"",
                   type, "\"; ignored, as transformers ignores it");
  }

 private:
  struct Setting {
    const json* node = nullptr;
    std::string where;  // "rope_parameters.factor", or "rope_theta" at the top level
    explicit operator bool() const { return node != nullptr; }
  };

  // An object-valued key; null, absent and {} all mean "not given" (as in transformers).
  const json* object(const char* key) const {
    if (!j_.contains(key) || j_[key].is_null()) return nullptr;
    if (!j_[key].is_object())
      fail(kRead, str(path_, ": '", key, "' must be an object or null, got ", j_[key].dump()));
    return j_[key].empty() ? nullptr : &j_[key];
  }
  Setting nested(const std::string& key) {
    used_.insert(key);
    if (!dict_ || !dict_->contains(key) || (*dict_)[key].is_null()) return {};
    return {&(*dict_)[key], str(dict_name_, ".", key)};
  }
  // "rope_type", or its old spelling "type"; "default" when neither is given.
  std::string rope_type() {
    Setting t = nested("rope_type"), old = nested("type");
    if (t && old && !same_value(*t.node, *old.node))
      fail(kRead, str(path_, ": ", t.where, " = ", t.node->dump(), " and ", old.where, " = ",
                      old.node->dump(), " disagree"));
    if (!t) t = old;
    if (!t) return "default";
    type_where_ = t.where;
    if (!t.node->is_string())
      fail(kRead, str(path_, ": ", t.where, " must be a string, got ", t.node->dump()));
    return t.node->get<std::string>();
  }
  // A setting from the nested object or the top level; when both give it they must agree.
  Setting value(const std::string& key) {
    Setting in = nested(key);
    Setting top;
    if (j_.contains(key) && !j_[key].is_null()) top = {&j_[key], key + " (top level)"};
    if (in && top && !same_value(*in.node, *top.node))
      fail(kRead,
           str(path_, ": ", top.where, " = ", top.node->dump(), " and ", in.where, " = ",
               in.node->dump(), " disagree"),
           str("transformers 5 takes ", in.where, ", transformers 4 the top-level ", key,
               ": remove one, or make them equal"));
    return in ? in : top;
  }
  Setting required(const std::string& key, const std::string& type) {
    Setting v = value(key);
    if (!v)
      fail(kRead, str(path_, ": rope_type \"", type, "\" needs ", dict_name_, ".", key,
                      ", which is missing"));
    return v;
  }
  double positive(const Setting& v) const {
    const double x = v.node->is_number() ? v.node->get<double>() : 0;
    if (!(x > 0) || !std::isfinite(x))
      fail(kRead, str(path_, ": ", v.where, " must be a positive number, got ", v.node->dump()));
    return x;
  }

  const json& j_;
  const std::string& path_;
  const json* dict_ = nullptr;
  std::string dict_name_;
  std::string type_where_ = "rope_type";
  std::set<std::string> used_;
};

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
  RopeReader(j, path).read(m);
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

namespace {

// transformers 5's rope_parameters of a LlamaConfig: the keys its rope type uses, sorted as
// transformers writes them (json.dumps(sort_keys=True)).
nlohmann::ordered_json rope_parameters(const ModelConfig& m) {
  using fileutil::float_as_decimal;
  nlohmann::ordered_json r = nlohmann::ordered_json::object();
  if (m.rope_type != RopeType::plain) r["factor"] = m.rope_factor;
  if (m.rope_type == RopeType::llama3) {
    r["high_freq_factor"] = m.rope_high_freq_factor;
    r["low_freq_factor"] = m.rope_low_freq_factor;
    r["original_max_position_embeddings"] = m.rope_original_max_position;
  }
  r["rope_theta"] = float_as_decimal(m.rope_theta);
  r["rope_type"] = rope_type_name(m.rope_type);
  return r;
}

}  // namespace

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
      {"rope_parameters", rope_parameters(m)},
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
