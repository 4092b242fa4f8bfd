// engine/config.h — the run configuration: every key of the TOML sections, typed, with defaults.
//
// A Config starts from the built-in defaults (what `strata train` with no arguments runs), then
// a TOML file, then `--set section.key=value` overrides, in that order. Unknown keys, wrong
// types, out-of-range values and impossible combinations are Errors that name the key and the
// allowed values. The schema (engine/config.cpp) is the single source of the key list: it drives
// parsing, validation, printing and docs/config.md (`strata config --markdown`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "io/file_io.h"  // kDefaultSubmitBatch
#include "kernels/rope_tables.h"
#include "offload/placement.h"  // Tier

namespace strata {

enum class Precision { fp32, bf16 };
enum class Schedule { constant, cosine };
enum class PipelineSchedule { one_f_one_b, gpipe };  // parallel.pp_schedule

std::string_view tier_name(Tier t);
std::string_view precision_name(Precision p);
std::string_view schedule_name(Schedule s);

struct ModelConfig {
  int dim = 256;             // hidden size (HF hidden_size)
  int n_layers = 4;          // decoder blocks (HF num_hidden_layers)
  int n_heads = 8;           // query heads (HF num_attention_heads)
  int n_kv_heads = 4;        // key/value heads, divides n_heads (HF num_key_value_heads)
  int ffn_dim = 768;         // SwiGLU inner size (HF intermediate_size)
  int vocab_size = 256;      // byte-level text needs 256
  int max_seq_len = 1024;    // longest sequence (HF max_position_embeddings)
  // Rotary embeddings (HF rope_parameters; kernels/rope_tables.h computes them as transformers).
  float rope_theta = 10000.0f;             // rope_theta
  RopeType rope_type = RopeType::plain;    // rope_type: "default" | "linear" | "llama3"
  double rope_factor = 1.0;                // factor (linear, llama3)
  double rope_low_freq_factor = 1.0;       // low_freq_factor (llama3)
  double rope_high_freq_factor = 4.0;      // high_freq_factor (llama3)
  int rope_original_max_position = 8192;   // original_max_position_embeddings (llama3)
  float norm_eps = 1e-5f;    // RMSNorm epsilon (HF rms_norm_eps)
  bool tie_embeddings = false;
  float init_std = 0.02f;    // normal(0, init_std) for linear and embedding weights
  // Tokens per chunk of the loss (logits of (chunk, vocab / tp) f32 at a time); 0 = the whole
  // micro-batch when its logits fit 256 MiB, else as many tokens as do. A run setting, not
  // part of the architecture: --init-from keeps it.
  int loss_chunk = 0;

  int head_dim() const { return dim / n_heads; }
  RopeParams rope() const {
    return RopeParams{rope_type, rope_theta, rope_factor, rope_low_freq_factor,
                      rope_high_freq_factor, rope_original_max_position};
  }
};

struct DataConfig {
  std::string path = "builtin:words";  // a .txt file (bytes), an llm.c token file, or builtin:NAME
  int seq_len = 128;                    // T: tokens per window
  int micro_batch = 8;                  // B: windows per micro-batch per data-parallel rank
  bool shuffle = false;                 // permute windows each epoch (a pure function of seed, epoch)
};

struct TrainConfig {
  int steps = 300;
  float lr = 3e-3f;
  int warmup_steps = 20;
  Schedule schedule = Schedule::cosine;
  float min_lr_ratio = 0.1f;  // cosine decays to lr * min_lr_ratio at the last step
  float weight_decay = 0.1f;
  bool decay_norms = false;   // apply weight decay to RMSNorm weights too (torch.optim.AdamW on all)
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;     // global-norm clipping threshold; 0 = off
  int grad_accum = 1;         // micro-batches per step
  Precision precision = Precision::fp32;
  // The linear layers' GEMMs on CUDA: "f32" (f32 operands on the CUDA cores), "bf16" (operands
  // rounded to bf16 on the tensor cores, f32 accumulation), "auto" (bf16 when precision = bf16).
  std::string matmul_precision = "auto";
  // AdamW m and v: f32, or bf16 (rounded to nearest even after each update; master stays f32).
  DType optimizer_state_dtype = DType::f32;
  uint64_t seed = 1234;
  std::string device = "cpu";  // cpu | cuda | auto
  int threads = 0;             // oneTBB threads; 0 = all this process may use
};

struct EvalConfig {
  int batches = 8;          // micro-batches evaluated by `strata eval` and at the end of training
  std::string path;         // data for eval; empty = data.path
  int every = 0;            // also evaluate after every N steps (and the last); 0 = only at the end
};

struct LogConfig {
  int every = 10;           // log a metrics line every N steps (and the last step)
  std::string metrics;      // JSONL path; empty = none
  std::string trace;        // Chrome-trace JSON path; empty = none
  double peak_flops = 0;    // FLOP/s that MFU is measured against; 0 = measure f32 GEMM at start
};

// offload.params, offload.grads, offload.optimizer: a tier, or "auto" — the planner
// (engine/step_model.h) picks the fastest placement that fits before anything is allocated.
// Reads as its Tier; while `automatic` is set that tier is only a placeholder (device), and
// zero_options() refuses it, so nothing is ever allocated by an unresolved "auto".
struct TierSetting {
  Tier tier = Tier::device;
  bool automatic = false;
  TierSetting() = default;
  TierSetting(Tier t) : tier(t) {}  // NOLINT: a tier is a setting
  operator Tier() const { return tier; }  // NOLINT
};

struct OffloadConfig {
  TierSetting params = Tier::device;     // compute copy of the parameters
  TierSetting grads = Tier::device;      // f32 gradient shards (device | host)
  TierSetting optimizer = Tier::device;  // f32 master, m, v
  uint64_t device_mem_limit = 0;  // cap on device memory; 0 = the device's size
  uint64_t pinned_mem_limit = 0;  // pinned host budget; 0 = as the plan needs
  std::vector<std::string> nvme_path;  // one directory per NVMe device
  int prefetch = 2;               // NVMe reads ahead, in units
  uint64_t optimizer_chunk = 64ull << 20;  // bytes per chunk of the NVMe optimizer pipeline
  uint64_t optimizer_read_ahead = 0;       // pinned bytes of NVMe optimizer states read ahead
  uint64_t optimizer_host_bytes = 0;       // bytes of the NVMe optimizer's first units kept in RAM
  bool overlap_optimizer = true;  // step off-device states on a thread, overlapping the next forward
  // Whether any of params, grads, optimizer is "auto".
  bool any_auto() const { return params.automatic || grads.automatic || optimizer.automatic; }
};

struct ZeroConfig {
  int prefetch = 1;                    // units gathered ahead of the one computing
  bool reshard_after_forward = true;   // free the gathered copy after a unit's forward
  bool activation_checkpointing = false;
};

struct ParallelConfig {
  int dp = 0;  // data-parallel ranks; 0 = world / (tp * pp)
  int tp = 1;
  int pp = 1;
  PipelineSchedule pp_schedule = PipelineSchedule::one_f_one_b;
  std::vector<int> pp_layers;  // decoder blocks per stage; empty = balanced (engine/pipeline.h)
  // Megatron's sequence parallelism (tp > 1): norms and residual adds on 1/tp of the tokens,
  // all-gathers and reduce-scatters in place of the all-reduces.
  bool sequence_parallel = false;
  double timeout = 600;  // seconds a collective or stream wait may last before the job is ended
};

struct IoConfig {
  std::string backend = "auto";       // auto | uring | posix
  int queue_depth = 32;
  uint64_t block_size = 1ull << 20;
  int submit_batch = kDefaultSubmitBatch;  // io_uring entries per io_uring_enter (io/file_io.h)
  uint64_t stripe_size = 1ull << 20;  // bytes per stripe across several nvme_path directories
};

struct CheckpointConfig {
  std::string dir;     // root folder of the checkpoints; empty: none
  int every = 1000;    // steps between saves (also saved after the last step)
  int keep = 3;        // newest complete checkpoints kept
  bool async = true;   // write behind training (false: the save completes before the next step)
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  LogConfig log;
  OffloadConfig offload;
  ZeroConfig zero;
  ParallelConfig parallel;
  IoConfig io;
  CheckpointConfig checkpoint;
};

// Defaults, then the TOML file (if path is not empty), then each "section.key=value" override.
// Validates the result.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
// load_config on TOML text already in memory (empty text: the defaults); `origin` names the
// text in error messages, like a path.
Config parse_config(std::string_view toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides);
// Applies one "section.key=value" (value parsed by the key's type; sizes accept "2G").
void apply_override(Config& config, std::string_view assignment);
// The key an assignment sets, as apply_override reads it: "model.dim" of " model.dim = 64".
std::string override_key(std::string_view assignment);
// Impossible combinations, ranges, shapes (heads dividing dim, kv heads dividing heads, ...).
void validate(const Config& config);

// A run that writes none of a training run's files: no checkpoint (checkpoint.dir is not claimed)
// and no metrics file (log.metrics is not truncated). Benchmarks and `strata eval` run so; a
// trace (log.trace) is the caller's choice.
void clear_run_outputs(Config& config);
// The whole config as TOML (loadable by load_config) and as JSON (for manifests and metrics).
std::string config_to_toml(const Config& config);
nlohmann::json config_to_json(const Config& config);
// docs/config.md: every key, its type, default and meaning.
std::string config_reference_markdown();

// Whether the CUDA device's linear GEMMs take bf16 operands: train.matmul_precision = bf16, or
// auto under train.precision = bf16. (The CPU device always multiplies in f32.)
bool cuda_bf16_matmuls(const TrainConfig& t);

}  // namespace strata
