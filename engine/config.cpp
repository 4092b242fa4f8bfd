// engine/config.cpp — the configuration schema and everything it drives.
//
// One table, kKeys, lists every key once: section, name, type, allowed values or range, meaning,
// and where it lives in Config. Parsing TOML, `--set` overrides, range validation, printing as
// TOML and JSON, and docs/config.md are all loops over that table, so a key added here is parsed,
// checked, printed and documented at once. Defaults are read from a default-constructed Config.
// Rules between keys (heads dividing dim, ...) are written out in validate().
#include "engine/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/size.h"
#include "engine/file_util.h"

namespace strata {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::device: return "device";
    case Tier::host: return "host";
    case Tier::nvme: return "nvme";
  }
  return "?";
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

bool cuda_bf16_matmuls(const TrainConfig& t) {
  return t.matmul_precision == "bf16" ||
         (t.matmul_precision == "auto" && t.precision == Precision::bf16);
}

std::string_view schedule_name(Schedule s) {
  switch (s) {
    case Schedule::constant: return "constant";
    case Schedule::cosine: return "cosine";
  }
  return "?";
}

namespace {

// ---------------------------------------------------------------------------------------------
// The schema.

enum class Kind { integer, real, boolean, string, size, choice, string_list, int_list };

// Where a key's value lives. A choice key is stored either as its enum (choice i ↔ enum value i)
// or as the chosen string.
using Field = std::variant<int*, uint64_t*, float*, double*, bool*, std::string*, TierSetting*,
                           Precision*, Schedule*, RopeType*, PipelineSchedule*, DType*,
                           std::vector<std::string>*, std::vector<int>*>;

// Allowed numeric range; an unset bound is infinite. Integer and size keys have closed ranges
// with whole bounds below 2^53 (exact as doubles) and are compared exactly (contains_integer).
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  bool bounded() const { return std::isfinite(lo) || std::isfinite(hi); }
  bool contains(double v) const {
    bool above = lo_open ? v > lo : v >= lo;
    bool below = hi_open ? v < hi : v <= hi;
    return above && below;  // false for NaN
  }
  // An integer field: [lo, hi], or [lo, 2^63) without hi (TOML integers are signed 64-bit).
  template <class T>
  bool contains_integer(T v) const {
    if (std::isfinite(lo) && std::cmp_less(v, static_cast<int64_t>(lo))) return false;
    if (std::isfinite(hi)) return !std::cmp_greater(v, static_cast<int64_t>(hi));
    return std::cmp_less_equal(v, std::numeric_limits<int64_t>::max());
  }
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Range any() { return {}; }
constexpr Range at_least(double lo) { return {lo, kInf, false, false}; }
constexpr Range between(double lo, double hi) { return {lo, hi, false, false}; }
constexpr Range above_to(double lo, double hi) { return {lo, hi, true, false}; }  // (lo, hi]
constexpr Range unit_half_open() { return {0, 1, false, true}; }

struct Key {
  std::string_view section;
  std::string_view name;
  Field (*field)(Config&);
  Kind kind;
  std::string_view meaning;
  Range range = any();
  std::vector<std::string_view> choices = {};

  std::string full_name() const { return str(section, ".", name); }
};

template <auto Section, auto Member>
Field field_of(Config& c) {
  return &((c.*Section).*Member);
}

// Section and key names written once, so they always match the Config members.
#define STRATA_CONFIG_KEY(sec, key) \
  #sec, #key, &field_of<&Config::sec, &decltype(Config::sec)::key>

// Tier i of these is Tier(i); "auto" (last) sets TierSetting::automatic. Values are read and
// written by name through kTiers.
const std::vector<std::string_view> kTiers = {"device", "host", "nvme", "auto"};
constexpr size_t kAutoChoice = 3;
size_t choice_index(const TierSetting& t) { return t.automatic ? kAutoChoice : size_t(t.tier); }

// Bounds a user would accept, chosen so that every derived size fits in 64 bits and every
// dimension a kernel takes (tokens, widths, heads; QKV = 3 x dim at most, 2 x ffn_dim) fits in
// its int. Widths are at least 4x those of the largest public dense model (Llama 3.1 405B:
// dim 16384, 128 heads, ffn 53248, 126 layers, vocabulary 128256).
constexpr double kMaxTokens = 16777216;  // 2^24: vocab_size, max_seq_len, seq_len, B x T
constexpr double kMaxBytes = 1125899906842624.0;  // 1024T: the size keys that cap memory

const std::vector<Key>& keys() {
  static const std::vector<Key> kKeys = {
      // [model]
      {STRATA_CONFIG_KEY(model, dim), Kind::integer, "hidden size (HF hidden_size)",
       between(1, 65536)},
      {STRATA_CONFIG_KEY(model, n_layers), Kind::integer, "decoder blocks (HF num_hidden_layers)",
       between(1, 4096)},
      {STRATA_CONFIG_KEY(model, n_heads), Kind::integer,
       "query heads (HF num_attention_heads); divides dim, dim / n_heads even", between(1, 4096)},
      {STRATA_CONFIG_KEY(model, n_kv_heads), Kind::integer,
       "key/value heads (HF num_key_value_heads); divides n_heads", between(1, 4096)},
      {STRATA_CONFIG_KEY(model, ffn_dim), Kind::integer, "SwiGLU inner size (HF intermediate_size)",
       between(1, 1048576)},
      {STRATA_CONFIG_KEY(model, vocab_size), Kind::integer,
       "vocabulary size; raw text and the built-in tasks need 256", between(1, kMaxTokens)},
      {STRATA_CONFIG_KEY(model, max_seq_len), Kind::integer,
       "longest sequence (HF max_position_embeddings); data.seq_len <= max_seq_len",
       between(1, kMaxTokens)},
      {STRATA_CONFIG_KEY(model, rope_theta), Kind::real, "rotary embedding base (HF rope_theta)",
       between(1, 1e12)},
      {STRATA_CONFIG_KEY(model, rope_type), Kind::choice,
       "rotary frequencies as transformers computes them (HF rope_type): default = "
       "theta^(-2i/head_dim); linear = divided by rope_factor; llama3 = Llama 3.1 scaling of "
       "the low frequencies", any(), {"default", "linear", "llama3"}},
      {STRATA_CONFIG_KEY(model, rope_factor), Kind::real,
       "rope_type linear, llama3: frequency divisor (HF factor); 1 with default", between(1e-6, 1e6)},
      {STRATA_CONFIG_KEY(model, rope_low_freq_factor), Kind::real,
       "rope_type llama3: wavelengths above rope_original_max_position / rope_low_freq_factor are "
       "divided by rope_factor (HF low_freq_factor)", between(1e-6, 1e6)},
      {STRATA_CONFIG_KEY(model, rope_high_freq_factor), Kind::real,
       "rope_type llama3: wavelengths below rope_original_max_position / rope_high_freq_factor "
       "are kept, those between are interpolated (HF high_freq_factor); > rope_low_freq_factor",
       between(1e-6, 1e6)},
      {STRATA_CONFIG_KEY(model, rope_original_max_position), Kind::integer,
       "rope_type llama3: context length of pretraining (HF original_max_position_embeddings)",
       between(1, kMaxTokens)},
      {STRATA_CONFIG_KEY(model, norm_eps), Kind::real, "RMSNorm epsilon (HF rms_norm_eps)",
       above_to(0, 1)},
      {STRATA_CONFIG_KEY(model, tie_embeddings), Kind::boolean,
       "the output head shares the embedding matrix (HF tie_word_embeddings)"},
      {STRATA_CONFIG_KEY(model, init_std), Kind::real,
       "initial weights are normal(0, init_std) (HF initializer_range)", between(0, 10)},
      {STRATA_CONFIG_KEY(model, loss_chunk), Kind::integer,
       "tokens per chunk of the loss: logits of (loss_chunk, vocab_size / tp) are held at a "
       "time and recomputed in backward when there are several chunks; 0 = the whole "
       "micro-batch when its logits fit 256 MiB, else as many tokens as do",
       between(0, kMaxTokens)},
      // [data]
      {STRATA_CONFIG_KEY(data, path), Kind::string,
       "training tokens: a text file (bytes), an llm.c token file (.bin), or builtin:words, "
       "builtin:count, builtin:random"},
      {STRATA_CONFIG_KEY(data, seq_len), Kind::integer, "T: tokens per window (sequence length)",
       between(1, kMaxTokens)},
      {STRATA_CONFIG_KEY(data, micro_batch), Kind::integer,
       "B: windows per micro-batch per data-parallel rank; B x T <= 16777216", between(1, 65535)},
      {STRATA_CONFIG_KEY(data, shuffle), Kind::boolean,
       "permute the windows of each epoch (a pure function of train.seed and the epoch)"},
      // [train]
      {STRATA_CONFIG_KEY(train, steps), Kind::integer, "optimizer steps", between(0, 1e9)},
      {STRATA_CONFIG_KEY(train, lr), Kind::real, "peak learning rate", above_to(0, 10)},
      {STRATA_CONFIG_KEY(train, warmup_steps), Kind::integer,
       "steps of linear warmup: step k of W (from 1) runs at lr * k / W", between(0, 1e9)},
      {STRATA_CONFIG_KEY(train, schedule), Kind::choice, "learning-rate schedule after warmup",
       any(), {"constant", "cosine"}},
      {STRATA_CONFIG_KEY(train, min_lr_ratio), Kind::real,
       "cosine decays to lr * min_lr_ratio at the last step", between(0, 1)},
      {STRATA_CONFIG_KEY(train, weight_decay), Kind::real, "AdamW decoupled weight decay",
       between(0, 10)},
      {STRATA_CONFIG_KEY(train, decay_norms), Kind::boolean,
       "apply weight decay to the RMSNorm weights too (as torch.optim.AdamW over all parameters)"},
      {STRATA_CONFIG_KEY(train, beta1), Kind::real, "AdamW first-moment decay", unit_half_open()},
      {STRATA_CONFIG_KEY(train, beta2), Kind::real, "AdamW second-moment decay", unit_half_open()},
      {STRATA_CONFIG_KEY(train, eps), Kind::real, "AdamW epsilon", above_to(0, 1)},
      {STRATA_CONFIG_KEY(train, grad_clip), Kind::real,
       "global gradient-norm clipping threshold; 0 = off (then, with offload.overlap_optimizer, "
       "each unit's update runs during the backward once its gradient is final)", between(0, 1e6)},
      {STRATA_CONFIG_KEY(train, grad_accum), Kind::integer, "micro-batches per optimizer step",
       between(1, 65536)},
      {STRATA_CONFIG_KEY(train, precision), Kind::choice,
       "compute precision: fp32, or bf16 compute copy with f32 master weights", any(),
       {"fp32", "bf16"}},
      {STRATA_CONFIG_KEY(train, matmul_precision), Kind::choice,
       "operands of the linear layers' GEMMs on CUDA: f32 (CUDA cores, exact f32 products), bf16 "
       "(rounded to bf16 inside cuBLASLt and multiplied on the tensor cores, f32 accumulation: "
       "8x the f32 rate on an H200), auto = bf16 when precision = bf16, else f32. "
       "The CPU device multiplies in f32 (bf16 there is refused)", any(), {"auto", "f32", "bf16"}},
      {STRATA_CONFIG_KEY(train, optimizer_state_dtype), Kind::choice,
       "dtype of the AdamW m and v shards on every tier: f32, or bf16 (each update computed in "
       "f32, then rounded to nearest even; 20 instead of 28 optimizer bytes per parameter per "
       "step; master weights stay f32)", any(), {"f32", "bf16"}},
      {STRATA_CONFIG_KEY(train, seed), Kind::integer,
       "seed of initialization and shuffling (the built-in tasks do not depend on it)",
       at_least(0)},
      {STRATA_CONFIG_KEY(train, device), Kind::choice,
       "device to compute on; auto = cuda when available, else cpu", any(),
       {"cpu", "cuda", "auto"}},
      {STRATA_CONFIG_KEY(train, threads), Kind::integer,
       "CPU threads (oneTBB); 0 = all this process may use", between(0, 4096)},
      // [eval]
      {STRATA_CONFIG_KEY(eval, batches), Kind::integer,
       "micro-batches evaluated by strata eval and at the end of training; 0 = no evaluation "
       "after training", between(0, 1e6)},
      {STRATA_CONFIG_KEY(eval, path), Kind::string, "evaluation tokens; empty = data.path"},
      {STRATA_CONFIG_KEY(eval, every), Kind::integer,
       "also evaluate after every N steps (and the last); the loss goes into that step's metrics "
       "line as eval_loss. 0 = only after training", between(0, 1e9)},
      // [log]
      {STRATA_CONFIG_KEY(log, every), Kind::integer,
       "log a metrics line every N steps, and at step 1, the last step, every step that "
       "evaluated and the step a stop signal ended the run at", between(1, 1e9)},
      {STRATA_CONFIG_KEY(log, metrics), Kind::string,
       "JSONL file with one object per logged step; empty = none"},
      {STRATA_CONFIG_KEY(log, trace), Kind::string,
       "Chrome-trace (Perfetto) JSON timeline of steps 2 to 4 (after the warm-up step), written "
       "after step 4 or the last step if sooner; rank r > 0 writes PATH.rank<r>; empty = none"},
      {STRATA_CONFIG_KEY(log, peak_flops), Kind::real,
       "FLOP/s that MFU is measured against; 0 = measure the device's GEMM rate at start, as "
       "the run multiplies (CPU: f32; CUDA: f32, or with bf16 operands under "
       "train.matmul_precision)",
       between(0, 1e18)},
      // [offload]
      {STRATA_CONFIG_KEY(offload, params), Kind::choice,
       "tier of the parameters' compute copy (f32, or bf16 under train.precision = bf16; "
       "nvme with offload.optimizer = nvme: none stored, each gather rounds the master); "
       "auto = the fastest placement that fits (docs/tuning.md)", any(), kTiers},
      {STRATA_CONFIG_KEY(offload, grads), Kind::choice,
       "tier of the f32 gradient shards: device or host (host whenever offload.optimizer is off "
       "the device); nvme with offload.optimizer = nvme and train.grad_accum = 1: each unit's "
       "gradient is written during the backward and read back by its update, and RAM holds "
       "none but the kept units' (offload.optimizer_host_bytes); auto = chosen with the "
       "others", any(), kTiers},
      {STRATA_CONFIG_KEY(offload, optimizer), Kind::choice,
       "tier of the f32 master weights and AdamW m, v; off the device the CPU AdamW steps them; "
       "auto = chosen with the others", any(), kTiers},
      {STRATA_CONFIG_KEY(offload, device_mem_limit), Kind::size,
       "cap on device memory; 0 = the device's memory (CUDA: what is free when the device is "
       "created)", between(0, kMaxBytes)},
      {STRATA_CONFIG_KEY(offload, pinned_mem_limit), Kind::size,
       "budget of the pinned NVMe staging pools (host-resident shards are pinned "
       "but not in it); 0 = as the plan needs", between(0, kMaxBytes)},
      {STRATA_CONFIG_KEY(offload, nvme_path), Kind::string_list,
       "one directory per NVMe device (TOML array; comma-separated in --set); created if "
       "missing; a folder on a file system in memory (tmpfs, /dev/shm) works, and `strata plan` "
       "counts its swap files against RAM"},
      {STRATA_CONFIG_KEY(offload, prefetch), Kind::integer,
       "units of compute copy read ahead from NVMe (bounded by the pinned budget)",
       between(0, 64)},
      {STRATA_CONFIG_KEY(offload, optimizer_chunk), Kind::size,
       "bytes per chunk of the NVMe optimizer pipeline", between(4096, 4.0 * GiB)},
      {STRATA_CONFIG_KEY(offload, optimizer_read_ahead), Kind::size,
       "pinned host memory for optimizer states (offload.optimizer = nvme) read ahead of their "
       "update while the last backward runs: the first units' master, m and v in forward order, "
       "whose updates the next forward waits for; rounded down to whole chunks (less than one "
       "is refused), part of offload.pinned_mem_limit; unused, with a warning, without an "
       "overlapped NVMe optimizer (offload.overlap_optimizer). 0 = only the pipeline's next "
       "chunk (with offload.optimizer = \"auto\", the planner may set 0 and keep that memory's "
       "states in host memory instead)", between(0, kMaxBytes)},
      {STRATA_CONFIG_KEY(offload, optimizer_host_bytes), Kind::size,
       "with offload.optimizer = nvme: host memory per rank for the optimizer states (master, m, "
       "v) of the first units in forward order, whole units while they fit; those never go to "
       "NVMe (each byte kept saves a byte of NVMe reads and one of writes per step, and the "
       "updates the next forward waits for first run from memory), the rest live on NVMe. "
       "Ordinary host memory, not pinned; 0 = every unit's states on NVMe (with offload.optimizer "
       "= \"auto\", the planner may choose a value)", between(0, kMaxBytes)},
      {STRATA_CONFIG_KEY(offload, overlap_optimizer), Kind::boolean,
       "with offload.optimizer = host or nvme: the CPU AdamW steps units in forward order on a "
       "thread of its own while the next step's forward runs (a unit's forward waits only for its "
       "own update) and NVMe state reads start during the last backward; with train.grad_clip = 0 "
       "it steps each unit during the last backward as soon as its gradient is final; false steps "
       "every unit before the next forward. Same numbers either way"},
      // [zero]
      {STRATA_CONFIG_KEY(zero, prefetch), Kind::integer,
       "units gathered ahead of the one computing", between(0, 64)},
      {STRATA_CONFIG_KEY(zero, reshard_after_forward), Kind::boolean,
       "free a unit's gathered parameters after its forward and gather again in backward; false "
       "keeps every unit gathered from its forward to its backward (one slot per unit, no second "
       "gather)"},
      {STRATA_CONFIG_KEY(zero, activation_checkpointing), Kind::boolean,
       "recompute each unit's activations in backward instead of keeping them"},
      // [parallel]
      {STRATA_CONFIG_KEY(parallel, dp), Kind::integer,
       "data-parallel ranks; 0 = world size / (tp * pp)", between(0, 1048576)},
      {STRATA_CONFIG_KEY(parallel, tp), Kind::integer,
       "tensor-parallel ranks (Megatron layout: heads, ffn and vocabulary split); divides "
       "n_heads and ffn_dim, and divides n_kv_heads or is a multiple of it (kv heads are then "
       "replicated)", between(1, 1024)},
      {STRATA_CONFIG_KEY(parallel, sequence_parallel), Kind::boolean,
       "with tp > 1: RMSNorms and residual adds run on 1/tp of the micro-batch's tokens, "
       "all-gathers and reduce-scatters replace the all-reduces (activation memory of those "
       "parts divided by tp); data.micro_batch x data.seq_len must be a multiple of tp"},
      {STRATA_CONFIG_KEY(parallel, pp), Kind::integer,
       "pipeline stages (contiguous units each: the embedding goes with the first, the head with "
       "the last); at most n_layers + 2", between(1, 4098)},
      {STRATA_CONFIG_KEY(parallel, pp_schedule), Kind::choice,
       "pipeline schedule over the step's train.grad_accum micro-batches: 1f1b (one forward, one "
       "backward; the first stage holds at most pp micro-batches, needs grad_accum >= pp) or "
       "gpipe (every forward, then every backward; holds all of them)",
       any(), {"1f1b", "gpipe"}},
      {STRATA_CONFIG_KEY(parallel, pp_layers), Kind::int_list,
       "decoder blocks per stage (TOML array of pp integers summing to model.n_layers; "
       "comma-separated in --set); empty = balanced by a cost model of FLOPs and bytes",
       between(0, 1048576)},
      {STRATA_CONFIG_KEY(parallel, timeout), Kind::real,
       "seconds a collective or stream wait may last; past it the job is ended with a report "
       "naming the operation, the step and the ranks that did not arrive", between(1, 86400)},
      // [io]
      {STRATA_CONFIG_KEY(io, backend), Kind::choice,
       "file I/O backend; auto = io_uring when available, else POSIX", any(),
       {"auto", "uring", "posix"}},
      {STRATA_CONFIG_KEY(io, queue_depth), Kind::integer, "requests in flight per queue",
       between(1, 4096)},
      {STRATA_CONFIG_KEY(io, block_size), Kind::size,
       "bytes per I/O request; a multiple of 4096", between(4096, 1.0 * GiB)},
      {STRATA_CONFIG_KEY(io, submit_batch), Kind::integer,
       "io_uring: requests handed to the kernel per system call; up to 2 keeps the kernel from "
       "merging neighbouring requests into larger ones than io.block_size (on a virtio disk "
       "such merges cost 7-10 % of the bandwidth); more saves system calls at small block sizes",
       between(1, 4096)},
      {STRATA_CONFIG_KEY(io, stripe_size), Kind::size,
       "bytes per stripe across several nvme_path directories; a multiple of io.block_size",
       between(4096, 1.0 * TiB)},
      // [checkpoint]
      {STRATA_CONFIG_KEY(checkpoint, dir), Kind::string,
       "root folder of the checkpoints (step_N folders, `latest`); empty = no checkpoints"},
      {STRATA_CONFIG_KEY(checkpoint, every), Kind::integer,
       "steps between saves; the last step is saved too", between(1, 1e9)},
      {STRATA_CONFIG_KEY(checkpoint, keep), Kind::integer,
       "newest complete checkpoints kept; older ones are removed after each save", between(1, 1e6)},
      {STRATA_CONFIG_KEY(checkpoint, async), Kind::boolean,
       "write behind training (the next optimizer step waits only until the save has read the "
       "states: every write of this rank's file complete; the fsync and the commit run behind "
       "it); false: the save completes before the next step starts"},
  };
  return kKeys;
}

#undef STRATA_CONFIG_KEY

struct Section {
  std::string_view name;
  std::string_view meaning;
};

const std::vector<Section>& sections() {
  static const std::vector<Section> kSections = {
      {"model", "the Llama decoder: shapes and initialization"},
      {"data", "training tokens and the windows read from them"},
      {"train", "the optimization loop: AdamW, learning rate, clipping, precision"},
      {"eval", "evaluation"},
      {"log", "metrics, timelines and progress"},
      {"offload", "where each kind of state lives: device, host (pinned) or nvme"},
      {"zero", "the ZeRO-3 gather / reshard schedule"},
      {"parallel", "the process mesh: world = pp x dp x tp"},
      {"io", "asynchronous file I/O for the NVMe tier"},
      {"checkpoint", "sharded, checksummed checkpoints and resume (docs/checkpoint.md)"},
  };
  return kSections;
}

const Key* find_key(std::string_view section, std::string_view name) {
  for (const Key& k : keys())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

bool known_section(std::string_view section) {
  for (const Section& s : sections())
    if (s.name == section) return true;
  return false;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string section_keys(std::string_view section) {
  std::vector<std::string> names;
  for (const Key& k : keys())
    if (k.section == section) names.emplace_back(k.name);
  return join(names, ", ");
}

std::string section_names() {
  std::vector<std::string> names;
  for (const Section& s : sections()) names.emplace_back(s.name);
  return join(names, ", ");
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "did you mean 'n_heads'?" when one name is close; empty otherwise.
std::string suggestion(std::string_view wrong, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, wrong.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(wrong, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best.empty() ? "" : str("did you mean '", best, "'?");
}

[[noreturn]] void unknown_section(std::string_view where, std::string_view section,
                                  std::string_view origin) {
  std::vector<std::string> names;
  for (const Section& s : sections()) names.emplace_back(s.name);
  std::vector<std::string> hints;
  if (auto s = suggestion(section, names); !s.empty()) hints.push_back(s);
  hints.push_back(str("sections: ", section_names()));
  throw Error(std::string(where), str("unknown section [", section, "] in ", origin),
              std::move(hints));
}

[[noreturn]] void unknown_key(std::string_view where, std::string_view section,
                              std::string_view name, std::string_view origin) {
  std::vector<std::string> names;
  for (const Key& k : keys())
    if (k.section == section) names.emplace_back(k.name);
  std::vector<std::string> hints;
  if (auto s = suggestion(name, names); !s.empty()) hints.push_back(s);
  hints.push_back(str("keys of [", section, "]: ", section_keys(section)));
  throw Error(std::string(where), str("unknown key '", section, ".", name, "' in ", origin),
              std::move(hints));
}

std::string quoted_list(const std::vector<std::string_view>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += str("\"", items[i], "\"");
  }
  return out;
}

// "an integer", "one of \"fp32\", \"bf16\"", ...: what a key expects, for errors.
std::string expected_text(const Key& k) {
  switch (k.kind) {
    case Kind::integer: return "an integer";
    case Kind::real: return "a number";
    case Kind::boolean: return "true or false";
    case Kind::string: return "a string";
    case Kind::size: return "a size (a byte count, or a string like \"512M\", \"2G\")";
    case Kind::choice: return str("one of ", quoted_list(k.choices, ", "));
    case Kind::string_list: return "an array of strings";
    case Kind::int_list: return "an array of integers";
  }
  return "?";
}

// Short type names for docs/config.md.
std::string type_text(const Key& k) {
  switch (k.kind) {
    case Kind::integer: return "int";
    case Kind::real: return "float";
    case Kind::boolean: return "bool";
    case Kind::string: return "string";
    case Kind::size: return "size";
    case Kind::choice: return "enum";
    case Kind::string_list: return "list of strings";
    case Kind::int_list: return "list of ints";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Reading and writing one key's value.

// The config is only read through the returned pointer; fields are reached through one
// non-const accessor per key, shared by readers and writers.
Field field(const Key& k, const Config& c) { return k.field(const_cast<Config&>(c)); }

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// A TOML float: shortest text, with ".0" added where it would read as an integer.
std::string toml_float(std::string text) {
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // "n": inf, nan
  return text;
}

// A size as TOML: "64M" when that reads back exactly, else the byte count.
std::string toml_size(uint64_t v) {
  if (v >= KiB) {
    std::string s = format_bytes(v);
    try {
      if (parse_bytes(s) == v) return toml_string(s);
    } catch (const Error&) {
      // "12.06K" is rounded and not a whole number of bytes: print the count instead
    }
  }
  return std::to_string(v);
}

std::string toml_value(const Key& k, const Config& c) {
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int>) return std::to_string(*p);
        else if constexpr (std::is_same_v<T, uint64_t>)
          return k.kind == Kind::size ? toml_size(*p) : std::to_string(*p);
        else if constexpr (std::is_same_v<T, float>) return toml_float(fileutil::float_text(*p));
        else if constexpr (std::is_same_v<T, double>) return toml_float(fileutil::double_text(*p));
        else if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return toml_string(*p);
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::vector<std::string> q;
          for (const auto& s : *p) q.push_back(toml_string(s));
          std::string list = "[";
          list += join(q, ", ");
          list += ']';
          return list;
        } else if constexpr (std::is_same_v<T, std::vector<int>>) {
          std::vector<std::string> q;
          for (int i : *p) q.push_back(std::to_string(i));
          return str("[", join(q, ", "), "]");
        } else if constexpr (std::is_same_v<T, TierSetting>) {
          return toml_string(kTiers.at(choice_index(*p)));
        } else {
          return toml_string(k.choices.at(static_cast<size_t>(*p)));  // an enum
        }
      },
      field(k, c));
}

nlohmann::json json_value(const Key& k, const Config& c) {
  return std::visit(
      [&](auto* p) -> nlohmann::json {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, float>) return fileutil::float_as_decimal(*p);
        else if constexpr (std::is_enum_v<T>) return k.choices.at(static_cast<size_t>(*p));
        else if constexpr (std::is_same_v<T, TierSetting>) return kTiers.at(choice_index(*p));
        else return *p;
      },
      field(k, c));
}

// Describes a TOML node for an error: `string "abc"`, `float 3.5`, `array [1, 2]`.
std::string node_text(const toml::node& n) {
  std::ostringstream os;
  os << n.type() << ' ';
  n.visit([&](auto&& v) { os << v; });
  std::string s = os.str();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Parsed values on their way into a field; the kind of the key says which member is set.
struct Value {
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string s;
  std::vector<std::string> list;
  std::vector<int64_t> ints;
  uint64_t bytes = 0;
};

std::string toml_value(const Key& k, const Config& c);

// "model.dim (int, default 256): hidden size (HF hidden_size)" — the hint under a key's errors.
std::string key_hint(const Key& k) {
  static const Config defaults;
  return str(k.full_name(), " (", type_text(k), ", default ", toml_value(k, defaults), "): ",
             k.meaning);
}

[[noreturn]] void wrong_type(std::string_view where, const Key& k, std::string_view got,
                             std::string_view origin) {
  fail(std::string(where),
       str(k.full_name(), ": expected ", expected_text(k), ", got ", got, " (", origin, ")"),
       key_hint(k));
}

[[noreturn]] void out_of_range(std::string_view where, const Key& k, std::string_view value,
                               std::string_view allowed, std::string_view origin = {}) {
  std::string in = origin.empty() ? std::string() : str(" (", origin, ")");
  fail(std::string(where),
       str(k.full_name(), " = ", value, " is out of range; allowed: ", allowed, in),
       key_hint(k));
}

// "1e+12" → "1e12": a real bound as a user would write it.
std::string real_text(double v) {
  std::string t = fileutil::double_text(v);
  if (size_t e = t.find("e+"); e != std::string::npos) {
    size_t digits = t.find_first_not_of('0', e + 2);
    t = t.substr(0, e + 1) + t.substr(digits);
  }
  return t;
}

// The allowed range as errors and docs/config.md print it: "[1, 4096]", "(0, 1]", "[4K, 1G]".
std::string range_text(const Key& k) {
  const Range& r = k.range;
  auto bound = [&](double v) -> std::string {
    if (k.kind == Kind::size) return format_bytes(static_cast<uint64_t>(v));
    if (k.kind == Kind::integer) return std::to_string(static_cast<int64_t>(v));
    return real_text(v);
  };
  if (!r.bounded()) return "";
  if (!std::isfinite(r.hi))
    return k.kind == Kind::integer ? str("[", bound(r.lo), ", 2^63)")
                                   : str(r.lo_open ? "> " : ">= ", bound(r.lo));
  if (!std::isfinite(r.lo)) return str(r.hi_open ? "< " : "<= ", bound(r.hi));
  return str(r.lo_open ? "(" : "[", bound(r.lo), ", ", bound(r.hi), r.hi_open ? ")" : "]");
}

// Stores a parsed value into the key's field. Integer width and enum membership are checked
// here; numeric ranges are checked by validate().
void store(std::string_view where, const Key& k, const Value& v, Config& c,
           std::string_view origin) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int>) {
          if (v.i < std::numeric_limits<int>::min() || v.i > std::numeric_limits<int>::max())
            out_of_range(where, k, std::to_string(v.i), range_text(k), origin);
          *p = static_cast<int>(v.i);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (k.kind == Kind::size) {
            *p = v.bytes;
          } else {
            if (v.i < 0) out_of_range(where, k, std::to_string(v.i), range_text(k), origin);
            *p = static_cast<uint64_t>(v.i);
          }
        } else if constexpr (std::is_same_v<T, float>) {
          if (std::isfinite(v.d) && std::abs(v.d) > std::numeric_limits<float>::max())
            out_of_range(where, k, fileutil::double_text(v.d), "a finite 32-bit float", origin);
          *p = static_cast<float>(v.d);
        } else if constexpr (std::is_same_v<T, double>) {
          *p = v.d;
        } else if constexpr (std::is_same_v<T, bool>) {
          *p = v.b;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          *p = v.list;
        } else if constexpr (std::is_same_v<T, std::vector<int>>) {
          p->clear();
          for (int64_t i : v.ints) {
            if (!k.range.contains_integer(i))
              out_of_range(where, k, std::to_string(i), range_text(k), origin);
            p->push_back(static_cast<int>(i));
          }
        } else if (k.kind == Kind::string) {
          if constexpr (std::is_same_v<T, std::string>) *p = v.s;
        } else {  // a choice: an enum or a string
          auto it = std::find(k.choices.begin(), k.choices.end(), v.s);
          if (it == k.choices.end())
            fail(std::string(where),
                 str(k.full_name(), ": \"", v.s, "\" is not allowed; allowed: ",
                     quoted_list(k.choices, ", "), " (", origin, ")"),
                 key_hint(k));
          const size_t i = size_t(it - k.choices.begin());
          if constexpr (std::is_same_v<T, std::string>) *p = v.s;
          else if constexpr (std::is_same_v<T, TierSetting>) {
            const auto t = size_t(std::find(kTiers.begin(), kTiers.end(), v.s) - kTiers.begin());
            p->automatic = t == kAutoChoice;
            p->tier = p->automatic ? Tier::device : Tier(t);
          } else *p = static_cast<T>(i);
        }
      },
      k.field(c));
}

// A TOML node → Value, by the key's kind.
Value from_toml(std::string_view where, const Key& k, const toml::node& n, std::string_view origin) {
  Value v;
  auto bad = [&]() { wrong_type(where, k, node_text(n), origin); };
  switch (k.kind) {
    case Kind::integer:
      if (!n.is_integer()) bad();
      v.i = n.as_integer()->get();
      break;
    case Kind::real:
      if (n.is_floating_point()) v.d = n.as_floating_point()->get();
      else if (n.is_integer()) v.d = static_cast<double>(n.as_integer()->get());
      else bad();
      break;
    case Kind::boolean:
      if (!n.is_boolean()) bad();
      v.b = n.as_boolean()->get();
      break;
    case Kind::string:
    case Kind::choice:
      if (!n.is_string()) bad();
      v.s = n.as_string()->get();
      break;
    case Kind::size:
      if (n.is_integer()) {
        int64_t i = n.as_integer()->get();
        if (i < 0) out_of_range(where, k, std::to_string(i), range_text(k), origin);
        v.bytes = static_cast<uint64_t>(i);
      } else if (n.is_string()) {
        try {
          v.bytes = parse_bytes(n.as_string()->get(), k.full_name());
        } catch (const Error& e) {
          throw Error(std::string(where), str(e.what_failed(), " (", origin, ")"), e.hints());
        }
      } else {
        bad();
      }
      break;
    case Kind::string_list:
      if (!n.is_array()) bad();
      for (const toml::node& item : *n.as_array()) {
        if (!item.is_string()) bad();
        v.list.push_back(item.as_string()->get());
      }
      break;
    case Kind::int_list:
      if (!n.is_array()) bad();
      for (const toml::node& item : *n.as_array()) {
        if (!item.is_integer()) bad();
        v.ints.push_back(item.as_integer()->get());
      }
      break;
  }
  return v;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether s is well-formed UTF-8: no stray or missing continuation bytes, overlong forms,
// surrogates or code points past U+10FFFF.
bool valid_utf8(std::string_view s) {
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};  // by continuation bytes
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80             ? 0  // continuation bytes after the lead byte
                     : (c & 0xE0) == 0xC0 ? 1
                     : (c & 0xF0) == 0xE0 ? 2
                     : (c & 0xF8) == 0xF0 ? 3
                                          : 4;  // a stray continuation byte or 0xF8..0xFF
    if (n == 4 || s.size() - i <= n) return false;
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (size_t j = 1; j <= n; ++j) {
      const auto d = static_cast<unsigned char>(s[i + j]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// The text of a --set value → Value, by the key's kind.
Value from_text(std::string_view where, const Key& k, std::string_view text,
                std::string_view origin) {
  Value v;
  auto bad = [&]() { wrong_type(where, k, str("'", text, "'"), origin); };
  // TOML files are UTF-8 (toml++ checks); a --set string becomes TOML and JSON text too.
  if ((k.kind == Kind::string || k.kind == Kind::string_list) && !valid_utf8(text))
    fail(std::string(where), str(k.full_name(), ": the value is not UTF-8 text (", origin, ")"),
         "configuration strings must be UTF-8: the printed config (TOML) and the JSON of "
         "manifests and metrics cannot hold other bytes");
  const char* b = text.data();
  const char* e = text.data() + text.size();
  switch (k.kind) {
    case Kind::integer: {
      auto [p, ec] = std::from_chars(b, e, v.i);
      if (ec == std::errc::result_out_of_range)
        out_of_range(where, k, text, range_text(k), origin);
      if (ec != std::errc() || p != e || text.empty()) bad();
      break;
    }
    case Kind::real: {
      auto [p, ec] = std::from_chars(b, e, v.d);
      if (ec != std::errc() || p != e || text.empty()) bad();
      break;
    }
    case Kind::boolean:
      if (text == "true" || text == "1") v.b = true;
      else if (text == "false" || text == "0") v.b = false;
      else bad();
      break;
    case Kind::string:
    case Kind::choice:
      v.s = std::string(text);
      if (v.s.size() >= 2 && (v.s.front() == '"' || v.s.front() == '\'') && v.s.back() == v.s.front())
        v.s = v.s.substr(1, v.s.size() - 2);
      break;
    case Kind::size:
      try {
        v.bytes = parse_bytes(text, k.full_name());
      } catch (const Error& err) {
        throw Error(std::string(where), str(err.what_failed(), " (", origin, ")"), err.hints());
      }
      break;
    case Kind::string_list: {  // "/a, /b" and "/a,/b,"; an empty item elsewhere stays, and
                               // the key's check names it (",/b" is more often a lost variable
                               // than a wish for one folder)
      std::string_view rest = text;
      while (!trim(rest).empty()) {
        size_t comma = rest.find(',');
        v.list.emplace_back(trim(rest.substr(0, comma)));
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      break;
    }
    case Kind::int_list: {  // "3,5" or "[3, 5]"
      std::string_view rest = trim(text);
      if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']')
        rest = rest.substr(1, rest.size() - 2);
      while (!trim(rest).empty()) {
        size_t comma = rest.find(',');
        std::string_view item = trim(rest.substr(0, comma));
        int64_t i = 0;
        auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), i);
        if (ec != std::errc() || p != item.data() + item.size() || item.empty()) bad();
        v.ints.push_back(i);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
      break;
    }
  }
  return v;
}

// Whether a key's value is finite and in its range; integer fields compare exactly.
bool in_range(const Key& k, const Config& c) {
  return std::visit(
      [&](auto* p) -> bool {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>)
          return k.range.contains_integer(*p);
        else if constexpr (std::is_floating_point_v<T>)
          return std::isfinite(*p) && (!k.range.bounded() || k.range.contains(double(*p)));
        else return true;
      },
      field(k, c));
}

// "1, 2, 4, 8": the divisors of n, the first `limit` of them.
std::string divisors_text(int n, int limit = 12) {
  std::vector<std::string> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i != 0) continue;
    if (static_cast<int>(d.size()) == limit) {
      d.push_back("...");
      break;
    }
    d.push_back(std::to_string(i));
  }
  return join(d, ", ");
}

std::string escape_cell(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += "\\|";
    else out += ch;
  }
  return out;
}

// The rotary keys a rope type does not use must keep their defaults: a setting that would be
// silently ignored is an error. llama3 needs rope_high_freq_factor > rope_low_freq_factor.
void validate_rope(const ModelConfig& m) {
  constexpr const char* kWhere = "config::validate";
  static const ModelConfig defaults;
  const std::string type = str("model.rope_type = \"", rope_type_name(m.rope_type), "\"");
  auto unused = [&](bool changed, const char* key, const std::string& value, const char* users) {
    if (changed)
      fail(kWhere, str("model.", key, " = ", value, " has no effect with ", type),
           str("model.", key, " is used by model.rope_type = ", users,
               "; set the rope type, or leave model.", key, " at its default"));
  };
  if (m.rope_type == RopeType::plain)
    unused(m.rope_factor != defaults.rope_factor, "rope_factor",
           fileutil::double_text(m.rope_factor), "\"linear\" and \"llama3\"");
  if (m.rope_type != RopeType::llama3) {
    unused(m.rope_low_freq_factor != defaults.rope_low_freq_factor, "rope_low_freq_factor",
           fileutil::double_text(m.rope_low_freq_factor), "\"llama3\"");
    unused(m.rope_high_freq_factor != defaults.rope_high_freq_factor, "rope_high_freq_factor",
           fileutil::double_text(m.rope_high_freq_factor), "\"llama3\"");
    unused(m.rope_original_max_position != defaults.rope_original_max_position,
           "rope_original_max_position", std::to_string(m.rope_original_max_position),
           "\"llama3\"");
  }
  if (m.rope_type == RopeType::llama3 && !(m.rope_high_freq_factor > m.rope_low_freq_factor))
    fail(kWhere,
         str("model.rope_high_freq_factor = ", fileutil::double_text(m.rope_high_freq_factor),
             " must be greater than model.rope_low_freq_factor = ",
             fileutil::double_text(m.rope_low_freq_factor)),
         "llama3 interpolates between the two wavelength bounds; Llama 3.1 uses 1 and 4");
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string override_key(std::string_view assignment) {
  return std::string(trim(assignment.substr(0, assignment.find('='))));
}

void apply_override(Config& config, std::string_view assignment) {
  constexpr std::string_view kWhere = "config::set";
  std::string origin = str("--set ", assignment);
  size_t eq = assignment.find('=');
  std::string_view lhs = trim(assignment.substr(0, eq));
  size_t dot = lhs.find('.');
  if (eq == std::string_view::npos || dot == std::string_view::npos)
    fail(std::string(kWhere), str("'", assignment, "' is not section.key=value"),
         "example: --set train.lr=1e-3 --set offload.device_mem_limit=2G");
  std::string_view section = lhs.substr(0, dot);
  std::string_view name = lhs.substr(dot + 1);
  if (!known_section(section)) unknown_section(kWhere, section, origin);
  const Key* k = find_key(section, name);
  if (!k) unknown_key(kWhere, section, name, origin);
  store(kWhere, *k, from_text(kWhere, *k, trim(assignment.substr(eq + 1)), origin), config, origin);
}

namespace {

void apply_toml(Config& config, const toml::table& root, const std::string& origin) {
  constexpr std::string_view kWhere = "config::load";
  for (const auto& [sec_key, node] : root) {
    std::string_view section = sec_key.str();
    if (!known_section(section)) {
      if (!node.is_table())
        fail(std::string(kWhere), str("key '", section, "' outside a section in ", origin),
             str("put each key under its section, e.g. [train] then lr = 1e-3; sections: ",
                 section_names()));
      unknown_section(kWhere, section, origin);
    }
    if (!node.is_table())
      fail(std::string(kWhere), str("'", section, "' must be a section ([", section, "]) in ", origin));
    for (const auto& [key, value] : *node.as_table()) {
      const Key* k = find_key(section, key.str());
      if (!k) unknown_key(kWhere, section, key.str(), origin);
      std::string where_in = origin;
      if (const auto& src = value.source(); src.begin)
        where_in = str(origin, ":", src.begin.line);
      store(kWhere, *k, from_toml(kWhere, *k, value, where_in), config, where_in);
    }
  }
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config("", "(no config file)", overrides);
  return parse_config(fileutil::read_file(path, "config::load"), path, overrides);
}

Config parse_config(std::string_view toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Config config;
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    fail("config::load", str(origin, ":", at.line, ":", at.column, ": ", e.description()),
         "the file must be TOML: [section] headers, then key = value lines");
  }
  apply_toml(config, root, origin);
  for (const std::string& o : overrides) apply_override(config, o);
  validate(config);
  return config;
}

void clear_run_outputs(Config& config) {
  config.checkpoint.dir.clear();
  config.log.metrics.clear();
}

void validate(const Config& c) {
  constexpr const char* kWhere = "config::validate";
  for (const Key& k : keys()) {
    if (in_range(k, c)) continue;
    std::string value = toml_value(k, c);
    if (k.kind == Kind::size && value.front() == '"') value = value.substr(1, value.size() - 2);
    out_of_range(kWhere, k, value, k.range.bounded() ? range_text(k) : "a finite number");
  }
  const ModelConfig& m = c.model;
  if (m.dim % m.n_heads != 0)
    fail(kWhere,
         str("model.dim = ", m.dim, " is not divisible by model.n_heads = ", m.n_heads),
         str("allowed model.n_heads for dim ", m.dim, ": ", divisors_text(m.dim)));
  if (m.n_heads % m.n_kv_heads != 0)
    fail(kWhere,
         str("model.n_kv_heads = ", m.n_kv_heads, " does not divide model.n_heads = ", m.n_heads),
         str("allowed model.n_kv_heads for n_heads ", m.n_heads, ": ", divisors_text(m.n_heads, 64)));
  if (m.head_dim() % 2 != 0)
    fail(kWhere,
         str("head_dim = model.dim / model.n_heads = ", m.dim, " / ", m.n_heads, " = ",
             m.head_dim(), " is odd; rotary embeddings need an even head_dim"),
         "choose n_heads so that dim / n_heads is even");
  validate_rope(m);
  if (c.data.seq_len > m.max_seq_len)
    fail(kWhere,
         str("data.seq_len = ", c.data.seq_len, " exceeds model.max_seq_len = ", m.max_seq_len),
         "allowed: data.seq_len <= model.max_seq_len; raise model.max_seq_len or lower seq_len");
  if (const int64_t tokens = int64_t(c.data.micro_batch) * c.data.seq_len; tokens > kMaxTokens)
    fail(kWhere,
         str("data.micro_batch x data.seq_len = ", c.data.micro_batch, " x ", c.data.seq_len,
             " = ", tokens, " tokens per micro-batch exceeds ", int64_t(kMaxTokens)),
         "allowed: data.micro_batch x data.seq_len <= 16777216; lower either, and raise "
         "train.grad_accum for as many tokens per step");

  if (c.eval.every > 0 && c.eval.batches == 0)
    fail(kWhere, str("eval.every = ", c.eval.every, " needs eval.batches >= 1, and it is 0"),
         "set eval.batches to the number of micro-batches to evaluate, or eval.every = 0");

  const OffloadConfig& o = c.offload;
  // "auto" is checked when it is resolved (engine/step_model.h): nvme is a candidate only with
  // offload.nvme_path.
  if (!o.grads.automatic && o.grads == Tier::nvme) {
    // A gradient on NVMe is written once, whole, when the backward has finished it: summing
    // several micro-batches into it would read it back and write it again for each.
    if (!o.optimizer.automatic && o.optimizer != Tier::nvme)
      fail(kWhere,
           str("offload.grads = \"nvme\" needs offload.optimizer = \"nvme\", and it is \"",
               tier_name(o.optimizer), "\""),
           "set offload.optimizer = \"nvme\" (the update reads the gradient beside the states it "
           "reads from NVMe), or offload.grads = \"host\"");
    if (c.train.grad_accum != 1)
      fail(kWhere,
           str("offload.grads = \"nvme\" needs train.grad_accum = 1, and it is ",
               c.train.grad_accum),
           "set offload.grads = \"host\" to sum several micro-batches a step, or raise "
           "data.micro_batch instead of train.grad_accum");
  }
  const bool params_nvme = !o.params.automatic && o.params == Tier::nvme;
  const bool optimizer_nvme = !o.optimizer.automatic && o.optimizer == Tier::nvme;
  if ((params_nvme || optimizer_nvme) && o.nvme_path.empty())
    fail(kWhere,
         str("offload.", params_nvme ? "params" : "optimizer",
             " = \"nvme\" needs offload.nvme_path, which is empty"),
         "set offload.nvme_path to one directory per NVMe device, e.g. "
         "--set offload.nvme_path=/mnt/nvme0,/mnt/nvme1");
  auto normal = [](const std::string& d) {
    std::filesystem::path p = std::filesystem::path(d).lexically_normal();
    return p.has_filename() || p.parent_path().empty() ? p : p.parent_path();  // "a/" as "a"
  };
  for (size_t i = 0; i < o.nvme_path.size(); ++i) {
    if (o.nvme_path[i].empty())
      fail(kWhere, str("offload.nvme_path's entry ", i + 1, " of ", o.nvme_path.size(),
                       " is an empty folder name"),
           "name a folder on each NVMe device, e.g. nvme_path = [\"/mnt/nvme0\"]");
    for (size_t j = 0; j < i; ++j)
      if (normal(o.nvme_path[i]) == normal(o.nvme_path[j]))
        fail(kWhere, str("offload.nvme_path names '", o.nvme_path[j], "' twice"),
             "give each NVMe device's folder once: two stripes on one disk gain nothing (a "
             "second folder or a symlink on the same disk shares its free space)");
  }
  if (o.optimizer_host_bytes && !o.optimizer.automatic && o.optimizer != Tier::nvme)
    fail(kWhere,
         str("offload.optimizer_host_bytes = ", format_bytes(o.optimizer_host_bytes),
             " keeps part of an NVMe optimizer in host memory, but offload.optimizer = \"",
             tier_name(o.optimizer), "\""),
         "set offload.optimizer = \"nvme\" (or \"auto\"), or drop offload.optimizer_host_bytes");
  if (c.io.block_size % 4096 != 0)
    fail(kWhere, str("io.block_size = ", c.io.block_size, " is not a multiple of 4096"),
         "allowed: 4096, 64K, 1M, ...");
  if (c.io.stripe_size % c.io.block_size != 0)
    fail(kWhere,
         str("io.stripe_size = ", format_bytes(c.io.stripe_size),
             " is not a multiple of io.block_size = ", format_bytes(c.io.block_size)));

  const ParallelConfig& p = c.parallel;
  auto tp_fits = [&](int tp) {
    return m.n_heads % tp == 0 && m.ffn_dim % tp == 0 &&
           (m.n_kv_heads % tp == 0 || tp % m.n_kv_heads == 0) && m.vocab_size >= tp;
  };
  if (!tp_fits(p.tp)) {
    std::string allowed;
    for (int tp = 1; tp <= m.n_heads; ++tp)
      if (tp_fits(tp)) allowed += str(allowed.empty() ? "" : ", ", tp);
    fail(kWhere,
         str("parallel.tp = ", p.tp, " must divide model.n_heads = ", m.n_heads,
             " and model.ffn_dim = ", m.ffn_dim, ", divide model.n_kv_heads = ", m.n_kv_heads,
             " or be a multiple of it, and not exceed model.vocab_size = ", m.vocab_size),
         str("allowed parallel.tp for this model: ", allowed));
  }
  if (p.sequence_parallel && (int64_t(c.data.micro_batch) * c.data.seq_len) % p.tp != 0)
    fail(kWhere,
         str("parallel.sequence_parallel splits the ", int64_t(c.data.micro_batch) * c.data.seq_len,
             " tokens of a micro-batch (data.micro_batch x data.seq_len) over parallel.tp = ", p.tp,
             " ranks, which does not divide them"),
         "choose data.micro_batch and data.seq_len whose product is a multiple of parallel.tp");
  if (const int64_t units = int64_t(m.n_layers) + 2; p.pp > units)
    fail(kWhere,
         str("parallel.pp = ", p.pp, " exceeds the model's ", units, " units (embedding, ",
             m.n_layers, " blocks, head)"),
         str("allowed: parallel.pp <= model.n_layers + 2 = ", units));
  if (!p.pp_layers.empty()) {
    int64_t total = 0;
    std::vector<std::string> items;
    for (int n : p.pp_layers) {
      total += n;
      items.push_back(std::to_string(n));
    }
    const std::string given = str("parallel.pp_layers = [", join(items, ", "), "]");
    if (int64_t(p.pp_layers.size()) != p.pp)
      fail(kWhere, str(given, " names ", p.pp_layers.size(), " stages but parallel.pp = ", p.pp),
           "give one block count per stage, or leave parallel.pp_layers empty for a balanced split");
    if (total != m.n_layers)
      fail(kWhere, str(given, " sums to ", total, " blocks but model.n_layers = ", m.n_layers),
           "the block counts of parallel.pp_layers must sum to model.n_layers");
    for (size_t s = 1; s + 1 < p.pp_layers.size(); ++s)
      if (p.pp_layers[s] == 0)
        fail(kWhere, str(given, ": stage ", s, " would hold no unit (only the first stage has the "
                         "embedding and only the last the head)"),
             "give every middle stage at least one block");
  }
  if (p.pp > 1 && m.tie_embeddings)
    fail(kWhere,
         "parallel.pp > 1 with model.tie_embeddings = true: the embedding (first stage) and the "
         "head (last stage) would share one weight across stages, which strata does not do",
         "untie the head (model.tie_embeddings = false) or set parallel.pp = 1");
  if (p.pp > 1 && p.pp_schedule == PipelineSchedule::one_f_one_b && c.train.grad_accum < p.pp)
    fail(kWhere,
         str("parallel.pp_schedule = \"1f1b\" needs at least parallel.pp = ", p.pp,
             " micro-batches per step, but train.grad_accum = ", c.train.grad_accum),
         str("set train.grad_accum >= ", p.pp, " (more micro-batches also shrink the bubble), or "
             "parallel.pp_schedule = \"gpipe\""));
}

std::string config_to_toml(const Config& c) {
  std::string out = "# strata configuration (`strata config --markdown` documents every key)\n";
  for (const Section& s : sections()) {
    out += str("\n[", s.name, "]  # ", s.meaning, "\n");
    std::vector<std::pair<std::string, std::string>> lines;
    size_t width = 0;
    for (const Key& k : keys()) {
      if (k.section != s.name) continue;
      std::string line = str(k.name, " = ", toml_value(k, c));
      width = std::max(width, line.size());
      lines.emplace_back(std::move(line), std::string(k.meaning));
    }
    for (auto& [line, meaning] : lines)
      out += str(line, std::string(width - line.size() + 2, ' '), "# ", meaning, "\n");
  }
  return out;
}

nlohmann::json config_to_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const Section& s : sections()) j[std::string(s.name)] = nlohmann::json::object();
  for (const Key& k : keys()) j[std::string(k.section)][std::string(k.name)] = json_value(k, c);
  return j;
}

std::string config_reference_markdown() {
  const Config defaults;
  std::string out;
  out += "# Configuration reference\n\n";
  out += "<!-- Generated by `strata config --markdown` from the schema in engine/config.cpp; "
         "do not edit by hand. A unit test fails when this file is out of date. -->\n\n";
  out += "A run's configuration starts from the defaults below (what `strata train` with no "
         "arguments runs), then a TOML file (`--config FILE`), then each `--set section.key=value` "
         "override, in that order. `strata config [--config FILE] [--set k=v]...` prints the "
         "effective configuration as TOML.\n\n";
  out += "- Unknown sections or keys, values of the wrong type, values out of range and "
         "impossible combinations are errors that name the key and what is allowed.\n";
  out += "- Every number has a range (the allowed column). Shapes are bounded so that every "
         "size derived from them fits in 64 bits and every dimension a kernel takes fits in a "
         "32-bit int; widths are at least 4 times those of the largest public dense models.\n";
  out += "- Sizes are bytes: a plain integer, or a string with a binary suffix: `\"512M\"`, "
         "`\"2G\"`, `\"1.5T\"` (K = 1024). `B`, `iB` after the suffix change nothing: `\"2GB\"` "
         "and `\"2GiB\"` are both 2 × 1024³ bytes, as fio reads them.\n";
  out += "- In `--set`, a value is parsed by the key's type: `--set train.lr=1e-3`, "
         "`--set offload.device_mem_limit=2G`, `--set offload.nvme_path=/mnt/a,/mnt/b`.\n\n";
  out += "Example:\n\n```toml\n[model]\ndim = 512\nn_layers = 8\n\n[data]\npath = "
         "\"tokens.bin\"\nseq_len = 256\n\n[train]\nlr = 1e-3\nprecision = \"bf16\"\n\n"
         "[offload]\ndevice_mem_limit = \"2G\"\n```\n";
  for (const Section& s : sections()) {
    out += str("\n## [", s.name, "] — ", s.meaning, "\n\n");
    out += "| key | type | default | allowed | meaning |\n";
    out += "|---|---|---|---|---|\n";
    for (const Key& k : keys()) {
      if (k.section != s.name) continue;
      std::string allowed =
          k.kind == Kind::choice ? quoted_list(k.choices, ", ") : range_text(k);
      out += str("| `", k.name, "` | ", type_text(k), " | `", escape_cell(toml_value(k, defaults)),
                 "` | ", escape_cell(allowed), " | ", escape_cell(k.meaning), " |\n");
    }
  }
  out += "\n## Rules between keys\n\n";
  out += "- `model.n_heads` divides `model.dim`, and `model.dim / model.n_heads` (the head "
         "size) is even (rotary embeddings rotate pairs).\n";
  out += "- `model.n_kv_heads` divides `model.n_heads` (grouped-query attention).\n";
  out += "- `model.rope_factor` applies to `model.rope_type = \"linear\"` and `\"llama3\"`; "
         "`model.rope_low_freq_factor`, `model.rope_high_freq_factor` and "
         "`model.rope_original_max_position` to `\"llama3\"` only, where "
         "`rope_high_freq_factor > rope_low_freq_factor`. A key its rope type does not use must "
         "keep its default.\n";
  out += "- `data.seq_len <= model.max_seq_len`, and `data.micro_batch x data.seq_len <= "
         "16777216` (2^24 tokens per micro-batch).\n";
  out += "- Raw text files and the built-in tasks are bytes: they need `model.vocab_size >= 256`; "
         "every token of a token file must be below `model.vocab_size`.\n";
  out += "- `offload.grads = \"nvme\"` needs `offload.optimizer = \"nvme\"` and "
         "`train.grad_accum = 1`; otherwise, when `offload.optimizer` is off the device, "
         "gradients live in host memory whatever `offload.grads` says.\n";
  out += "- `offload.params = \"nvme\"` or `offload.optimizer = \"nvme\"` needs "
         "`offload.nvme_path`, whose folders are named once each and never empty (`strata "
         "plan` checks the swap files against each file system's free space once, however "
         "many of the folders are on it).\n";
  out += "- `offload.optimizer_host_bytes > 0` needs `offload.optimizer = \"nvme\"` (or "
         "`\"auto\"`).\n";
  out += "- `eval.every > 0` needs `eval.batches >= 1`.\n";
  out += "- `\"auto\"` in `offload.params`, `offload.grads` or `offload.optimizer` lets `strata "
         "train` choose those tiers (the others stay as written) before anything is allocated: the "
         "fastest placement that fits by the step model and the measured rates of this machine "
         "(`strata plan --auto` prints every candidate); `nvme` is a candidate only with "
         "`offload.nvme_path`.\n";
  out += "- A `data.path` ending in `.bin` must be an llm.c token file (magic 20240520); any "
         "other file is a token file when it starts with that magic, else raw bytes.\n";
  out += "- `io.block_size` is a multiple of 4096 and `io.stripe_size` a multiple of "
         "`io.block_size`.\n";
  out += "- `parallel.tp` divides `model.n_heads` and `model.ffn_dim`, divides "
         "`model.n_kv_heads` or is a multiple of it, and is at most `model.vocab_size`; "
         "`parallel.pp <= model.n_layers + 2`.\n";
  out += "- `parallel.pp_layers`, when given, has `parallel.pp` entries that sum to "
         "`model.n_layers`, and every stage but the first and the last holds at least one "
         "block.\n";
  out += "- `parallel.pp > 1` needs `model.tie_embeddings = false`, and with "
         "`parallel.pp_schedule = \"1f1b\"` `train.grad_accum >= parallel.pp`.\n";
  out += "- `parallel.sequence_parallel` needs `data.micro_batch x data.seq_len` to be a multiple "
         "of `parallel.tp`.\n";
  out += "- Every rank of a job runs the same configuration (with `--init-from`, the model its "
         "folder describes): at start-up rank 0's is compared with every rank's, and a key that "
         "differs stops the job on every rank, naming the rank, the key and both values. Only keys "
         "that describe a rank's own machine may differ: `offload.nvme_path`, `train.threads`, "
         "`io.*`, `log.metrics` and `log.trace`.\n";
  return out;
}

}  // namespace strata
