// Rotary embeddings against Hugging Face transformers 5 (fixtures of tools/make_rope_golden.py):
// tiny LlamaForCausalLM checkpoints that transformers saved with rope_parameters (rope_theta
// 500000; llama3 scaling evaluated past its original context; linear scaling) load through the
// --init-from path (read_hf_config + SafetensorsReader) and give transformers' loss; strata's
// host inv_freq equals transformers' bit for bit; the transformers 4 layout of the same settings
// loads to the same model; and --out (Trainer::save) writes rope_parameters as transformers 5
// does, so import -> export -> import keeps every setting and the loss.
//
// Tolerance: 1e-6 relative on the mean loss. Both sides run in f32 and sum in different orders;
// transformers' own f32 and f64 runs of these fixtures differ by < 1e-8 relative, while dropping
// the rotary settings moves the loss by 3e-3 to 2e-2 (both recorded in each golden.json).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"
#include "kernels/rope_tables.h"

using namespace strata;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kLossRtol = 1e-6;

std::string fixture(const std::string& name) {
  return std::string(STRATA_TEST_DATA_DIR) + "/" + name;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

void write_json(const std::string& path, const json& j) {
  std::ofstream f(path, std::ios::trunc);
  f << j.dump(2) << "\n";
  ASSERT_TRUE(f.good()) << path;
}

std::string work_dir(const std::string& name) {
  const std::string dir = std::string(STRATA_TEST_WORK_DIR) + "/rope_golden/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Golden {
  json g;
  std::vector<int32_t> inputs, targets;
};

Golden load_golden(const std::string& dir) {
  Golden out;
  out.g = read_json(dir + "/golden.json");
  for (const auto& row : out.g["inputs"])
    for (const auto& t : row) out.inputs.push_back(t.get<int32_t>());
  for (const auto& row : out.g["targets"])
    for (const auto& t : row) out.targets.push_back(t.get<int32_t>());
  return out;
}

// strata's mean loss of the golden batch with the weights and config.json of `hf_dir`.
double strata_loss(const std::string& hf_dir, const Golden& gold) {
  Config c;
  c.data.micro_batch = gold.g["batch"].get<int>();
  c.data.seq_len = gold.g["seq_len"].get<int>();
  c.data.path = "builtin:random";  // never read: the batch comes from the fixture
  c.train.steps = 0;
  c.eval.batches = 0;
  auto world = make_solo_communicator();
  TrainerOptions opt;
  opt.init_from = hf_dir;
  opt.progress = false;
  Trainer trainer(c, *world, opt);
  EXPECT_EQ(gold.inputs.size(), size_t(c.data.micro_batch) * c.data.seq_len);
  return trainer.forward_logits(gold.inputs.data(), gold.targets.data(), nullptr);
}

// The rope settings of a ModelConfig, as the JSON object transformers 5 would write for them.
void expect_rope_equals(const ModelConfig& m, const json& rope, const std::string& what) {
  const std::string type = rope["rope_type"].get<std::string>();
  EXPECT_EQ(rope_type_name(m.rope_type), type) << what;
  EXPECT_EQ(m.rope_theta, float(rope["rope_theta"].get<double>())) << what;
  if (type != "default") {
    EXPECT_EQ(m.rope_factor, rope["factor"].get<double>()) << what;
  }
  if (type == "llama3") {
    EXPECT_EQ(m.rope_low_freq_factor, rope["low_freq_factor"].get<double>()) << what;
    EXPECT_EQ(m.rope_high_freq_factor, rope["high_freq_factor"].get<double>()) << what;
    EXPECT_EQ(m.rope_original_max_position, rope["original_max_position_embeddings"].get<int>())
        << what;
  }
}

void expect_same_bits(const std::vector<float>& got, const json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], want[i].get<float>()) << what << ": inv_freq[" << i << "]";
}

void run_golden(const std::string& name) {
  const std::string dir = fixture(name);
  const Golden gold = load_golden(dir);
  const ModelConfig m = read_hf_config(dir);
  expect_rope_equals(m, gold.g["rope"], name);
  expect_same_bits(rope_inv_freq(m.rope(), m.head_dim()), gold.g["inv_freq"], name);

  const double want = gold.g["loss"].get<double>();
  const double got = strata_loss(dir, gold);
  const double rel = std::fabs(got - want) / want;
  std::printf("[ rope golden ] %-15s strata %.9f transformers %.9f relative error %.2e\n",
              name.c_str(), got, want, rel);
  ::testing::Test::RecordProperty("relative_error", std::to_string(rel));
  EXPECT_LE(rel, kLossRtol) << name << ": strata " << got << " vs transformers " << want;
}

}  // namespace

TEST(RopeGolden, Theta500k) { run_golden("rope_theta500k"); }
TEST(RopeGolden, Llama3PastTheOriginalContext) { run_golden("rope_llama3"); }
TEST(RopeGolden, LinearScaling) { run_golden("rope_linear"); }

// transformers' inv_freq for more settings and head sizes (Llama 3.1's among them), bit for bit.
TEST(RopeGolden, HostFrequenciesEqualTransformers) {
  const json table = read_json(fixture("rope_inv_freq.json"));
  ASSERT_GE(table["cases"].size(), 8u);
  for (const json& c : table["cases"]) {
    const json& r = c["rope"];
    RopeParams p;
    const std::string type = r["rope_type"].get<std::string>();
    p.type = type == "llama3"   ? RopeType::llama3
             : type == "linear" ? RopeType::linear
                                : RopeType::plain;
    p.theta = float(r["rope_theta"].get<double>());
    if (r.contains("factor")) p.factor = r["factor"].get<double>();
    if (type == "llama3") {
      p.low_freq_factor = r["low_freq_factor"].get<double>();
      p.high_freq_factor = r["high_freq_factor"].get<double>();
      p.original_max_position = r["original_max_position_embeddings"].get<int>();
    }
    expect_same_bits(rope_inv_freq(p, c["head_dim"].get<int>()), c["inv_freq"],
                     r.dump() + " D=" + std::to_string(c["head_dim"].get<int>()));
  }
}

// The same llama3 checkpoint with transformers 4's layout (top-level rope_theta, rope_scaling
// without it): the same settings, the same loss bit for bit. (tools/make_rope_golden.py checks
// that transformers reads both layouts to the same frequencies.)
TEST(RopeGolden, Transformers4LayoutReadsTheSame) {
  const std::string src = fixture("rope_llama3");
  const std::string dir = work_dir("v4_layout");
  json cfg = read_json(src + "/config.json");
  json scaling = cfg["rope_parameters"];
  cfg["rope_theta"] = scaling["rope_theta"];
  scaling.erase("rope_theta");
  cfg["rope_scaling"] = scaling;
  cfg.erase("rope_parameters");
  write_json(dir + "/config.json", cfg);
  fs::copy_file(src + "/model.safetensors", dir + "/model.safetensors");

  const Golden gold = load_golden(src);
  expect_rope_equals(read_hf_config(dir), gold.g["rope"], "v4 layout");
  EXPECT_EQ(strata_loss(dir, gold), strata_loss(src, gold));
}

// --out: import -> export -> import keeps every rope setting, writes them as transformers 5 wrote
// the fixture (rope_parameters, no top-level rope_theta / rope_scaling), and keeps the loss.
TEST(RopeGolden, ExportRoundTripsTheRopeSettings) {
  for (const std::string name : {"rope_theta500k", "rope_llama3", "rope_linear"}) {
    const std::string src = fixture(name);
    const std::string out = work_dir("export_" + name);
    const Golden gold = load_golden(src);
    Config c;
    c.data.micro_batch = gold.g["batch"].get<int>();
    c.data.seq_len = gold.g["seq_len"].get<int>();
    c.data.path = "builtin:random";
    c.train.steps = 0;
    c.eval.batches = 0;
    auto world = make_solo_communicator();
    TrainerOptions opt;
    opt.init_from = src;
    opt.progress = false;
    double before = 0;
    {
      Trainer trainer(c, *world, opt);
      before = trainer.forward_logits(gold.inputs.data(), gold.targets.data(), nullptr);
      trainer.save(out);
    }
    const json written = read_json(out + "/config.json");
    const json original = read_json(src + "/config.json");
    EXPECT_EQ(written["rope_parameters"], original["rope_parameters"]) << name;
    EXPECT_FALSE(written.contains("rope_theta")) << name;
    EXPECT_FALSE(written.contains("rope_scaling")) << name;

    const ModelConfig a = read_hf_config(src), b = read_hf_config(out);
    expect_rope_equals(b, original["rope_parameters"], name + " re-imported");
    Config ca, cb;
    ca.model = a;
    cb.model = b;
    EXPECT_EQ(config_to_toml(cb), config_to_toml(ca)) << name;  // every model setting
    EXPECT_EQ(strata_loss(out, gold), before) << name;
  }
}
