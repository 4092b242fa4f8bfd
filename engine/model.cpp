// engine/model.cpp — units and layouts of the Llama decoder, initialization, and the unit
// forward/backward passes on a device (ModelRunner).
#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "core/error.h"
#include "core/size.h"
#include "kernels/ops.h"
#include "kernels/rope_tables.h"

namespace strata {
namespace {

// ---- counter-based initialization -------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A standard normal sample that is a pure function of (key, index): Box–Muller on two 53-bit
// uniforms drawn from splitmix64 of the counter.
double normal_at(uint64_t key, uint64_t index) {
  uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Element counts of activations: 64-bit and overflow-checked. A validated config always fits
// (engine/config.cpp bounds it); a hand-built absurd shape is an Error, not a wrapped size.
constexpr const char* kActFloats = "activation floats";
uint64_t mul(uint64_t a, uint64_t b) { return checked_mul(a, b, kActFloats); }
uint64_t sum(std::initializer_list<uint64_t> terms) {
  uint64_t total = 0;
  for (uint64_t t : terms) total = checked_add(total, t, kActFloats);
  return total;
}

}  // namespace

// ---- LlamaModel -------------------------------------------------------------------------------

// Part i of n items split into `parts` nearly equal contiguous parts: [begin, end).
static int64_t part_begin(int64_t n, int parts, int i) { return n * i / parts; }

TpShard tp_shard(const ModelConfig& c, int tp, int index) {
  const int H = c.n_heads, KVH = c.n_kv_heads;
  if (tp < 1 || index < 0 || index >= tp || H % tp != 0 || c.ffn_dim % tp != 0 ||
      (KVH % tp != 0 && tp % KVH != 0) || c.vocab_size < tp)
    fail("model::tp", str("parallel.tp = ", tp, " does not split this model (n_heads ", H,
                          ", n_kv_heads ", KVH, ", ffn_dim ", c.ffn_dim, ", vocab_size ",
                          c.vocab_size, ")"),
         "parallel.tp must divide n_heads and ffn_dim and divide or be a multiple of n_kv_heads");
  TpShard t;
  t.size = tp;
  t.index = index;
  t.heads = H / tp;
  t.first_head = index * t.heads;
  t.ffn = c.ffn_dim / tp;
  if (KVH >= tp) {
    t.kv_heads = KVH / tp;
    t.first_kv_head = index * t.kv_heads;
  } else {  // each kv head serves tp / KVH ranks: the one their query heads read
    t.kv_heads = 1;
    t.kv_replicas = tp / KVH;
    t.first_kv_head = index / t.kv_replicas;
  }
  t.vocab_begin = int(part_begin(c.vocab_size, tp, index));
  t.vocab_rows = int(part_begin(c.vocab_size, tp, index + 1) - t.vocab_begin);
  return t;
}

LlamaModel::LlamaModel(const ModelConfig& c, int dp, int tp, int tp_index, StageUnits stage)
    : cfg_(c), tp_(tp_shard(c, tp, tp_index)), stage_(stage) {
  const int64_t C = c.dim, V = c.vocab_size, F = c.ffn_dim, D = c.head_dim();
  const int64_t H = c.n_heads, KVH = c.n_kv_heads;
  const TpShard& t = tp_;
  const int64_t Hl = t.heads, KVl = t.kv_heads, Fl = t.ffn, Vl = t.vocab_rows;
  const bool norm_primary = t.index == 0;              // norms: every tp rank holds them whole
  const bool kv_primary = t.index % t.kv_replicas == 0;  // the first rank of each kv head's group

  UnitSpec emb;
  emb.kind = UnitKind::embedding;
  emb.name = "embedding";
  emb.layout.add_slice("model.embed_tokens.weight", {Vl, C}, {V, C}, 0, t.vocab_begin, true);
  units_.push_back(std::move(emb));

  for (int l = 0; l < c.n_layers; ++l) {
    UnitSpec b;
    b.kind = UnitKind::block;
    b.layer = l;
    b.name = str("block.", l);
    const std::string p = str("model.layers.", l, ".");
    FlatLayout& L = b.layout;
    L.add_slice(p + "input_layernorm.weight", {C}, {C}, -1, 0, norm_primary, true);
    // q, k, v adjacent (one GEMM), column-parallel by heads
    L.add_slice(p + "self_attn.q_proj.weight", {Hl * D, C}, {H * D, C}, 0, t.first_head * D, true);
    L.add_slice(p + "self_attn.k_proj.weight", {KVl * D, C}, {KVH * D, C}, 0, t.first_kv_head * D,
                kv_primary);
    L.add_slice(p + "self_attn.v_proj.weight", {KVl * D, C}, {KVH * D, C}, 0, t.first_kv_head * D,
                kv_primary);
    L.add_slice(p + "self_attn.o_proj.weight", {C, Hl * D}, {C, H * D}, 1, t.first_head * D, true);
    L.add_slice(p + "post_attention_layernorm.weight", {C}, {C}, -1, 0, norm_primary, true);
    // gate, up adjacent (one GEMM), column-parallel; down row-parallel
    L.add_slice(p + "mlp.gate_proj.weight", {Fl, C}, {F, C}, 0, t.index * Fl, true);
    L.add_slice(p + "mlp.up_proj.weight", {Fl, C}, {F, C}, 0, t.index * Fl, true);
    L.add_slice(p + "mlp.down_proj.weight", {C, Fl}, {C, F}, 1, t.index * Fl, true);
    units_.push_back(std::move(b));
  }

  UnitSpec head;
  head.kind = UnitKind::head;
  head.name = "head";
  head.layout.add_slice("model.norm.weight", {C}, {C}, -1, 0, norm_primary, true);
  if (!c.tie_embeddings)
    head.layout.add_slice("lm_head.weight", {Vl, C}, {V, C}, 0, t.vocab_begin, true);
  units_.push_back(std::move(head));

  for (auto& u : units_) u.layout.finalize(dp);
  all_units_ = units_;
  const int U = int(units_.size());
  if (stage_.begin == 0 && stage_.end == 0) stage_.end = U;
  STRATA_CHECK(stage_.begin >= 0 && stage_.begin < stage_.end && stage_.end <= U, "model::stage",
               "units [", stage_.begin, ", ", stage_.end, ") of a model with ", U);
  units_.assign(all_units_.begin() + stage_.begin, all_units_.begin() + stage_.end);
  for (const auto& u : units_)
    if (u.kind == UnitKind::block) {
      if (layers_here_ == 0) first_layer_ = u.layer;
      ++layers_here_;
    }
  if (layers_here_ == 0) first_layer_ = stage_.begin == 0 ? 0 : c.n_layers;
}

int64_t LlamaModel::num_params() const {
  int64_t n = 0;
  for (const auto& u : all_units_)
    for (const auto& v : u.layout.views())
      n = checked_add(n, checked_cast<int64_t>(v.global_numel(), "tensor numel"), "parameter count");
  return n;
}

double LlamaModel::train_flops_per_token(int T) const {
  double matmul = 0;
  for (const auto& u : all_units_) {
    if (u.kind == UnitKind::embedding) continue;  // a lookup, not a matmul
    for (const auto& v : u.layout.views())
      if (!v.is_norm) matmul += static_cast<double>(v.global_numel());
  }
  if (cfg_.tie_embeddings) matmul += static_cast<double>(cfg_.vocab_size) * cfg_.dim;
  return 6.0 * matmul + attention_flops_per_token(T);
}

double LlamaModel::attention_flops_per_token(int T) const {
  return 6.0 * cfg_.n_layers * static_cast<double>(T) * cfg_.dim;
}

void LlamaModel::init_values(int u, uint64_t seed, size_t begin, size_t count, float* out) const {
  const FlatLayout& L = unit(u).layout;
  std::memset(out, 0, count * sizeof(float));
  size_t end = begin + count;
  for (const auto& v : L.views()) {
    size_t vb = v.offset, ve = v.offset + v.numel;
    size_t b = std::max(vb, begin), e = std::min(ve, end);
    if (b >= e) continue;
    if (v.is_norm) {
      for (size_t i = b; i < e; ++i) out[i - begin] = 1.0f;
      continue;
    }
    uint64_t key = splitmix64(seed) ^ fnv1a(v.name);
    for (size_t i = b; i < e; ++i)
      out[i - begin] = static_cast<float>(cfg_.init_std * normal_at(key, v.global_index(i - vb)));
  }
}

// ---- activations ------------------------------------------------------------------------------

// Local sizes under tensor parallelism: H, KVH, F are this rank's; R = rows of the residual
// stream here (N, or N/tp with sequence parallelism).
struct ModelRunner::BlockActs {
  float* ln1 = nullptr;   // (R, C) input_layernorm output
  float* rstd1 = nullptr; // (R)
  float* qkv = nullptr;   // (N, QKV): q | k | v per row, q and k after rotary
  float* att = nullptr;   // (N, H·D) attention output, heads concatenated
  float* lse = nullptr;   // (B, H, T)
  float* x1 = nullptr;    // (R, C) residual after attention
  float* ln2 = nullptr;   // (R, C)
  float* rstd2 = nullptr; // (R)
  float* gu = nullptr;    // (N, 2F): gate | up per row
  float* h = nullptr;     // (N, F) silu(gate) * up
};

namespace {

// Local sizes of a tp rank's share: heads, kv heads, ffn and vocabulary rows.
struct LocalDims {
  uint64_t H, KVH, F, V, D;
  uint64_t HD() const { return H * D; }
  uint64_t QKV() const { return (H + 2 * KVH) * D; }
};
LocalDims local_dims(const ModelConfig& c, const TpShard& t) {
  return LocalDims{uint64_t(t.heads), uint64_t(t.kv_heads), uint64_t(t.ffn),
                   uint64_t(t.vocab_rows), uint64_t(c.head_dim())};
}

// Floats of one block's saved activations for N tokens, R of them in the residual stream here.
uint64_t block_act_floats(const ModelConfig& c, const LocalDims& d, int B, int T, uint64_t R) {
  const uint64_t N = mul(B, T), C = c.dim;
  return sum({mul(R, 3 * C), 2 * R, mul(N, d.QKV()), mul(N, d.HD()), mul(mul(B, d.H), T),
              mul(N, 3 * d.F)});
}

constexpr uint64_t kAlignFloats = 64;  // 256 bytes between sub-arrays
uint64_t pad(uint64_t n) { return sum({n, kAlignFloats - 1}) / kAlignFloats * kAlignFloats; }

}  // namespace

int loss_chunk_rows(const ModelConfig& c, int B, int T, int tp) {
  const uint64_t N = mul(B, T);
  if (c.loss_chunk > 0) return int(std::min<uint64_t>(N, uint64_t(c.loss_chunk)));
  const uint64_t Vl = uint64_t(tp_shard(c, tp, 0).vocab_rows);  // rank 0 holds the most
  const uint64_t fit = std::max<uint64_t>(1, kAutoLogitsBytes / mul(Vl, 4));
  return int(std::min(N, fit));
}

uint64_t logits_bytes(const ModelConfig& c, int B, int T, int tp) {
  const uint64_t rows = uint64_t(loss_chunk_rows(c, B, T, tp));
  return mul(pad(mul(rows, uint64_t(tp_shard(c, tp, 0).vocab_rows))), 4);
}

namespace {

// What the activation bytes depend on besides the config: the stage's blocks, whether it holds
// the head and whether it is one stage of several (the boundary gradients).
struct StageShape {
  uint64_t layers = 0;
  bool embedding = true, head = true, pipe = false;
};

uint64_t stage_activation_bytes(const ModelConfig& c, int B, int T, bool ckpt, int tp, bool sp,
                                int slots, const StageShape& st);

}  // namespace

uint64_t activation_bytes(const ModelConfig& c, int B, int T, bool ckpt, int tp, bool sp) {
  STRATA_CHECK(B > 0 && T > 0, "model::activation_bytes", "B = ", B, ", T = ", T);
  return stage_activation_bytes(c, B, T, ckpt, tp, sp, 1, StageShape{uint64_t(c.n_layers)});
}

uint64_t activation_bytes(const LlamaModel& model, int B, int T, bool ckpt, bool sp, int slots) {
  STRATA_CHECK(B > 0 && T > 0 && slots > 0, "model::activation_bytes", "B = ", B, ", T = ", T,
               ", slots = ", slots);
  return stage_activation_bytes(model.config(), B, T, ckpt, model.tp().size, sp, slots,
                                StageShape{uint64_t(model.layers_here()), model.has_embedding(),
                                           model.has_head(), !model.whole()});
}

namespace {

uint64_t stage_activation_bytes(const ModelConfig& c, int B, int T, bool ckpt, int tp, bool sp,
                                int slots, const StageShape& st) {
  const LocalDims d = local_dims(c, tp_shard(c, tp, 0));
  const uint64_t N = mul(B, T), C = c.dim;
  sp = sp && tp > 1;
  const uint64_t R = sp ? N / uint64_t(tp) : N;  // rows of the residual stream here
  const uint64_t layers = st.layers;
  const bool head = st.head, pipe = st.pipe;
  const uint64_t block_set = sum({block_act_floats(c, d, B, T, R), 10 * kAlignFloats});
  // One micro-batch's own buffers (a pipeline stage holds `slots` of them).
  const uint64_t per_slot = sum({
      ckpt ? 0 : mul(layers, block_set),                                  // saved activations
      mul(layers + 1, pad(mul(R, C))),                                    // residual stream
      2 * pad(N),                                                         // tokens
      head ? sum({pad(mul(N, C)), pad(R), pad(N)}) : 0,                   // head: lnf, rstd, lse
      head && sp ? pad(mul(R, C)) : 0,                                    // sp: lnf rows
      pipe && !head ? pad(mul(R, C)) : 0,                                 // d(stage output)
      pipe && !st.embedding ? pad(mul(R, C)) : 0,                         // d(stage input)
  });
  const uint64_t shared = sum({
      ckpt ? block_set : 0,                                               // recomputed activations
      head ? sum({pad(N), pad(mul(N, 2)), pad(mul(mul(N, 2), uint64_t(tp)))}) : 0,  // losses, parts
      sp ? mul(pad(mul(N, C)), 2) : 0,                                    // sp: gathers
      pad(mul(R, C)), pad(mul(N, C)), pad(mul(N, d.HD())),                // backward scratch
      pad(mul(N, d.QKV())), pad(mul(N, 2 * d.F)), pad(mul(N, d.F)),
      pad(mul(uint64_t(T), c.head_dim())),                                // rope cos | sin tables
  });
  return checked_add(sum({mul(sum({mul(per_slot, uint64_t(slots)), shared}), 4),
                          head ? logits_bytes(c, B, T, tp) : 0}),
                     uint64_t(4096),  // loss slots
                     "activation bytes");
}

}  // namespace

ModelRunner::ModelRunner(const LlamaModel& model, Device& device, int B, int T, bool ckpt,
                         int max_heads, TpOptions comms, int micro_slots)
    : model_(model), device_(device), B_(B), T_(T), ckpt_(ckpt), comms_(comms),
      max_heads_(max_heads) {
  const ModelConfig& c = model.config();
  const TpShard& tp = model.tp();
  STRATA_CHECK(B > 0 && T > 0 && max_heads > 0 && micro_slots > 0, "model::runner", "B = ", B,
               ", T = ", T, ", max_heads = ", max_heads, ", micro_slots = ", micro_slots);
  STRATA_CHECK(tp.size == 1 || (comms.tp && comms.tp->size() == tp.size &&
                                comms.tp->rank() == tp.index),
               "model::runner", "tensor parallelism over ", tp.size,
               " ranks needs the tp communicator of this rank");
  STRATA_CHECK(tp.kv_replicas == 1 || (comms.kv && comms.kv->size() == tp.kv_replicas),
               "model::runner", "replicated kv heads need the communicator of their ",
               tp.kv_replicas, " ranks");
  const LocalDims d = local_dims(c, tp);
  const uint64_t N = mul(B, T), C = c.dim, F = d.F;
  const uint64_t HD = d.HD(), QKV = d.QKV();
  // The kernels take these as int (forward and backward narrow them unchecked).
  (void)checked_cast<int>(N, "tokens per micro-batch (B x T)");
  (void)checked_cast<int>(QKV, "qkv_dim");
  (void)checked_cast<int>(2 * F, "2 x ffn_dim");
  sp_ = comms.sequence_parallel && tp.size > 1;
  STRATA_CHECK(!sp_ || N % uint64_t(tp.size) == 0, "model::runner", "sequence parallelism splits ",
               N, " tokens over ", tp.size, " ranks");
  const uint64_t R = sp_ ? N / uint64_t(tp.size) : N;
  rows_ = int(R);
  (void)activation_bytes(model, B, T, ckpt, sp_, micro_slots);  // every size below fits in 64 bits
  chunk_ = loss_chunk_rows(c, B, T, tp.size);
  // Several micro-batches in flight: a head backward may follow other head forwards, so the
  // logits are always recomputed from the kept normed input (the parts path).
  whole_logits_ = tp.size == 1 && uint64_t(chunk_) == N && micro_slots == 1;
  recompute_logits_ = uint64_t(chunk_) < N || micro_slots > 1;
  const bool head = model.has_head(), pipe = !model.whole();
  const int layers = model.layers_here();

  auto alloc = [&](uint64_t floats, const char* what) {
    buffers_.push_back(device.alloc(floats * 4, what));
    return buffers_.back().as<float>();
  };

  // Rotary cos | sin tables (T, D/2) each, computed once on the host as transformers does.
  const RopeTables rope = rope_tables(rope_inv_freq(c.rope(), c.head_dim()), T);
  float* tables = alloc(rope.cos.size() + rope.sin.size(), "rope tables");
  {
    auto upload = device.make_stream("rope tables");
    upload->copy(tables, rope.cos.data(), rope.cos.size() * 4);
    upload->copy(tables + rope.cos.size(), rope.sin.data(), rope.sin.size() * 4);
    upload->synchronize();
  }
  rope_cos_ = tables;
  rope_sin_ = tables + rope.cos.size();

  buffers_.push_back(device.alloc(uint64_t(max_heads) * 8, "loss slots"));
  loss_slots_ = buffers_.back().as<double>();

  auto block_set = [&](BlockActs& a) {
    float* p = alloc(block_act_floats(c, d, B, T, R) + 10 * kAlignFloats, "block activations");
    auto take = [&](uint64_t n) {
      float* r = p;
      p += pad(n);
      return r;
    };
    a.ln1 = take(R * C);
    a.rstd1 = take(R);
    a.qkv = take(N * QKV);
    a.att = take(N * HD);
    a.lse = take(uint64_t(B) * d.H * T);
    a.x1 = take(R * C);
    a.ln2 = take(R * C);
    a.rstd2 = take(R);
    a.gu = take(N * 2 * F);
    a.h = take(N * F);
  };
  BlockActs recomputed;  // activation checkpointing: one set, recomputed in backward
  if (ckpt) block_set(recomputed);
  slots_.resize(size_t(micro_slots));
  for (Slot& sl : slots_) {
    buffers_.push_back(device.alloc(2 * N * 4, "token buffers"));
    sl.inputs = buffers_.back().as<int32_t>();
    sl.targets = sl.inputs + N;
    for (int l = 0; l <= layers; ++l) sl.xs.push_back(alloc(R * C, "residual stream activations"));
    if (ckpt) {
      sl.acts.assign(1, recomputed);
    } else {
      sl.acts.resize(size_t(layers));
      for (auto& a : sl.acts) block_set(a);
    }
    if (head) {
      sl.lnf = alloc(N * C, "head activations");
      sl.rstdf = alloc(R, "head activations");
      sl.ce_lse = alloc(N, "loss parts");
      if (sp_) sl.lnf_rows = alloc(R * C, "head activations");
    }
    if (pipe && !head) sl.dout = alloc(R * C, "pipeline gradients");
    if (pipe && !model.has_embedding()) sl.din = alloc(R * C, "pipeline gradients");
  }
  if (sp_) {
    full_ = alloc(N * C, "sequence-parallel gathers");
    dfull_ = alloc(N * C, "sequence-parallel gathers");
  }
  if (head) {
    logits_ = alloc(uint64_t(chunk_) * d.V, "logits");
    losses_ = alloc(N, "per-token losses");
    if (!whole_logits_) {
      ce_stats_ = alloc(2 * N, "loss parts");
      ce_stats_all_ = tp.size > 1 ? alloc(2 * N * uint64_t(tp.size), "loss parts") : ce_stats_;
    }
  }
  dx_ = alloc(R * C, "backward scratch");
  dln_ = alloc(N * C, "backward scratch");
  datt_ = alloc(N * HD, "backward scratch");
  dqkv_ = alloc(N * QKV, "backward scratch");
  dgu_ = alloc(N * 2 * F, "backward scratch");
  dh_ = alloc(N * F, "backward scratch");
  use_slot(0);
}

void ModelRunner::use_slot(int k) {
  STRATA_CHECK(k >= 0 && k < int(slots_.size()), "model::use_slot", "slot ", k, " of ",
               slots_.size(), " micro-batch slots");
  const Slot& sl = slots_[size_t(k)];
  slot_ = k;
  inputs_ = sl.inputs;
  targets_ = sl.targets;
  xs_ = sl.xs;
  acts_ = sl.acts;
  lnf_ = sl.lnf;
  rstdf_ = sl.rstdf;
  ce_lse_ = sl.ce_lse;
  lnf_rows_ = sl.lnf_rows;
}

size_t ModelRunner::boundary_floats() const { return size_t(rows_) * model_.config().dim; }
float* ModelRunner::stage_input() { return xs_.front(); }
float* ModelRunner::stage_output() { return xs_.back(); }
float* ModelRunner::grad_output() {
  STRATA_CHECK(slots_[size_t(slot_)].dout, "model::grad_output", "the last stage has no output gradient to receive");
  return slots_[size_t(slot_)].dout;
}
float* ModelRunner::grad_input() {
  STRATA_CHECK(slots_[size_t(slot_)].din, "model::grad_input", "the first stage sends no input gradient");
  return slots_[size_t(slot_)].din;
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::load_batch(Stream& s, const int32_t* inputs, const int32_t* targets) {
  size_t n = size_t(B_) * T_;
  if (inputs) s.copy(inputs_, inputs, n * 4);
  if (targets) s.copy(targets_, targets, n * 4);
}

void ModelRunner::copy_losses(Stream& s, double* host_out) {
  if (n_losses_ > 0) s.copy(host_out, loss_slots_, size_t(n_losses_) * 8);
}

void ModelRunner::copy_logits(Stream& s, float* host_out) {
  STRATA_CHECK(whole_logits_, "model::copy_logits",
               "the logits are not held whole (tensor parallelism or model.loss_chunk splits them)");
  s.copy(host_out, logits_, size_t(B_) * T_ * model_.config().vocab_size * 4);
}

uint64_t ModelRunner::take_tp_bytes() { return std::exchange(tp_bytes_, 0); }

// The tp group's sum of a partial result (row-parallel outputs, column-parallel input
// gradients), in place on the compute stream: the Megatron "g" / "f" conjugate pair.
void ModelRunner::tp_all_reduce(Stream& s, float* buf, size_t count) {
  if (!comms_.tp) return;
  comms_.tp->all_reduce(s, buf, count, CommType::f32, ReduceOp::sum);
  tp_bytes_ += count * 4;
}

void ModelRunner::sp_all_gather(Stream& s, float* full, const float* rows) {
  const size_t n = size_t(rows_) * model_.config().dim;
  comms_.tp->all_gather(s, full, rows, n, CommType::f32);
  tp_bytes_ += n * 4 * size_t(comms_.tp->size());
}

void ModelRunner::sp_reduce_scatter(Stream& s, float* rows, const float* full) {
  const size_t n = size_t(rows_) * model_.config().dim;
  comms_.tp->reduce_scatter(s, rows, full, n, CommType::f32, ReduceOp::sum);
  tp_bytes_ += n * 4 * size_t(comms_.tp->size());
}

void ModelRunner::sp_sum_norm_grad(Stream& s, float* dw) {
  if (!sp_) return;
  const size_t n = size_t(model_.config().dim);
  comms_.tp->all_reduce(s, dw, n, CommType::f32, ReduceOp::sum);
  tp_bytes_ += n * 4;
}

// ---- forward ----------------------------------------------------------------------------------

void ModelRunner::block_forward(Stream& s, int layer, const float* p, BlockActs& a,
                                const float* x, float* x_out) {
  const ModelConfig& c = model_.config();
  const TpShard& tp = model_.tp();
  Ops& ops = device_.ops();
  // Local sizes: this rank's heads, kv heads and ffn columns (all of them with tp = 1).
  const int N = B_ * T_, C = c.dim, F = tp.ffn, H = tp.heads, KVH = tp.kv_heads;
  const int D = c.head_dim(), HD = H * D, QKV = (H + 2 * KVH) * D;  // int: checked at construction
  const FlatLayout& L = model_.unit(model_.block_unit(layer)).layout;
  const std::string pre = str("model.layers.", layer, ".");
  const float* w_ln1 = p + L.view(pre + "input_layernorm.weight").offset;
  const float* w_qkv = p + L.view(pre + "self_attn.q_proj.weight").offset;  // (QKV, C)
  const float* w_o = p + L.view(pre + "self_attn.o_proj.weight").offset;    // (C, HD)
  const float* w_ln2 = p + L.view(pre + "post_attention_layernorm.weight").offset;
  const float* w_gu = p + L.view(pre + "mlp.gate_proj.weight").offset;      // (2F, C)
  const float* w_d = p + L.view(pre + "mlp.down_proj.weight").offset;       // (C, F)

  // Sequence parallelism: x, x_out, ln1, x1, ln2 hold this rank's R = N/tp rows; the
  // column-parallel linears read the all-gathered norm output (full_), and the row-parallel
  // ones write a partial sum over all N rows (full_ again) that is reduce-scattered.
  const int R = rows_;
  ops.rmsnorm_fwd(s, a.ln1, a.rstd1, x, w_ln1, R, C, c.norm_eps);
  const float* ln1 = a.ln1;
  if (sp_) {
    sp_all_gather(s, full_, a.ln1);
    ln1 = full_;
  }
  ops.linear_fwd(s, a.qkv, ln1, w_qkv, N, C, QKV);
  ops.rope_fwd(s, a.qkv, rope_cos_, rope_sin_, B_, T_, H, D, QKV);          // q
  ops.rope_fwd(s, a.qkv + HD, rope_cos_, rope_sin_, B_, T_, KVH, D, QKV);   // k
  ops.attention_fwd(s, a.att, a.lse, a.qkv, a.qkv + HD, a.qkv + HD + KVH * D, B_, T_, H, KVH, D,
                    QKV, QKV);
  if (sp_) {
    ops.linear_fwd(s, full_, a.att, w_o, N, HD, C);                   // this rank's heads' part
    sp_reduce_scatter(s, a.x1, full_);
  } else {
    ops.linear_fwd(s, a.x1, a.att, w_o, N, HD, C);
    tp_all_reduce(s, a.x1, size_t(N) * C);
  }
  ops.add(s, a.x1, a.x1, x, size_t(R) * C);                           // x1 = x + o
  ops.rmsnorm_fwd(s, a.ln2, a.rstd2, a.x1, w_ln2, R, C, c.norm_eps);
  const float* ln2 = a.ln2;
  if (sp_) {
    sp_all_gather(s, full_, a.ln2);
    ln2 = full_;
  }
  ops.linear_fwd(s, a.gu, ln2, w_gu, N, C, 2 * F);
  ops.swiglu_fwd(s, a.h, a.gu, a.gu + F, N, F, 2 * F);
  if (sp_) {
    ops.linear_fwd(s, full_, a.h, w_d, N, F, C);                      // this rank's ffn part
    sp_reduce_scatter(s, x_out, full_);
  } else {
    ops.linear_fwd(s, x_out, a.h, w_d, N, F, C);
    tp_all_reduce(s, x_out, size_t(N) * C);
  }
  ops.add(s, x_out, x_out, a.x1, size_t(R) * C);                      // out = x1 + mlp
}

// Vocabulary-parallel loss, chunk by chunk: logits of `chunk_` tokens over this rank's
// vocabulary rows, their partial log-sum-exp and target logit; then every rank's parts
// (one all-gather of (N, 2)) combine into the per-token losses and the full log-sum-exp.
void ModelRunner::head_forward_parts(Stream& s, const float* w_head) {
  const ModelConfig& c = model_.config();
  const TpShard& tp = model_.tp();
  Ops& ops = device_.ops();
  const int N = B_ * T_, C = c.dim, V = c.vocab_size, Vp = tp.vocab_rows;
  for (int n0 = 0; n0 < N; n0 += chunk_) {
    const int n = std::min(chunk_, N - n0);
    ops.linear_fwd(s, logits_, lnf_ + size_t(n0) * C, w_head, n, C, Vp);  // (n, Vp)
    ops.cross_entropy_part_fwd(s, ce_stats_ + 2 * size_t(n0), logits_, targets_ + n0, n, Vp,
                               tp.vocab_begin, V);
  }
  if (comms_.tp) {
    comms_.tp->all_gather(s, ce_stats_all_, ce_stats_, 2 * size_t(N), CommType::f32);
    tp_bytes_ += 2 * size_t(N) * 4 * size_t(tp.size);
  }
  ops.cross_entropy_combine(s, losses_, ce_lse_, ce_stats_all_, targets_, N, tp.size);
}

void ModelRunner::forward(Stream& s, int u, const float* p, const float* embedding_params) {
  const ModelConfig& c = model_.config();
  const TpShard& tp = model_.tp();
  Ops& ops = device_.ops();
  const int N = B_ * T_, C = c.dim, V = c.vocab_size;
  const UnitSpec& unit = model_.unit(u);
  switch (unit.kind) {
    case UnitKind::embedding:
      if (tp.size == 1) {
        ops.embedding_fwd(s, xs_[0], inputs_, p, N, C, V);
      } else if (sp_) {  // each rank's vocabulary rows; the sum, scattered by tokens
        ops.embedding_part_fwd(s, full_, inputs_, p, N, C, V, tp.vocab_begin, tp.vocab_rows);
        sp_reduce_scatter(s, xs_[0], full_);
      } else {  // each rank looks up the tokens of its vocabulary rows; the sum is the lookup
        ops.embedding_part_fwd(s, xs_[0], inputs_, p, N, C, V, tp.vocab_begin, tp.vocab_rows);
        tp_all_reduce(s, xs_[0], size_t(N) * C);
      }
      return;
    case UnitKind::block: {
      const int l = unit.layer;
      const size_t i = size_t(l - model_.first_layer());  // this stage's block index
      block_forward(s, l, p, acts_[ckpt_ ? 0 : i], xs_[i], xs_[i + 1]);
      return;
    }
    case UnitKind::head: {
      STRATA_CHECK(n_losses_ < max_heads_, "model::forward", "more head forwards (",
                   n_losses_ + 1, ") than loss slots (", max_heads_, ") since reset_loss()");
      const FlatLayout& L = unit.layout;
      const float* w_norm = p + L.view("model.norm.weight").offset;
      const float* w_head = model_.tied() ? embedding_params : p + L.view("lm_head.weight").offset;
      STRATA_CHECK(w_head != nullptr, "model::forward", "tied head needs the embedding's parameters");
      if (sp_) {  // the final norm on this rank's rows; the head reads every token's
        ops.rmsnorm_fwd(s, lnf_rows_, rstdf_, xs_.back(), w_norm, rows_, C, c.norm_eps);
        sp_all_gather(s, lnf_, lnf_rows_);
      } else {
        ops.rmsnorm_fwd(s, lnf_, rstdf_, xs_.back(), w_norm, N, C, c.norm_eps);
      }
      if (whole_logits_) {
        ops.linear_fwd(s, logits_, lnf_, w_head, N, C, V);
        ops.cross_entropy_fwd(s, losses_, logits_, targets_, N, V);
      } else {
        head_forward_parts(s, w_head);
      }
      ops.sum(s, loss_slots_ + n_losses_, losses_, size_t(N));
      ++n_losses_;
      return;
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------

// dlogits chunk by chunk from the full log-sum-exp (the logits recomputed when there are several
// chunks), accumulated into the head's gradient; dlnf (N, C) gets this rank's part of d(lnf).
void ModelRunner::head_backward_parts(Stream& s, const float* w_head, float* dw_head, float dloss,
                                      float* dlnf) {
  const ModelConfig& c = model_.config();
  const TpShard& tp = model_.tp();
  Ops& ops = device_.ops();
  const int N = B_ * T_, C = c.dim, V = c.vocab_size, Vp = tp.vocab_rows;
  const bool recompute = recompute_logits_;
  for (int n0 = 0; n0 < N; n0 += chunk_) {
    const int n = std::min(chunk_, N - n0);
    const float* ln = lnf_ + size_t(n0) * C;
    if (recompute) ops.linear_fwd(s, logits_, ln, w_head, n, C, Vp);
    ops.cross_entropy_part_bwd(s, logits_, logits_, ce_lse_ + n0, targets_ + n0, dloss, n, Vp,
                               tp.vocab_begin, V);
    ops.linear_bwd(s, dlnf + size_t(n0) * C, dw_head, logits_, ln, w_head, n, C, Vp);
  }
}

void ModelRunner::backward(Stream& s, int u, const float* p, float* g, float dloss,
                           const float* embedding_params, float* embedding_grads) {
  const bool pipe = !model_.whole();
  // A pipeline stage's backward starts from the gradient of its output that the next stage
  // sent, and leaves the gradient of its input where the send to the previous stage reads it.
  if (pipe && !model_.has_head() && u == model_.num_units() - 1)
    s.copy(dx_, grad_output(), boundary_floats() * 4);
  backward_unit(s, u, p, g, dloss, embedding_params, embedding_grads);
  if (pipe && !model_.has_embedding() && u == 0) s.copy(grad_input(), dx_, boundary_floats() * 4);
}

void ModelRunner::backward_unit(Stream& s, int u, const float* p, float* g, float dloss,
                                const float* embedding_params, float* embedding_grads) {
  const ModelConfig& c = model_.config();
  const TpShard& tp = model_.tp();
  Ops& ops = device_.ops();
  const int N = B_ * T_, C = c.dim, V = c.vocab_size, F = tp.ffn, H = tp.heads;
  const int KVH = tp.kv_heads, D = c.head_dim(), HD = H * D, QKV = (H + 2 * KVH) * D;
  const UnitSpec& unit = model_.unit(u);
  const FlatLayout& L = unit.layout;

  switch (unit.kind) {
    case UnitKind::head: {
      const size_t o_norm = L.view("model.norm.weight").offset;
      const float* w_head = model_.tied() ? embedding_params : p + L.view("lm_head.weight").offset;
      float* dw_head = model_.tied() ? embedding_grads : g + L.view("lm_head.weight").offset;
      STRATA_CHECK(w_head && dw_head, "model::backward", "tied head needs the embedding's buffers");
      if (whole_logits_) {
        ops.cross_entropy_bwd(s, logits_, logits_, targets_, dloss, N, V);   // dlogits in place
        ops.linear_bwd(s, dln_, dw_head, logits_, lnf_, w_head, N, C, V);
      } else if (sp_) {  // d(lnf) partial over all tokens: summed and scattered to the rows
        head_backward_parts(s, w_head, dw_head, dloss, dfull_);
        sp_reduce_scatter(s, dln_, dfull_);
      } else {
        head_backward_parts(s, w_head, dw_head, dloss, dln_);
        tp_all_reduce(s, dln_, size_t(N) * C);  // d(lnf): the sum of every vocabulary part's
      }
      s.fill_zero(dx_, size_t(rows_) * C * 4);
      ops.rmsnorm_bwd(s, dx_, g + o_norm, dln_, xs_.back(), p + o_norm, rstdf_,
                      rows_, C);
      sp_sum_norm_grad(s, g + o_norm);
      return;
    }
    case UnitKind::block: {
      const int l = unit.layer;
      const size_t i = size_t(l - model_.first_layer());  // this stage's block index
      BlockActs& a = acts_[ckpt_ ? 0 : i];
      const float* x = xs_[i];
      if (ckpt_) block_forward(s, l, p, a, x, xs_[i + 1]);  // recompute the activations
      const std::string pre = str("model.layers.", l, ".");
      const size_t o_ln1 = L.view(pre + "input_layernorm.weight").offset;
      const size_t o_qkv = L.view(pre + "self_attn.q_proj.weight").offset;
      const size_t o_k = L.view(pre + "self_attn.k_proj.weight").offset;
      const size_t o_o = L.view(pre + "self_attn.o_proj.weight").offset;
      const size_t o_ln2 = L.view(pre + "post_attention_layernorm.weight").offset;
      const size_t o_gu = L.view(pre + "mlp.gate_proj.weight").offset;
      const size_t o_d = L.view(pre + "mlp.down_proj.weight").offset;
      // dx_ holds d(block output) (whole on every tp rank, or this rank's rows with sequence
      // parallelism); it becomes d(x1), then d(block input), in place. Column-parallel input
      // gradients are partial sums over the tp ranks' columns: all-reduced (or reduce-scattered
      // to the rows) before they join the residual stream. With sequence parallelism the row-
      // parallel linears read the all-gathered gradient, and the weight gradients of the
      // column-parallel ones the norm outputs gathered again (as Megatron does, rather than
      // holding (N, C) per block).
      const int R = rows_;
      const float* dout = dx_;
      if (sp_) {
        sp_all_gather(s, dfull_, dx_);
        dout = dfull_;
      }
      ops.linear_bwd(s, dh_, g + o_d, dout, a.h, p + o_d, N, F, C);
      ops.swiglu_bwd(s, dgu_, dgu_ + F, dh_, a.gu, a.gu + F, N, F, 2 * F);
      if (sp_) {
        sp_all_gather(s, full_, a.ln2);
        ops.linear_bwd(s, dfull_, g + o_gu, dgu_, full_, p + o_gu, N, C, 2 * F);
        sp_reduce_scatter(s, dln_, dfull_);
      } else {
        ops.linear_bwd(s, dln_, g + o_gu, dgu_, a.ln2, p + o_gu, N, C, 2 * F);
        tp_all_reduce(s, dln_, size_t(N) * C);
      }
      ops.rmsnorm_bwd(s, dx_, g + o_ln2, dln_, a.x1, p + o_ln2, a.rstd2, R, C);
      sp_sum_norm_grad(s, g + o_ln2);
      if (sp_) {
        sp_all_gather(s, dfull_, dx_);
        dout = dfull_;
      }
      ops.linear_bwd(s, datt_, g + o_o, dout, a.att, p + o_o, N, HD, C);
      ops.attention_bwd(s, dqkv_, dqkv_ + HD, dqkv_ + HD + KVH * D, datt_, a.att, a.lse, a.qkv,
                        a.qkv + HD, a.qkv + HD + KVH * D, B_, T_, H, KVH, D, QKV, QKV);
      ops.rope_bwd(s, dqkv_, rope_cos_, rope_sin_, B_, T_, H, D, QKV);
      ops.rope_bwd(s, dqkv_ + HD, rope_cos_, rope_sin_, B_, T_, KVH, D, QKV);
      if (sp_) {
        sp_all_gather(s, full_, a.ln1);
        ops.linear_bwd(s, dfull_, g + o_qkv, dqkv_, full_, p + o_qkv, N, C, QKV);
      } else {
        ops.linear_bwd(s, dln_, g + o_qkv, dqkv_, a.ln1, p + o_qkv, N, C, QKV);
      }
      if (comms_.kv) {
        // A kv head replicated on kv_replicas ranks: each holds the gradient from its own query
        // heads; their sum is the head's gradient (k and v rows are adjacent).
        const size_t kv = 2 * size_t(KVH) * D * C;
        comms_.kv->all_reduce(s, g + o_k, kv, CommType::f32, ReduceOp::sum);
        tp_bytes_ += kv * 4;
      }
      if (sp_)
        sp_reduce_scatter(s, dln_, dfull_);
      else
        tp_all_reduce(s, dln_, size_t(N) * C);
      ops.rmsnorm_bwd(s, dx_, g + o_ln1, dln_, x, p + o_ln1, a.rstd1, R, C);
      sp_sum_norm_grad(s, g + o_ln1);
      return;
    }
    case UnitKind::embedding:
      if (tp.size == 1)
        ops.embedding_bwd(s, g, dx_, inputs_, N, C, V);
      else if (sp_) {  // every token's gradient: gathered from the rows
        sp_all_gather(s, dfull_, dx_);
        ops.embedding_part_bwd(s, g, dfull_, inputs_, N, C, V, tp.vocab_begin, tp.vocab_rows);
      } else {
        ops.embedding_part_bwd(s, g, dx_, inputs_, N, C, V, tp.vocab_begin, tp.vocab_rows);
      }
      return;
  }
}

}  // namespace strata
