// Config: defaults, TOML files, --set overrides, every bad-input class of issue 2 item 9 (each
// message must name the key), printing round trips, and docs/config.md kept in sync.
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <sstream>
#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "tests/engine/test_util.h"

using namespace strata;
using strata::test::read_bytes;
using strata::test::scratch_dir;
using strata::test::write_bytes;

namespace {

// Loads a config from TOML text written to a scratch file.
Config load_text(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  std::string path = scratch_dir() + "/run.toml";
  write_bytes(path, toml);
  return load_config(path, overrides);
}

}  // namespace

TEST(Config, DefaultsValidate) {
  Config c;
  EXPECT_NO_THROW(validate(c));
  Config loaded = load_config("", {});
  EXPECT_EQ(config_to_toml(loaded), config_to_toml(c));
  EXPECT_EQ(c.data.path, "builtin:words");
}

TEST(Config, ParsesTomlFile) {
  Config c = load_text(R"(
[model]
dim = 512
n_layers = 8
n_heads = 8
n_kv_heads = 2
tie_embeddings = true
rope_theta = 500000      # an integer where a float is expected is fine
[data]
path = "tokens.bin"
seq_len = 256
shuffle = true
[train]
lr = 1e-3
schedule = "constant"
precision = "bf16"
seed = 7
[offload]
device_mem_limit = "2G"
pinned_mem_limit = 4096
nvme_path = ["/mnt/a", "/mnt/b"]
[io]
backend = "posix"
block_size = "64K"
stripe_size = "1M"
)");
  EXPECT_EQ(c.model.dim, 512);
  EXPECT_EQ(c.model.n_layers, 8);
  EXPECT_EQ(c.model.n_kv_heads, 2);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.rope_theta, 500000.0f);
  EXPECT_EQ(c.data.path, "tokens.bin");
  EXPECT_EQ(c.data.seq_len, 256);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.train.lr, 1e-3f);
  EXPECT_EQ(c.train.schedule, Schedule::constant);
  EXPECT_EQ(c.train.precision, Precision::bf16);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.offload.device_mem_limit, 2ull << 30);
  EXPECT_EQ(c.offload.pinned_mem_limit, 4096u);
  EXPECT_EQ(c.offload.nvme_path, (std::vector<std::string>{"/mnt/a", "/mnt/b"}));
  EXPECT_EQ(c.io.backend, "posix");
  EXPECT_EQ(c.io.block_size, 64u << 10);
  // Untouched keys keep their defaults.
  EXPECT_EQ(c.model.ffn_dim, Config{}.model.ffn_dim);
  EXPECT_EQ(c.train.steps, Config{}.train.steps);
}

TEST(Config, UnknownKeyNamesItAndListsTheSection) {
  EXPECT_ERROR_HAS(load_text("[model]\ndimm = 3\n"), "model.dimm", "run.toml",
                   "did you mean 'dim'", "keys of [model]:", "n_kv_heads");
  EXPECT_ERROR_HAS(load_text("[modle]\ndim = 3\n"), "unknown section [modle]",
                   "did you mean 'model'", "sections: model, data, train");
  EXPECT_ERROR_HAS(load_text("dim = 3\n"), "'dim' outside a section");
  EXPECT_ERROR_HAS(load_text("[train.extra]\nx = 1\n"), "unknown key 'train.extra'");
}

TEST(Config, WrongTypeNamesKeyExpectedTypeAndValue) {
  EXPECT_ERROR_HAS(load_text("[model]\ndim = \"big\"\n"), "model.dim", "expected an integer",
                   "string 'big'", "run.toml:2");
  EXPECT_ERROR_HAS(load_text("[model]\ndim = 3.5\n"), "model.dim", "expected an integer", "3.5");
  EXPECT_ERROR_HAS(load_text("[data]\nshuffle = 1\n"), "data.shuffle", "true or false");
  EXPECT_ERROR_HAS(load_text("[train]\nlr = \"fast\"\n"), "train.lr", "a number");
  EXPECT_ERROR_HAS(load_text("[offload]\nnvme_path = \"/mnt/a\"\n"), "offload.nvme_path",
                   "array of strings");
  EXPECT_ERROR_HAS(load_text("[offload]\nnvme_path = [\"/a\", 3]\n"), "offload.nvme_path");
  EXPECT_ERROR_HAS(load_text("[offload]\ndevice_mem_limit = \"2X\"\n"),
                   "offload.device_mem_limit", "2X");
  EXPECT_ERROR_HAS(load_text("[offload]\ndevice_mem_limit = true\n"), "offload.device_mem_limit",
                   "a size");
  EXPECT_ERROR_HAS(load_text("[model]\ndim = 99999999999\n"), "model.dim", "out of range");
}

TEST(Config, OutOfRangeNamesTheAllowedRange) {
  EXPECT_ERROR_HAS(load_text("[model]\ndim = 0\n"), "model.dim = 0", "allowed: [1, 65536]");
  EXPECT_ERROR_HAS(load_text("[train]\nbeta1 = 1.0\n"), "train.beta1", "allowed: [0, 1)");
  EXPECT_ERROR_HAS(load_text("[train]\nlr = 0\n"), "train.lr", "allowed: (0, 10]");
  EXPECT_ERROR_HAS(load_text("[train]\nlr = nan\n"), "train.lr");
  EXPECT_ERROR_HAS(load_text("[train]\ngrad_accum = 0\n"), "train.grad_accum", "[1, 65536]");
  EXPECT_ERROR_HAS(load_text("[data]\nmicro_batch = -2\n"), "data.micro_batch", "[1, 65535]");
  EXPECT_ERROR_HAS(load_text("[io]\nblock_size = 1000\n"), "io.block_size", "[4K, 1G]");
  EXPECT_ERROR_HAS(load_text("[io]\nblock_size = 6000\n"), "io.block_size", "multiple of 4096");
  EXPECT_ERROR_HAS(load_text("[train]\nseed = -1\n"), "train.seed", "[0, 2^63)");
}

// Values that used to pass and then loop for ever or overflow an int are range errors naming
// the key, the value and the range.
TEST(Config, HugeValuesAreRangeErrors) {
  EXPECT_ERROR_HAS(load_config("", {"zero.prefetch=2147483647"}), "zero.prefetch = 2147483647",
                   "allowed: [0, 64]");
  EXPECT_ERROR_HAS(load_config("", {"offload.prefetch=65"}), "offload.prefetch = 65", "[0, 64]");
  EXPECT_ERROR_HAS(load_config("", {"train.grad_accum=2147483647"}),
                   "train.grad_accum = 2147483647", "allowed: [1, 65536]");
  EXPECT_ERROR_HAS(load_config("", {"eval.batches=2147483647"}), "eval.batches = 2147483647",
                   "allowed: [0, 1000000]");
  EXPECT_ERROR_HAS(load_config("", {"model.n_layers=2147483647", "parallel.pp=2"}),
                   "model.n_layers = 2147483647", "allowed: [1, 4096]");
  EXPECT_ERROR_HAS(load_config("", {"train.steps=1000000001"}), "train.steps", "1000000000]");
  EXPECT_ERROR_HAS(load_config("", {"model.vocab_size=16777217"}), "model.vocab_size",
                   "[1, 16777216]");
  EXPECT_ERROR_HAS(load_config("", {"train.lr=11"}), "train.lr = 11.0", "(0, 10]");
  EXPECT_ERROR_HAS(load_config("", {"model.rope_theta=1e13"}), "model.rope_theta", "[1, 1e12]");
  EXPECT_ERROR_HAS(load_config("", {"offload.optimizer_chunk=8G"}),
                   "offload.optimizer_chunk = 8G", "allowed: [4K, 4G]");
  EXPECT_ERROR_HAS(load_config("", {"offload.device_mem_limit=18446744073709551615"}),
                   "offload.device_mem_limit = 18446744073709551615", "allowed: [0, 1024T]");
  EXPECT_ERROR_HAS(load_config("", {"io.queue_depth=4097"}), "io.queue_depth", "[1, 4096]");
  EXPECT_ERROR_HAS(load_config("", {"io.submit_batch=0"}), "io.submit_batch", "[1, 4096]");
  EXPECT_ERROR_HAS(load_config("", {"model.dim=2147483648"}), "model.dim = 2147483648",
                   "[1, 65536]");
  // The bounds themselves are allowed.
  EXPECT_NO_THROW(load_config("", {"zero.prefetch=64", "train.grad_accum=65536",
                                   "eval.batches=1000000", "model.n_layers=4096",
                                   "parallel.pp=4098", "offload.optimizer_chunk=4G"}));
  Config c;
  c.train.seed = uint64_t(1) << 63;  // only reachable from code: TOML integers are signed
  EXPECT_ERROR_HAS(validate(c), "train.seed = 9223372036854775808", "[0, 2^63)");
  c.train.seed = (uint64_t(1) << 63) - 1;
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, TokensPerMicroBatchAndUnitsAreBounded) {
  EXPECT_ERROR_HAS(
      load_config("", {"model.max_seq_len=16777216", "data.seq_len=8388608", "data.micro_batch=3"}),
      "data.micro_batch x data.seq_len = 3 x 8388608 = 25165824", "16777216");
  EXPECT_NO_THROW(
      load_config("", {"model.max_seq_len=16777216", "data.seq_len=8388608", "data.micro_batch=2"}));
  EXPECT_ERROR_HAS(load_config("", {"model.n_layers=4096", "parallel.pp=4098", "parallel.pp=4099"}),
                   "parallel.pp = 4099", "[1, 4098]");
  EXPECT_ERROR_HAS(load_config("", {"model.n_layers=2", "parallel.pp=5"}), "parallel.pp = 5",
                   "model.n_layers + 2 = 4");
}

// A --set string becomes TOML (config_to_toml) and JSON (manifests, metrics): UTF-8 only.
TEST(Config, SetStringsMustBeUtf8) {
  const std::string name = "donn\xc3\xa9" "es \xe2\x82\xac \xf0\x9f\x98\x80.txt";  // é € 😀
  EXPECT_EQ(load_config("", {"data.path=" + name}).data.path, name);
  for (const char* bad : {"\xff", "a\xc3", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80"}) {
    SCOPED_TRACE(bad);
    EXPECT_ERROR_HAS(load_config("", {std::string("data.path=") + bad}), "data.path",
                     "not UTF-8");
    EXPECT_ERROR_HAS(load_config("", {std::string("offload.nvme_path=/a,") + bad}),
                     "offload.nvme_path", "not UTF-8");
  }
}

// One folder per NVMe device: a folder named twice (here with a trailing slash) would stripe
// over one disk twice and count its free space twice.
TEST(Config, NvmePathNamesEachFolderOnce) {
  EXPECT_ERROR_HAS(load_config("", {"offload.nvme_path=/mnt/a,/mnt/b,/mnt/a/"}),
                   "offload.nvme_path names '/mnt/a' twice");
  EXPECT_EQ(load_config("", {"offload.nvme_path=/mnt/a,/mnt/ab"}).offload.nvme_path.size(), 2u);
}

// An empty folder name in a config file is refused at load, not at the first swap file (the
// plan counted the current folder's space for it).
TEST(Config, NvmePathHasNoEmptyFolderName) {
  EXPECT_ERROR_HAS(load_text("[offload]\nnvme_path = [\"/mnt/a\", \"\"]\n"),
                   "offload.nvme_path's entry 2 of 2 is an empty folder name");
  // in --set too (",/b" is most often a shell variable that was empty); a trailing comma is
  // not an entry, and an empty value clears the list
  EXPECT_ERROR_HAS(load_config("", {"offload.nvme_path=,/mnt/b"}),
                   "offload.nvme_path's entry 1 of 2 is an empty folder name");
  EXPECT_ERROR_HAS(load_config("", {"offload.nvme_path=/mnt/a, ,/mnt/b"}),
                   "offload.nvme_path's entry 2 of 3 is an empty folder name");
  EXPECT_EQ(load_config("", {"offload.nvme_path=/mnt/a,"}).offload.nvme_path,
            std::vector<std::string>{"/mnt/a"});
  EXPECT_TRUE(load_text("[offload]\nnvme_path = [\"/mnt/a\"]\n", {"offload.nvme_path="})
                  .offload.nvme_path.empty());
}

TEST(Config, ParallelTimeout) {
  EXPECT_EQ(Config{}.parallel.timeout, 600.0);
  EXPECT_EQ(load_config("", {"parallel.timeout=30.5"}).parallel.timeout, 30.5);
  EXPECT_EQ(load_text("[parallel]\ntimeout = 86400\n").parallel.timeout, 86400.0);
  EXPECT_ERROR_HAS(load_config("", {"parallel.timeout=0"}), "parallel.timeout = 0.0",
                   "allowed: [1, 86400]");
  EXPECT_ERROR_HAS(load_config("", {"parallel.timeout=1e5"}), "parallel.timeout", "[1, 86400]");
  EXPECT_ERROR_HAS(load_config("", {"parallel.timeout=inf"}), "parallel.timeout");
  EXPECT_ERROR_HAS(load_config("", {"parallel.timeout=fast"}), "parallel.timeout", "a number");
  EXPECT_NE(config_to_toml(Config{}).find("timeout = 600.0"), std::string::npos);
}

TEST(Config, ImpossibleShapesNameBothKeys) {
  EXPECT_ERROR_HAS(load_text("[model]\ndim = 250\nn_heads = 8\n"), "model.dim = 250",
                   "model.n_heads = 8", "allowed model.n_heads");
  EXPECT_ERROR_HAS(load_text("[model]\nn_heads = 8\nn_kv_heads = 3\n"), "model.n_kv_heads = 3",
                   "model.n_heads = 8", "allowed model.n_kv_heads for n_heads 8: 1, 2, 4, 8");
  EXPECT_ERROR_HAS(load_text("[model]\ndim = 24\nn_heads = 8\nn_kv_heads = 8\n"), "head_dim",
                   "is odd", "even");
  EXPECT_ERROR_HAS(load_text("[model]\nmax_seq_len = 64\n[data]\nseq_len = 128\n"),
                   "data.seq_len = 128", "model.max_seq_len = 64");
  EXPECT_ERROR_HAS(load_text("[parallel]\ntp = 3\n"), "parallel.tp = 3", "model.n_heads");
}

TEST(Config, BadEnumValueListsTheChoices) {
  EXPECT_ERROR_HAS(load_text("[train]\nschedule = \"linear\"\n"), "train.schedule", "\"linear\"",
                   "\"constant\", \"cosine\"");
  EXPECT_ERROR_HAS(load_text("[train]\nprecision = \"fp16\"\n"), "train.precision",
                   "\"fp32\", \"bf16\"");
  EXPECT_ERROR_HAS(load_text("[train]\ndevice = \"tpu\"\n"), "train.device",
                   "\"cpu\", \"cuda\", \"auto\"");
  EXPECT_ERROR_HAS(load_text("[io]\nbackend = \"aio\"\n"), "io.backend", "\"uring\"");
  EXPECT_ERROR_HAS(load_text("[offload]\nparams = \"disk\"\n"), "offload.params",
                   "\"device\", \"host\", \"nvme\", \"auto\"");
}

// "auto" (engine/step_model.h chooses the tier): parsed from TOML and --set, accepted by
// validate() without offload.nvme_path, printed back as "auto", and the other keys untouched.
TEST(Config, OffloadAutoParsesValidatesAndPrints) {
  Config c = load_text("[offload]\nparams = \"auto\"\noptimizer = \"auto\"\n", {"offload.grads=auto"});
  EXPECT_TRUE(c.offload.params.automatic);
  EXPECT_TRUE(c.offload.grads.automatic);
  EXPECT_TRUE(c.offload.optimizer.automatic);
  EXPECT_TRUE(c.offload.any_auto());
  EXPECT_NO_THROW(validate(c));
  const std::string toml = config_to_toml(c);
  EXPECT_NE(toml.find("params = \"auto\""), std::string::npos) << toml;
  EXPECT_EQ(config_to_json(c)["offload"]["optimizer"], "auto");
  Config back = load_text(toml);
  EXPECT_TRUE(back.offload.params.automatic && back.offload.grads.automatic && back.offload.optimizer.automatic);
  // Only the keys set to auto are.
  Config one = load_config("", {"offload.optimizer=auto", "offload.params=host"});
  EXPECT_TRUE(one.offload.optimizer.automatic);
  EXPECT_FALSE(one.offload.params.automatic);
  EXPECT_EQ(one.offload.params, Tier::host);
  // Setting a tier again clears auto.
  Config again = load_config("", {"offload.optimizer=auto", "offload.optimizer=nvme", "offload.nvme_path=/a"});
  EXPECT_FALSE(again.offload.optimizer.automatic);
  EXPECT_EQ(again.offload.optimizer, Tier::nvme);
  EXPECT_TRUE(load_config("", {}).offload.overlap_optimizer);
}

TEST(Config, EvalEveryNeedsBatches) {
  EXPECT_EQ(load_text("[eval]\nevery = 50\n").eval.every, 50);
  EXPECT_ERROR_HAS(load_text("[eval]\nevery = 50\nbatches = 0\n"), "eval.every", "eval.batches");
  EXPECT_ERROR_HAS(load_text("[eval]\nevery = -1\n"), "eval.every");
}

TEST(Config, OffloadTierRules) {
  Config c = load_text("[offload]\nparams = \"host\"\noptimizer = \"host\"\ngrads = \"host\"\n");
  EXPECT_EQ(c.offload.params, Tier::host);
  EXPECT_EQ(c.offload.optimizer, Tier::host);
  EXPECT_ERROR_HAS(load_text("[offload]\noptimizer = \"nvme\"\n"), "offload.optimizer",
                   "offload.nvme_path", "empty");
  EXPECT_ERROR_HAS(load_text("[offload]\nparams = \"nvme\"\n"), "offload.params",
                   "offload.nvme_path");
  Config n = load_text("[offload]\nparams = \"nvme\"\nnvme_path = [\"/mnt/a\"]\n");
  EXPECT_EQ(n.offload.params, Tier::nvme);
  // Gradients on NVMe: beside NVMe states (or "auto"), one micro-batch a step.
  EXPECT_ERROR_HAS(load_text("[offload]\ngrads = \"nvme\"\n"), "offload.grads = \"nvme\"",
                   "offload.optimizer = \"nvme\"", "and it is \"device\"");
  const std::string nvme_opt = "[offload]\noptimizer = \"nvme\"\nnvme_path = [\"/mnt/a\"]\n";
  EXPECT_EQ(load_text(nvme_opt + "grads = \"nvme\"\n").offload.grads, Tier::nvme);
  EXPECT_ERROR_HAS(load_text(nvme_opt + "grads = \"nvme\"\n[train]\ngrad_accum = 2\n"),
                   "needs train.grad_accum = 1, and it is 2", "offload.grads = \"host\"");
  EXPECT_NO_THROW(load_text("[offload]\noptimizer = \"auto\"\ngrads = \"nvme\"\n"
                            "nvme_path = [\"/mnt/a\"]\n"));
  // Part of an NVMe optimizer kept in host memory: only with the optimizer on NVMe (or "auto").
  EXPECT_ERROR_HAS(load_text("[offload]\noptimizer = \"host\"\noptimizer_host_bytes = \"1G\"\n"),
                   "offload.optimizer_host_bytes = 1G", "offload.optimizer = \"host\"",
                   "set offload.optimizer = \"nvme\"");
  EXPECT_NO_THROW(load_text("[offload]\noptimizer = \"auto\"\noptimizer_host_bytes = \"1G\"\n"));
  const Config k = load_text("[offload]\noptimizer = \"nvme\"\nnvme_path = [\"/mnt/a\"]\n"
                             "optimizer_host_bytes = \"1G\"\n");
  EXPECT_EQ(k.offload.optimizer_host_bytes, 1ull << 30);
}

TEST(Config, OverridesParseByKeyType) {
  Config c = load_text("[model]\ndim = 512\n",
                       {"model.dim=384", "model.n_heads = 6", "model.n_kv_heads=3",
                        "train.lr=2.5e-4", "data.shuffle=true", "offload.device_mem_limit=1.5G",
                        "train.schedule=constant", "offload.nvme_path=/mnt/a, /mnt/b,",
                        "data.path=\"my file.txt\"", "log.metrics=out/metrics.jsonl",
                        "train.seed=18446744073709551"});
  EXPECT_EQ(c.model.dim, 384);  // --set wins over the file
  EXPECT_EQ(c.model.n_heads, 6);
  EXPECT_EQ(c.train.lr, 2.5e-4f);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.offload.device_mem_limit, 3ull << 29);
  EXPECT_EQ(c.train.schedule, Schedule::constant);
  EXPECT_EQ(c.offload.nvme_path, (std::vector<std::string>{"/mnt/a", "/mnt/b"}));
  EXPECT_EQ(c.data.path, "my file.txt");
  EXPECT_EQ(c.log.metrics, "out/metrics.jsonl");
  EXPECT_EQ(c.train.seed, 18446744073709551ull);

  Config d;
  EXPECT_ERROR_HAS(apply_override(d, "model.dim"), "not section.key=value");
  EXPECT_ERROR_HAS(apply_override(d, "dim=3"), "not section.key=value");
  EXPECT_ERROR_HAS(apply_override(d, "model.dimm=3"), "model.dimm", "--set model.dimm=3",
                   "did you mean 'dim'");
  EXPECT_ERROR_HAS(apply_override(d, "modl.dim=3"), "unknown section [modl]");
  EXPECT_ERROR_HAS(apply_override(d, "model.dim=abc"), "model.dim", "expected an integer", "'abc'");
  EXPECT_ERROR_HAS(apply_override(d, "model.dim=3.0"), "model.dim", "expected an integer");
  EXPECT_ERROR_HAS(apply_override(d, "data.shuffle=yes"), "data.shuffle", "true or false");
  EXPECT_ERROR_HAS(apply_override(d, "offload.device_mem_limit=2X"), "offload.device_mem_limit",
                   "2X");
  EXPECT_ERROR_HAS(apply_override(d, "train.precision=fp8"), "train.precision", "\"fp32\"");
  EXPECT_ERROR_HAS(apply_override(d, "model.dim=99999999999"), "model.dim", "out of range");
  EXPECT_ERROR_HAS(load_config("", {"model.n_kv_heads=5"}), "model.n_kv_heads = 5");
}

TEST(Config, TomlRoundTrip) {
  Config c;
  c.model.dim = 384;
  c.model.n_heads = 6;
  c.model.n_kv_heads = 2;
  c.model.norm_eps = 1e-6f;
  c.model.rope_theta = 500000.0f;
  c.model.init_std = 0.0123456789f;
  c.model.tie_embeddings = true;
  c.data.path = "dir with \"quotes\"\\and\tstuff.txt";
  c.data.shuffle = true;
  c.train.lr = 3e-4f;
  c.train.beta2 = 0.999f;
  c.train.eps = 1e-12f;
  c.train.schedule = Schedule::constant;
  c.train.precision = Precision::bf16;
  c.train.seed = 9007199254740993ull;  // not representable as a double
  c.train.device = "auto";
  c.log.peak_flops = 1.23456789e14;
  c.offload.device_mem_limit = 12345;          // not a round size: printed as an integer
  c.offload.pinned_mem_limit = 3ull << 29;     // 1.5G
  c.offload.nvme_path = {"/mnt/nvme0", "/mnt/nvme1"};
  c.io.backend = "uring";
  std::string toml = config_to_toml(c);
  Config back = load_text(toml);
  EXPECT_EQ(config_to_toml(back), toml);
  EXPECT_EQ(std::bit_cast<uint32_t>(back.model.init_std), std::bit_cast<uint32_t>(c.model.init_std));
  EXPECT_EQ(std::bit_cast<uint32_t>(back.train.eps), std::bit_cast<uint32_t>(c.train.eps));
  EXPECT_EQ(back.model.norm_eps, c.model.norm_eps);
  EXPECT_EQ(back.data.path, c.data.path);
  EXPECT_EQ(back.train.seed, c.train.seed);
  EXPECT_EQ(back.log.peak_flops, c.log.peak_flops);
  EXPECT_EQ(back.offload.device_mem_limit, 12345u);
  EXPECT_EQ(back.offload.pinned_mem_limit, 3ull << 29);
  EXPECT_EQ(back.offload.nvme_path, c.offload.nvme_path);
  EXPECT_EQ(back.train.precision, Precision::bf16);
  EXPECT_NE(toml.find("lr = 0.0003"), std::string::npos) << toml;
  EXPECT_NE(toml.find("pinned_mem_limit = \"1.5G\""), std::string::npos) << toml;
}

TEST(Config, RopeKeys) {
  Config d;
  EXPECT_EQ(d.model.rope_type, RopeType::plain);
  Config c = load_text(R"(
[model]
rope_theta = 500000
rope_type = "llama3"
rope_factor = 8
rope_low_freq_factor = 1
rope_high_freq_factor = 4
rope_original_max_position = 8192
)");
  EXPECT_EQ(c.model.rope_type, RopeType::llama3);
  EXPECT_EQ(c.model.rope_factor, 8.0);
  EXPECT_EQ(c.model.rope_high_freq_factor, 4.0);
  EXPECT_EQ(c.model.rope_original_max_position, 8192);
  const RopeParams p = c.model.rope();
  EXPECT_EQ(p.type, RopeType::llama3);
  EXPECT_EQ(p.theta, 500000.0f);
  EXPECT_EQ(p.original_max_position, 8192);
  // printed and read back, as TOML and as JSON
  EXPECT_EQ(config_to_toml(load_text(config_to_toml(c))), config_to_toml(c));
  EXPECT_EQ(config_to_json(c)["model"]["rope_type"], "llama3");
  EXPECT_EQ(config_to_json(c)["model"]["rope_factor"].get<double>(), 8.0);
  Config linear = load_config("", {"model.rope_type=linear", "model.rope_factor=2.5"});
  EXPECT_EQ(linear.model.rope_type, RopeType::linear);
  EXPECT_EQ(linear.model.rope_factor, 2.5);

  EXPECT_ERROR_HAS(load_config("", {"model.rope_type=yarn"}), "model.rope_type", "\"yarn\"",
                   "\"default\", \"linear\", \"llama3\"");
  EXPECT_ERROR_HAS(load_config("", {"model.rope_type=linear", "model.rope_factor=0"}),
                   "model.rope_factor = 0.0", "out of range", "[1e-06, 1e6]");
  EXPECT_ERROR_HAS(load_config("", {"model.rope_original_max_position=0"}),
                   "model.rope_original_max_position", "[1, 16777216]");
  // a setting its rope type would ignore is an error
  EXPECT_ERROR_HAS(load_config("", {"model.rope_factor=8"}), "model.rope_factor = 8",
                   "no effect with model.rope_type = \"default\"");
  EXPECT_ERROR_HAS(load_config("", {"model.rope_type=linear", "model.rope_factor=2",
                                    "model.rope_original_max_position=4096"}),
                   "model.rope_original_max_position = 4096", "no effect", "\"linear\"");
  EXPECT_ERROR_HAS(load_config("", {"model.rope_type=llama3", "model.rope_factor=8",
                                    "model.rope_low_freq_factor=4"}),
                   "model.rope_high_freq_factor = 4", "greater than",
                   "model.rope_low_freq_factor = 4");
}

TEST(Config, Json) {
  Config c;
  c.train.lr = 3e-4f;
  c.offload.device_mem_limit = 2ull << 30;
  nlohmann::json j = config_to_json(c);
  EXPECT_EQ(j["train"]["lr"].get<double>(), 0.0003);  // the float's shortest decimal
  EXPECT_EQ(j["model"]["dim"], 256);
  EXPECT_EQ(j["train"]["schedule"], "cosine");
  EXPECT_EQ(j["offload"]["params"], "device");
  EXPECT_EQ(j["offload"]["device_mem_limit"].get<uint64_t>(), 2ull << 30);
  EXPECT_TRUE(j["offload"]["nvme_path"].is_array());
  for (const char* s : {"model", "data", "train", "eval", "log", "offload", "zero", "parallel", "io"})
    EXPECT_TRUE(j.contains(s)) << s;
}

TEST(Config, SyntaxErrorsAndMissingFiles) {
  EXPECT_ERROR_HAS(load_text("[model\ndim = 3\n"), "run.toml:1:");
  EXPECT_ERROR_HAS(load_config("/nonexistent/strata.toml", {}), "/nonexistent/strata.toml",
                   "cannot open");
}

// Every number a user can set has a documented range: the "allowed" column of its row.
TEST(Config, EveryNumericKeyHasARange) {
  std::istringstream md(config_reference_markdown());
  int numeric = 0;
  for (std::string line; std::getline(md, line);) {
    // | `key` | type | `default` | allowed | meaning |
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    for (size_t at = 1, next; (next = line.find(" | ", at)) != std::string::npos; at = next + 2)
      cells.push_back(line.substr(at + 1, next - at - 1));
    ASSERT_GE(cells.size(), 4u) << line;
    if (cells[1] != "int" && cells[1] != "float" && cells[1] != "size") continue;
    ++numeric;
    const std::string& allowed = cells[3];  // "[lo, hi]", "(lo, hi]", "[lo, hi)"
    EXPECT_TRUE(!allowed.empty() && (allowed.front() == '[' || allowed.front() == '(') &&
                allowed.find(", ") != std::string::npos)
        << "not a range with both bounds: " << line;
  }
  EXPECT_GE(numeric, 35);
}

TEST(Config, ReferenceDocumentsEveryKey) {
  std::string md = config_reference_markdown();
  nlohmann::json j = config_to_json(Config{});
  for (auto& [section, keys] : j.items()) {
    EXPECT_NE(md.find("## [" + section + "]"), std::string::npos) << section;
    for (auto& [key, value] : keys.items())
      EXPECT_NE(md.find("| `" + key + "` |"), std::string::npos) << section << "." << key;
  }
}

// docs/config.md is generated; this fails when the schema changed and the doc was not
// regenerated. The fresh text is left in the test's scratch directory.
TEST(Config, DocsConfigMdIsUpToDate) {
  const std::string doc_path = std::string(STRATA_SOURCE_DIR) + "/docs/config.md";
  const std::string expected = config_reference_markdown();
  const std::string fresh = scratch_dir() + "/config.md";
  write_bytes(fresh, expected);
  ASSERT_TRUE(std::filesystem::exists(doc_path)) << doc_path << " is missing";
  EXPECT_TRUE(read_bytes(doc_path) == expected)
      << doc_path << " is out of date; regenerate it with\n"
      << "  strata config --markdown > docs/config.md\n"
      << "or copy " << fresh;
}
