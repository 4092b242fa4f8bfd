// Whole-model equivalence with an independent PyTorch implementation (tools/make_golden.py):
// logits, loss and every parameter gradient at the initial weights, the losses of 5 AdamW
// steps and the weights after them. The fixtures are committed; no Python is needed here.
//
// Tolerances: strata and torch both compute in f32 but sum in different orders (BLAS blocking,
// attention tiling, softmax reductions), so values agree to a few f32 ulps of the tensor's scale
// per reduction: logits and losses to 2e-5 of the tensor's largest magnitude, gradients to 1e-5
// of theirs (measured: at most 1e-6 and 7e-7 — a 10-20x margin for other BLAS blockings). The final
// weights: Adam divides by sqrt(v) + eps, so where a gradient is tiny a rounding-level
// difference in it moves the weight by up to ~lr; torch's own f32 run differs from its f64 run
// by up to 5e-4 there (tools/README.md), so final weights get 2e-3 absolute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "comm/comm.h"
#include "engine/safetensors.h"
#include "engine/trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  std::unique_ptr<SafetensorsReader> st;
  Config cfg;
  std::vector<int32_t> inputs, targets;
  std::string dir;  // a Hugging Face directory holding the initial weights
};

std::vector<float> tensor(const SafetensorsReader& r, const std::string& name) {
  std::vector<float> v(size_t(r.info(name).numel()));
  r.read_f32(name, v.data());
  return v;
}

std::vector<std::string> weight_names(const SafetensorsReader& r) {
  std::vector<std::string> out;
  for (const auto& n : r.names())
    if (n.rfind("model.", 0) == 0 || n == "lm_head.weight") out.push_back(n);
  return out;
}

Fixture load_fixture(const std::string& file) {
  Fixture f;
  std::string path = std::string(STRATA_TEST_DATA_DIR) + "/" + file;
  f.st = std::make_unique<SafetensorsReader>(path);
  const auto& md = f.st->metadata();
  auto num = [&](const char* k) { return std::stod(md.at(k)); };
  Config& c = f.cfg;
  c.model.dim = int(num("dim"));
  c.model.n_layers = int(num("n_layers"));
  c.model.n_heads = int(num("n_heads"));
  c.model.n_kv_heads = int(num("n_kv_heads"));
  c.model.ffn_dim = int(num("ffn_dim"));
  c.model.vocab_size = int(num("vocab_size"));
  c.model.rope_theta = float(num("rope_theta"));
  c.model.norm_eps = float(num("norm_eps"));
  c.model.tie_embeddings = md.at("tie_embeddings") == "true";
  c.model.max_seq_len = int(num("seq_len"));
  c.data.micro_batch = int(num("batch"));
  c.data.seq_len = int(num("seq_len"));
  c.data.path = "builtin:random";
  c.train.steps = int(num("steps"));
  c.train.lr = float(num("lr"));
  c.train.beta1 = float(num("beta1"));
  c.train.beta2 = float(num("beta2"));
  c.train.eps = float(num("eps"));
  c.train.weight_decay = float(num("weight_decay"));
  c.train.decay_norms = true;  // torch.optim.AdamW decays every parameter
  c.train.warmup_steps = 0;
  c.train.schedule = Schedule::constant;
  c.train.grad_clip = 0;
  c.eval.batches = 0;
  size_t n = size_t(c.data.micro_batch) * c.data.seq_len;
  f.inputs.resize(n);
  f.targets.resize(n);
  f.st->read_i32("inputs", f.inputs.data());
  f.st->read_i32("targets", f.targets.data());
  // --init-from takes a Hugging Face directory: config.json next to the weights.
  f.dir = std::string(STRATA_TEST_WORK_DIR) + "/golden_" + file;
  fs::create_directories(f.dir);
  write_hf_config(f.dir, c.model, DType::f32);
  // The weights alone: the fixture's other tensors (inputs, expected losses and weights) are not
  // the model's, and a folder with tensors its model lacks is refused.
  std::vector<TensorInfo> infos;
  for (const auto& name : weight_names(*f.st)) infos.push_back(f.st->info(name));
  SafetensorsWriter w(f.dir + "/model.safetensors", infos);
  for (const auto& info : infos) {
    std::vector<float> v(size_t(info.numel()));
    f.st->read_f32(info.name, v.data());
    w.write_f32(info.name, v.data(), info.numel());
  }
  w.finish();
  return f;
}

// max |a − b| ≤ atol + rtol · max |b|
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, double(std::fabs(want[i])));
    double e = std::fabs(double(got[i]) - double(want[i]));
    if (e > err || std::isnan(got[i])) {
      err = std::isnan(got[i]) ? INFINITY : e;
      worst = i;
    }
  }
  EXPECT_LE(err, atol + rtol * scale) << what << ": worst element " << worst << " got "
                                      << got[worst] << " want " << want[worst] << " (scale " << scale << ")";
}

void run_golden(const std::string& file) {
  Fixture f = load_fixture(file);
  auto world = make_solo_communicator();
  TrainerOptions opt;
  opt.init_from = f.dir;
  opt.progress = false;
  opt.batch_source = [&](int64_t, int, int, int32_t* in, int32_t* tgt) {
    std::copy(f.inputs.begin(), f.inputs.end(), in);
    std::copy(f.targets.begin(), f.targets.end(), tgt);
  };
  Trainer* tp = nullptr;
  bool checked_grads = false;
  opt.on_gradients = [&](int64_t step) {
    if (step != 1) return;
    for (const auto& name : weight_names(*f.st))
      expect_close(tp->gradient(name), tensor(*f.st, "grad." + name), 1e-5, 0, "grad." + name);
    checked_grads = true;
  };
  Trainer trainer(f.cfg, *world, opt);
  tp = &trainer;

  std::vector<float> logits;
  double loss = trainer.forward_logits(f.inputs.data(), f.targets.data(), &logits);
  expect_close(logits, tensor(*f.st, "logits"), 2e-5, 0, "logits");
  EXPECT_NEAR(loss, tensor(*f.st, "loss")[0], 2e-5 * loss);

  TrainSummary s = trainer.train();
  EXPECT_TRUE(checked_grads);
  std::vector<float> want = tensor(*f.st, "adam_losses");
  ASSERT_EQ(s.losses.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(s.losses[i], want[i], 2e-5 * want[0]) << "loss of AdamW step " << i;
  for (const auto& name : weight_names(*f.st))
    expect_close(trainer.parameter(name), tensor(*f.st, "final." + name), 0, 2e-3, "final." + name);
}

}  // namespace

TEST(Golden, GroupedQueryAttentionUntied) { run_golden("golden_gqa.safetensors"); }
TEST(Golden, TiedEmbeddings) { run_golden("golden_tied.safetensors"); }
