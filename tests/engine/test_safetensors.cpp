// Safetensors: round trips in f32/bf16/f16 (and integers), an index of two shards, corrupted
// headers (each an Error naming the file), writer atomicity; config.json round trip and errors.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/watchdog.h"
#include "engine/safetensors.h"
#include "tests/engine/test_util.h"

using namespace strata;
using strata::test::read_bytes;
using strata::test::scratch_dir;
using strata::test::write_bytes;

namespace {

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * float(i) + 0.1f) * (1.0f + float(i));
  return v;
}

// A safetensors file from a header written by hand and `data_bytes` bytes of data.
std::string raw_file(const std::string& header, size_t data_bytes, uint64_t length_field = 0) {
  uint64_t n = length_field ? length_field : header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

}  // namespace

TEST(Safetensors, RoundTripEveryDType) {
  const std::string path = scratch_dir() + "/model.safetensors";
  std::vector<float> a = ramp(7 * 5, 1.0f), b = ramp(17, 100.0f), c = ramp(4097, 0.01f);
  std::vector<int32_t> ids = {1, -2, 3};
  std::vector<int64_t> big = {5, -6000000000ll};
  std::vector<TensorInfo> tensors = {
      {"a.weight", StDType::f32, {7, 5}},  {"b.weight", StDType::bf16, {17}},
      {"c.weight", StDType::f16, {4097}},  {"ids", StDType::i32, {3}},
      {"big", StDType::i64, {2}},          {"empty", StDType::f32, {0, 3}},
      {"scalar", StDType::f32, {}},
  };
  {
    SafetensorsWriter w(path, tensors, {{"format", "pt"}});
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
    EXPECT_FALSE(std::filesystem::exists(path));
    w.write_f32("a.weight", a.data(), int64_t(a.size()));
    w.write_f32("b.weight", b.data(), int64_t(b.size()));
    w.write_f32("c.weight", c.data(), int64_t(c.size()));
    w.write_raw("ids", ids.data(), ids.size() * 4);
    w.write_raw("big", big.data(), big.size() * 8);
    w.write_f32("empty", nullptr, 0);
    float s = 2.5f;
    w.write_f32("scalar", &s, 1);
    w.finish();
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section should start 8-byte aligned";
  EXPECT_EQ(bytes[8], '{');

  SafetensorsReader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a.weight", "b.weight", "big", "c.weight", "empty",
                                                 "ids", "scalar"}));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.info("a.weight").shape, (std::vector<int64_t>{7, 5}));
  EXPECT_EQ(r.info("c.weight").dtype, StDType::f16);
  std::vector<float> out(4097);
  r.read_f32("a.weight", out.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], a[i]) << i;
  r.read_f32("b.weight", out.data());
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(out[i], to_f32(to_bf16(b[i]))) << i;
  r.read_f32("c.weight", out.data());
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(out[i], f16_bits_to_f32(f32_to_f16_bits(c[i]))) << i;
  std::vector<float> part(10);
  r.read_f32("c.weight", part.data(), 4000, 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(part[i], out[4000 + i]);
  std::vector<int32_t> ids_back(3), big_back(2);
  r.read_i32("ids", ids_back.data());
  EXPECT_EQ(ids_back, ids);
  EXPECT_ERROR_HAS(r.read_i32("big", big_back.data()), "big", "-6000000000", "int32");
  float s = 0;
  r.read_f32("scalar", &s);
  EXPECT_EQ(s, 2.5f);
  EXPECT_EQ(r.info("empty").numel(), 0);
  EXPECT_ERROR_HAS(r.info("nope"), "model.safetensors", "'nope'");
  EXPECT_ERROR_HAS(r.read_f32("ids", out.data()), "'ids'", "I32");
  EXPECT_ERROR_HAS(r.read_f32("c.weight", out.data(), 4000, 100), "c.weight", "out of range");

  // A directory holding model.safetensors reads the same.
  SafetensorsReader dir_reader(std::filesystem::path(path).parent_path().string());
  EXPECT_TRUE(dir_reader.has("a.weight"));
}

TEST(Safetensors, IndexOfTwoShards) {
  const std::string dir = scratch_dir();
  std::vector<float> a = ramp(6, 1.0f), b = ramp(4, 2.0f), c = ramp(8, 3.0f);
  {
    SafetensorsWriter w(dir + "/model-00001-of-00002.safetensors",
                        {{"a", StDType::f32, {2, 3}}, {"b", StDType::bf16, {4}}});
    w.write_f32("a", a.data(), 6);
    w.write_f32("b", b.data(), 4);
    w.finish();
  }
  {
    SafetensorsWriter w(dir + "/model-00002-of-00002.safetensors", {{"c", StDType::f32, {8}}});
    w.write_f32("c", c.data(), 8);
    w.finish();
  }
  nlohmann::json index = {{"metadata", {{"total_size", 64}}},
                          {"weight_map",
                           {{"a", "model-00001-of-00002.safetensors"},
                            {"b", "model-00001-of-00002.safetensors"},
                            {"c", "model-00002-of-00002.safetensors"}}}};
  write_bytes(dir + "/model.safetensors.index.json", index.dump());
  for (const std::string& p : {dir, dir + "/model.safetensors.index.json"}) {
    SafetensorsReader r(p);
    EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b", "c"}));
    std::vector<float> out(8);
    r.read_f32("c", out.data());
    EXPECT_EQ(out, c);
    r.read_f32("a", out.data());
    EXPECT_TRUE(std::equal(a.begin(), a.end(), out.begin()));
  }
  index["weight_map"]["c"] = "model-00001-of-00002.safetensors";
  write_bytes(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_ERROR_HAS(SafetensorsReader{dir}, "model.safetensors.index.json", "'c'",
                   "model-00001-of-00002.safetensors");
  index["weight_map"]["c"] = "../elsewhere.safetensors";
  write_bytes(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_ERROR_HAS(SafetensorsReader{dir}, "not a file name inside");
  index["weight_map"]["c"] = "missing.safetensors";
  write_bytes(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_ERROR_HAS(SafetensorsReader{dir}, "missing.safetensors", "cannot open");
  EXPECT_ERROR_HAS(SafetensorsReader{scratch_dir()}, "no model.safetensors");
}

TEST(Safetensors, CorruptedHeadersNameTheFile) {
  const std::string dir = scratch_dir();
  auto check = [&](const std::string& name, const std::string& file_bytes,
                   std::vector<std::string> fragments) {
    const std::string path = dir + "/" + name;
    write_bytes(path, file_bytes);
    fragments.push_back(path);
    EXPECT_ERROR_HAS(SafetensorsReader{path}, fragments);
  };
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  write_bytes(dir + "/ok.safetensors", raw_file(ok, 16));
  EXPECT_NO_THROW(SafetensorsReader{dir + "/ok.safetensors"});
  check("tiny.safetensors", "abc", {"too short"});
  check("length.safetensors", raw_file(ok, 16, 1000), {"header length 1000", "exceeds"});
  check("huge.safetensors", raw_file(ok, 16, 1ull << 62), {"header length"});
  check("json.safetensors", raw_file("{\"t\": [1, 2", 0), {"not valid JSON"});
  check("array.safetensors", raw_file("[1, 2]", 0), {"not an object"});
  check("range.safetensors",
        raw_file(R"({"t":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})", 16),
        {"'t'", "out of range", "<= 16"});
  check("order.safetensors",
        raw_file(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 16),
        {"'t'", "out of range"});
  check("size.safetensors",
        raw_file(R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}})", 16),
        {"'t'", "hold 8 bytes", "needs 4 x 4 = 16"});
  check("dtype.safetensors",
        raw_file(R"({"t":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16),
        {"'t'", "dtype 'F64'", "allowed: F32, BF16, F16, I32, I64"});
  check("overlap.safetensors",
        raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 16),
        {"'a'", "'b'", "overlap"});
  check("negative.safetensors",
        raw_file(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0),
        {"'t'", "non-negative"});
  check("overflow.safetensors",
        raw_file(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
        {"'t'", "overflows"});
  check("fields.safetensors", raw_file(R"({"t":{"dtype":"F32","shape":[1]}})", 4),
        {"'t'", "data_offsets"});
  check("meta.safetensors", raw_file(R"({"__metadata__":{"a":1}})", 0), {"__metadata__"});
}

// Element and byte counts are int64 / uint64 and checked: a shape whose product overflows at
// any step is refused by the reader, by numel() and by the writer; a read range is checked
// without computing offset + count.
TEST(Safetensors, SizesAreChecked64Bit) {
  const std::string dir = scratch_dir();
  // 2^62 x 2 overflows int64 before the 0 makes the product 0: numel() could not compute it.
  const std::string zero_after_overflow = dir + "/zero_after_overflow.safetensors";
  write_bytes(zero_after_overflow,
              raw_file(R"({"t":{"dtype":"F32","shape":[4611686018427387904,2,0],)"
                       R"("data_offsets":[0,0]}})", 0));
  EXPECT_ERROR_HAS(SafetensorsReader{zero_after_overflow}, "'t'", "overflows");
  EXPECT_ERROR_HAS((TensorInfo{"huge", StDType::f32, {int64_t(1) << 62, 4}}.numel()),
                   "tensor 'huge'", "does not fit in int64");
  EXPECT_ERROR_HAS((TensorInfo{"neg", StDType::f32, {2, -1}}.numel()), "tensor 'neg'");
  EXPECT_ERROR_HAS(SafetensorsWriter(dir + "/w.safetensors",
                                     {{"bytes", StDType::f32, {int64_t(1) << 61, 2}}}),
                   "tensor 'bytes' bytes", "does not fit in uint64");

  const std::string ok = dir + "/ok.safetensors";
  write_bytes(ok, raw_file(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16));
  SafetensorsReader r(ok);
  float out[4];
  EXPECT_NO_THROW(r.read_f32("t", out, 4, 0));
  EXPECT_NO_THROW(r.read_f32("t", nullptr, 2, 0));
  EXPECT_ERROR_HAS(r.read_f32("t", out, 1, INT64_MAX), "'t'", "out of range", "it has 4");
  EXPECT_ERROR_HAS(r.read_f32("t", out, INT64_MAX, 1), "'t'", "out of range");
  EXPECT_ERROR_HAS(r.read_f32("t", out, INT64_MIN, -1), "'t'", "out of range");
  EXPECT_ERROR_HAS(r.read_f32("t", out, 5), "'t'", "out of range");
}

TEST(Safetensors, WriterIsAtomic) {
  const std::string dir = scratch_dir();
  const std::string path = dir + "/w.safetensors";
  std::vector<float> x = ramp(4, 1.0f);
  // An existing file stays intact until finish().
  {
    SafetensorsWriter w(path, {{"old", StDType::f32, {4}}});
    w.write_f32("old", x.data(), 4);
    w.finish();
  }
  const std::string before = read_bytes(path);
  {
    SafetensorsWriter w(path, {{"a", StDType::f32, {4}}, {"b", StDType::f32, {4}}});
    w.write_f32("a", x.data(), 4);
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
    EXPECT_ERROR_HAS(w.finish(), "w.safetensors", "1 of 2", "'b'");
  }  // destroyed before finish(): the temporary goes, the old file stays
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(read_bytes(path), before);
  {
    SafetensorsWriter w(path, {{"a", StDType::f32, {4}}, {"b", StDType::f32, {4}}});
    EXPECT_ERROR_HAS(w.write_f32("b", x.data(), 4), "header order", "expected 'a'");
    EXPECT_ERROR_HAS(w.write_f32("a", x.data(), 3), "'a'", "4 elements, got 3");
    EXPECT_ERROR_HAS(w.write_raw("a", x.data(), 8), "needs 16 bytes, got 8");
  }
  EXPECT_ERROR_HAS(SafetensorsWriter(path, {{"a", StDType::f32, {1}}, {"a", StDType::f32, {1}}}),
                   "'a'", "repeated");
  EXPECT_ERROR_HAS(SafetensorsWriter(dir + "/no/such/dir/x.safetensors", {}), "x.safetensors.tmp",
                   "cannot create");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(HfConfig, RoundTrip) {
  const std::string dir = scratch_dir() + "/export";
  ModelConfig m;
  m.dim = 384;
  m.n_layers = 3;
  m.n_heads = 6;
  m.n_kv_heads = 2;
  m.ffn_dim = 1024;
  m.vocab_size = 50257;
  m.max_seq_len = 512;
  m.rope_theta = 500000.0f;
  m.rope_type = RopeType::llama3;
  m.rope_factor = 8.0;
  m.rope_low_freq_factor = 1.0;
  m.rope_high_freq_factor = 4.0;
  m.rope_original_max_position = 128;
  m.norm_eps = 1e-6f;
  m.tie_embeddings = true;
  write_hf_config(dir, m, DType::bf16);
  nlohmann::json j = nlohmann::json::parse(read_bytes(dir + "/config.json"));
  // transformers 5's layout: the rope settings only in rope_parameters
  EXPECT_EQ(j["rope_parameters"], nlohmann::json::parse(R"({"factor": 8.0, "high_freq_factor": 4.0,
      "low_freq_factor": 1.0, "original_max_position_embeddings": 128, "rope_theta": 500000.0,
      "rope_type": "llama3"})"));
  EXPECT_FALSE(j.contains("rope_theta"));
  EXPECT_FALSE(j.contains("rope_scaling"));
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["hidden_size"], 384);
  EXPECT_EQ(j["rms_norm_eps"].get<double>(), 1e-6);  // written as the float's shortest decimal
  ModelConfig back = read_hf_config(dir);
  EXPECT_EQ(back.dim, m.dim);
  EXPECT_EQ(back.n_layers, m.n_layers);
  EXPECT_EQ(back.n_heads, m.n_heads);
  EXPECT_EQ(back.n_kv_heads, m.n_kv_heads);
  EXPECT_EQ(back.ffn_dim, m.ffn_dim);
  EXPECT_EQ(back.vocab_size, m.vocab_size);
  EXPECT_EQ(back.max_seq_len, m.max_seq_len);
  EXPECT_EQ(back.rope_theta, m.rope_theta);
  EXPECT_EQ(back.rope_type, m.rope_type);
  EXPECT_EQ(back.rope_factor, m.rope_factor);
  EXPECT_EQ(back.rope_low_freq_factor, m.rope_low_freq_factor);
  EXPECT_EQ(back.rope_high_freq_factor, m.rope_high_freq_factor);
  EXPECT_EQ(back.rope_original_max_position, m.rope_original_max_position);
  EXPECT_EQ(back.norm_eps, m.norm_eps);
  EXPECT_EQ(back.tie_embeddings, m.tie_embeddings);
  EXPECT_EQ(read_hf_config(dir + "/config.json").dim, 384);  // the file itself works too

  // plain and linear rotary: only the keys their rope type uses
  m.rope_type = RopeType::plain;
  m.rope_factor = 1.0;
  m.rope_high_freq_factor = 4.0;
  m.rope_original_max_position = 8192;
  write_hf_config(dir, m, DType::f32);
  j = nlohmann::json::parse(read_bytes(dir + "/config.json"));
  EXPECT_EQ(j["rope_parameters"],
            nlohmann::json::parse(R"({"rope_theta": 500000.0, "rope_type": "default"})"));
  EXPECT_EQ(read_hf_config(dir).rope_type, RopeType::plain);
  m.rope_type = RopeType::linear;
  m.rope_factor = 2.5;
  write_hf_config(dir, m, DType::f32);
  j = nlohmann::json::parse(read_bytes(dir + "/config.json"));
  EXPECT_EQ(j["rope_parameters"],
            nlohmann::json::parse(R"({"factor": 2.5, "rope_theta": 500000.0, "rope_type": "linear"})"));
  back = read_hf_config(dir);
  EXPECT_EQ(back.rope_type, RopeType::linear);
  EXPECT_EQ(back.rope_factor, 2.5);
}

// Rotary settings in both layouts (transformers 5's rope_parameters; transformers 4's top-level
// rope_theta and rope_scaling), and every way they can be refused.
TEST(HfConfig, RopeSettings) {
  const std::string dir = scratch_dir();
  const nlohmann::json base = {{"hidden_size", 64},        {"intermediate_size", 128},
                               {"num_attention_heads", 4}, {"num_hidden_layers", 2},
                               {"vocab_size", 256},        {"max_position_embeddings", 4096}};
  auto with = [&](const nlohmann::json& extra) {
    nlohmann::json j = base;
    for (const auto& [k, v] : extra.items()) j[k] = v;
    write_bytes(dir + "/config.json", j.dump());
    return dir;
  };
  const nlohmann::json llama3 = {{"rope_type", "llama3"},  {"rope_theta", 500000.0},
                                 {"factor", 8.0},           {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const nlohmann::json default_500k = {{"rope_type", "default"}, {"rope_theta", 500000.0}};

  // transformers 5
  ModelConfig m = read_hf_config(with({{"rope_parameters", default_500k}}));
  EXPECT_EQ(m.rope_type, RopeType::plain);
  EXPECT_EQ(m.rope_theta, 500000.0f);
  m = read_hf_config(with({{"rope_parameters", llama3}}));
  EXPECT_EQ(m.rope_type, RopeType::llama3);
  EXPECT_EQ(m.rope_theta, 500000.0f);
  EXPECT_EQ(m.rope_factor, 8.0);
  EXPECT_EQ(m.rope_low_freq_factor, 1.0);
  EXPECT_EQ(m.rope_high_freq_factor, 4.0);
  EXPECT_EQ(m.rope_original_max_position, 8192);
  // transformers 4: top-level rope_theta, rope_scaling with "rope_type" or the older "type"
  nlohmann::json v4 = llama3;
  v4.erase("rope_theta");
  m = read_hf_config(with({{"rope_theta", 500000}, {"rope_scaling", v4}}));
  EXPECT_EQ(m.rope_type, RopeType::llama3);
  EXPECT_EQ(m.rope_theta, 500000.0f);
  EXPECT_EQ(m.rope_original_max_position, 8192);
  m = read_hf_config(
      with({{"rope_theta", 10000.0}, {"rope_scaling", {{"type", "linear"}, {"factor", 2}}}}));
  EXPECT_EQ(m.rope_type, RopeType::linear);
  EXPECT_EQ(m.rope_factor, 2.0);
  // both layouts, consistent: fine (10000 and 10000.0 are the same number)
  m = read_hf_config(
      with({{"rope_theta", 500000}, {"rope_parameters", llama3}, {"rope_scaling", llama3}}));
  EXPECT_EQ(m.rope_type, RopeType::llama3);
  // no original_max_position_embeddings: transformers' fallback, max_position_embeddings
  nlohmann::json no_original = llama3;
  no_original.erase("original_max_position_embeddings");
  EXPECT_EQ(read_hf_config(with({{"rope_parameters", no_original}})).rope_original_max_position,
            4096);
  // a key the rope type does not use is ignored, as transformers ignores it
  nlohmann::json extra = llama3;
  extra["attention_factor"] = 1.5;
  EXPECT_EQ(read_hf_config(with({{"rope_parameters", extra}})).rope_type, RopeType::llama3);
  EXPECT_EQ(read_hf_config(with({{"rope_parameters", nlohmann::json::object()}})).rope_type,
            RopeType::plain);  // {} means absent, as in transformers

  // disagreements name both places
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_theta", 10000.0}, {"rope_parameters", default_500k}})),
                   "rope_theta (top level) = 10000.0", "rope_parameters.rope_theta = 500000.0",
                   "disagree");
  nlohmann::json other = llama3;
  other["factor"] = 16.0;
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", llama3}, {"rope_scaling", other}})),
                   "rope_parameters.factor = 8.0", "rope_scaling.factor = 16.0");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", llama3}, {"rope_scaling", v4}})),
                   "rope_scaling.rope_theta = (absent)");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", llama3},
                                        {"original_max_position_embeddings", 2048}})),
                   "original_max_position_embeddings (top level) = 2048",
                   "rope_parameters.original_max_position_embeddings = 8192");
  const nlohmann::json two_types = {{"rope_type", "linear"}, {"type", "dynamic"}, {"factor", 2}};
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_scaling", two_types}})), "rope_scaling.rope_type",
                   "rope_scaling.type", "disagree");
  // unsupported types name the key and the allowed values
  const nlohmann::json yarn = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", yarn}})),
                   "rope_parameters.rope_type \"yarn\" is not supported",
                   "allowed: \"default\", \"linear\", \"llama3\"");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}})),
                   "rope_scaling.type \"dynamic\" is not supported");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", {{"rope_type", 3}}}})),
                   "rope_parameters.rope_type", "must be a string");
  // missing and bad values
  nlohmann::json bad = llama3;
  bad.erase("factor");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", bad}})), "rope_type \"llama3\" needs",
                   "rope_parameters.factor", "missing");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_scaling", {{"rope_type", "linear"}}}})),
                   "rope_scaling.factor", "missing");
  bad = llama3;
  bad["high_freq_factor"] = 1.0;
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", bad}})),
                   "rope_parameters.high_freq_factor = 1.0", "must be greater than",
                   "rope_parameters.low_freq_factor = 1.0");
  bad = llama3;
  bad["factor"] = -2;
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", bad}})), "rope_parameters.factor",
                   "a positive number", "-2");
  bad = llama3;
  bad["original_max_position_embeddings"] = 81.5;
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", bad}})),
                   "rope_parameters.original_max_position_embeddings", "a positive integer");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", {{"rope_theta", 0}}}})),
                   "rope_parameters.rope_theta", "a positive number");
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_theta", "big"}})), "rope_theta (top level)",
                   "\"big\"");
  const nlohmann::json partial = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", partial}})),
                   "rope_parameters.partial_rotary_factor = 0.5", "not supported");
  EXPECT_ERROR_HAS(read_hf_config(with({{"partial_rotary_factor", 0.25}})),
                   "partial_rotary_factor (top level)");
  EXPECT_NO_THROW(read_hf_config(with({{"partial_rotary_factor", 1.0}})));
  EXPECT_ERROR_HAS(read_hf_config(with({{"rope_parameters", "llama3"}})), "'rope_parameters'",
                   "an object or null");
}

TEST(HfConfig, BadConfigsNameTheKey) {
  const std::string dir = scratch_dir();
  const nlohmann::json base = {{"hidden_size", 64},        {"intermediate_size", 128},
                               {"num_attention_heads", 4}, {"num_hidden_layers", 2},
                               {"vocab_size", 256},        {"model_type", "llama"}};
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = base;
    if (value.is_discarded()) j.erase(key);
    else j[key] = value;
    write_bytes(dir + "/config.json", j.dump());
    return dir;
  };
  write_bytes(dir + "/config.json", base.dump());
  ModelConfig m = read_hf_config(dir);
  EXPECT_EQ(m.n_kv_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(m.norm_eps, 1e-6f);
  EXPECT_EQ(m.rope_theta, 10000.0f);
  EXPECT_FALSE(m.tie_embeddings);
  const nlohmann::json drop = nlohmann::json::value_t::discarded;
  EXPECT_ERROR_HAS(read_hf_config(with("hidden_size", drop)), "config.json", "'hidden_size'",
                   "missing");
  EXPECT_ERROR_HAS(read_hf_config(with("num_hidden_layers", "two")), "'num_hidden_layers'",
                   "a positive integer", "\"two\"");
  EXPECT_ERROR_HAS(read_hf_config(with("vocab_size", 0)), "'vocab_size'");
  EXPECT_ERROR_HAS(read_hf_config(with("rms_norm_eps", "small")), "'rms_norm_eps'");
  EXPECT_ERROR_HAS(read_hf_config(with("tie_word_embeddings", 1)), "'tie_word_embeddings'");
  EXPECT_ERROR_HAS(read_hf_config(with("hidden_act", "gelu")), "hidden_act", "gelu", "silu");
  EXPECT_ERROR_HAS(read_hf_config(with("rope_scaling", {{"rope_type", "llama3"}})),
                   "rope_scaling.factor", "missing");
  EXPECT_NO_THROW(read_hf_config(with("rope_scaling", nullptr)));
  EXPECT_ERROR_HAS(read_hf_config(with("model_type", "qwen2")), "model_type", "qwen2");
  EXPECT_ERROR_HAS(read_hf_config(with("head_dim", 32)), "head_dim 32");
  EXPECT_ERROR_HAS(read_hf_config(with("attention_bias", true)), "attention_bias");
  write_bytes(dir + "/config.json", "{ not json");
  EXPECT_ERROR_HAS(read_hf_config(dir), "config.json", "not valid JSON");
  EXPECT_ERROR_HAS(read_hf_config(dir + "/nowhere"), "nowhere", "cannot open");
}

// A file system call that blocks for good (a dead NFS server; here PATH.tmp is a FIFO that nobody
// reads, whose open blocks) is a watched wait: the watchdog reports it with the file's name and
// ends the job after parallel.timeout, where it would otherwise hang.
TEST(Safetensors, AFileCallThatBlocksIsReportedWithItsFile) {
  const std::string path = scratch_dir() + "/model.safetensors", tmp = path + ".tmp";
  ASSERT_EQ(::mkfifo(tmp.c_str(), 0644), 0) << std::strerror(errno);
  std::string error;
  std::thread writer([&] {
    try {
      const std::vector<float> a = ramp(4, 1.0f);
      SafetensorsWriter w(path, {{"a", StDType::f32, {4}}});
      w.write_f32("a", a.data(), 4);
      w.finish();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::string report;
  for (int i = 0; i < 500 && report.find(tmp) == std::string::npos; ++i) {  // bounded: 5 s
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    report = watchdog_report_now(0);
  }
  // A reader releases the open; the header and data fit the pipe, and a FIFO's fsync fails.
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_NONBLOCK);
  writer.join();
  if (fd >= 0) ::close(fd);
  EXPECT_NE(report.find(str("open of '", tmp, "'")), std::string::npos) << report;
  EXPECT_NE(error.find("fsync failed"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(path)) << "a file whose fsync failed was committed";
}
