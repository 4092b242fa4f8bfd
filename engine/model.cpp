// engine/model.cpp — units and layouts of the Llama decoder, initialization, and the unit
// forward/backward passes on a device (ModelRunner).
#include "engine/model.h"

#include <cmath>
#include <cstring>
#include <initializer_list>

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

// Rows of the fused q | k | v projection: (H + 2 KVH) × D, in 64 bits.
int64_t qkv_dim(const ModelConfig& c) {
  return checked_mul<int64_t>(int64_t(c.n_heads) + 2 * int64_t(c.n_kv_heads), c.head_dim(),
                              "qkv_dim = (n_heads + 2 n_kv_heads) x head_dim");
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

LlamaModel::LlamaModel(const ModelConfig& c, int dp) : cfg_(c) {
  const int64_t C = c.dim, V = c.vocab_size, F = c.ffn_dim, D = c.head_dim();
  const int64_t H = c.n_heads, KVH = c.n_kv_heads;

  UnitSpec emb;
  emb.kind = UnitKind::embedding;
  emb.name = "embedding";
  emb.layout.add("model.embed_tokens.weight", {V, C});
  units_.push_back(std::move(emb));

  for (int l = 0; l < c.n_layers; ++l) {
    UnitSpec b;
    b.kind = UnitKind::block;
    b.layer = l;
    b.name = str("block.", l);
    const std::string p = str("model.layers.", l, ".");
    b.layout.add(p + "input_layernorm.weight", {C}, true);
    b.layout.add(p + "self_attn.q_proj.weight", {H * D, C});   // q, k, v adjacent: one GEMM
    b.layout.add(p + "self_attn.k_proj.weight", {KVH * D, C});
    b.layout.add(p + "self_attn.v_proj.weight", {KVH * D, C});
    b.layout.add(p + "self_attn.o_proj.weight", {C, H * D});
    b.layout.add(p + "post_attention_layernorm.weight", {C}, true);
    b.layout.add(p + "mlp.gate_proj.weight", {F, C});           // gate, up adjacent: one GEMM
    b.layout.add(p + "mlp.up_proj.weight", {F, C});
    b.layout.add(p + "mlp.down_proj.weight", {C, F});
    units_.push_back(std::move(b));
  }

  UnitSpec head;
  head.kind = UnitKind::head;
  head.name = "head";
  head.layout.add("model.norm.weight", {C}, true);
  if (!c.tie_embeddings) head.layout.add("lm_head.weight", {V, C});
  units_.push_back(std::move(head));

  for (auto& u : units_) u.layout.finalize(dp);
}

int64_t LlamaModel::num_params() const {
  int64_t n = 0;
  for (const auto& u : units_)
    n = checked_add(n, checked_cast<int64_t>(u.layout.numel(), "unit numel"), "parameter count");
  return n;
}

double LlamaModel::train_flops_per_token(int T) const {
  double matmul = 0;
  for (const auto& u : units_) {
    if (u.kind == UnitKind::embedding) continue;  // a lookup, not a matmul
    for (const auto& v : u.layout.views())
      if (!v.is_norm) matmul += static_cast<double>(v.numel);
  }
  if (cfg_.tie_embeddings) matmul += static_cast<double>(cfg_.vocab_size) * cfg_.dim;
  return 6.0 * matmul + 6.0 * cfg_.n_layers * static_cast<double>(T) * cfg_.dim;
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
      out[i - begin] = static_cast<float>(cfg_.init_std * normal_at(key, i - vb));
  }
}

// ---- activations ------------------------------------------------------------------------------

struct ModelRunner::BlockActs {
  float* ln1 = nullptr;   // (N, C) input_layernorm output
  float* rstd1 = nullptr; // (N)
  float* qkv = nullptr;   // (N, QKV): q | k | v per row, q and k after rotary
  float* att = nullptr;   // (N, H·D) attention output, heads concatenated
  float* lse = nullptr;   // (B, H, T)
  float* x1 = nullptr;    // (N, C) residual after attention
  float* ln2 = nullptr;   // (N, C)
  float* rstd2 = nullptr; // (N)
  float* gu = nullptr;    // (N, 2F): gate | up per row
  float* h = nullptr;     // (N, F) silu(gate) * up
};

namespace {

// Floats of one block's saved activations for N tokens.
uint64_t block_act_floats(const ModelConfig& c, int B, int T) {
  const uint64_t N = mul(B, T), C = c.dim, F = c.ffn_dim, HD = mul(c.n_heads, c.head_dim());
  return sum({mul(N, 3 * C), 2 * N, mul(N, qkv_dim(c)), mul(N, HD), mul(mul(B, c.n_heads), T),
              mul(N, 3 * F)});
}

constexpr uint64_t kAlignFloats = 64;  // 256 bytes between sub-arrays
uint64_t pad(uint64_t n) { return sum({n, kAlignFloats - 1}) / kAlignFloats * kAlignFloats; }

}  // namespace

uint64_t activation_bytes(const ModelConfig& c, int B, int T, bool ckpt) {
  STRATA_CHECK(B > 0 && T > 0, "model::activation_bytes", "B = ", B, ", T = ", T);
  const uint64_t N = mul(B, T), C = c.dim, F = c.ffn_dim, V = c.vocab_size;
  const uint64_t HD = mul(c.n_heads, c.head_dim());
  const uint64_t sets = ckpt ? 1 : uint64_t(c.n_layers);
  const uint64_t floats = sum({
      mul(sets, sum({block_act_floats(c, B, T), 10 * kAlignFloats})),
      mul(uint64_t(c.n_layers) + 1, pad(mul(N, C))),                     // residual stream
      pad(mul(N, C)), pad(N), pad(mul(N, V)), pad(N),                     // head
      mul(pad(mul(N, C)), 2), pad(mul(N, HD)), pad(mul(N, qkv_dim(c))),  // backward scratch
      pad(mul(N, 2 * F)), pad(mul(N, F)),
      pad(mul(uint64_t(T), c.head_dim())),                                // rope cos | sin tables
  });
  return checked_add(mul(sum({floats, 2 * pad(N)}), 4), uint64_t(4096),  // tokens, loss slots
                     "activation bytes");
}

ModelRunner::ModelRunner(const LlamaModel& model, Device& device, int B, int T, bool ckpt,
                         int max_heads)
    : model_(model), device_(device), B_(B), T_(T), ckpt_(ckpt), max_heads_(max_heads) {
  const ModelConfig& c = model.config();
  STRATA_CHECK(B > 0 && T > 0 && max_heads > 0, "model::runner", "B = ", B, ", T = ", T,
               ", max_heads = ", max_heads);
  const uint64_t N = mul(B, T), C = c.dim, F = c.ffn_dim, V = c.vocab_size;
  const uint64_t HD = mul(c.n_heads, c.head_dim()), QKV = qkv_dim(c);
  // The kernels take these as int (forward and backward narrow them unchecked).
  (void)checked_cast<int>(N, "tokens per micro-batch (B x T)");
  (void)checked_cast<int>(QKV, "qkv_dim");
  (void)checked_cast<int>(2 * F, "2 x ffn_dim");
  (void)activation_bytes(c, B, T, ckpt);  // every size below fits in 64 bits

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

  buffers_.push_back(device.alloc(2 * N * 4, "token buffers"));
  inputs_ = buffers_.back().as<int32_t>();
  targets_ = inputs_ + N;
  buffers_.push_back(device.alloc(uint64_t(max_heads) * 8, "loss slots"));
  loss_slots_ = buffers_.back().as<double>();

  for (int l = 0; l <= c.n_layers; ++l) xs_.push_back(alloc(N * C, "residual stream activations"));

  int sets = ckpt ? 1 : c.n_layers;
  acts_.resize(static_cast<size_t>(sets));
  for (auto& a : acts_) {
    float* p = alloc(block_act_floats(c, B, T) + 10 * kAlignFloats, "block activations");
    auto take = [&](uint64_t n) {
      float* r = p;
      p += pad(n);
      return r;
    };
    a.ln1 = take(N * C);
    a.rstd1 = take(N);
    a.qkv = take(N * QKV);
    a.att = take(N * HD);
    a.lse = take(uint64_t(B) * c.n_heads * T);
    a.x1 = take(N * C);
    a.ln2 = take(N * C);
    a.rstd2 = take(N);
    a.gu = take(N * 2 * F);
    a.h = take(N * F);
  }
  lnf_ = alloc(N * C, "head activations");
  rstdf_ = alloc(N, "head activations");
  logits_ = alloc(N * V, "logits");
  losses_ = alloc(N, "per-token losses");
  dx_ = alloc(N * C, "backward scratch");
  dln_ = alloc(N * C, "backward scratch");
  datt_ = alloc(N * HD, "backward scratch");
  dqkv_ = alloc(N * QKV, "backward scratch");
  dgu_ = alloc(N * 2 * F, "backward scratch");
  dh_ = alloc(N * F, "backward scratch");
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::load_batch(Stream& s, const int32_t* inputs, const int32_t* targets) {
  size_t n = size_t(B_) * T_;
  s.copy(inputs_, inputs, n * 4);
  s.copy(targets_, targets, n * 4);
}

void ModelRunner::copy_losses(Stream& s, double* host_out) {
  if (n_losses_ > 0) s.copy(host_out, loss_slots_, size_t(n_losses_) * 8);
}

void ModelRunner::copy_logits(Stream& s, float* host_out) {
  s.copy(host_out, logits_, size_t(B_) * T_ * model_.config().vocab_size * 4);
}

// ---- forward ----------------------------------------------------------------------------------

void ModelRunner::block_forward(Stream& s, int layer, const float* p, BlockActs& a,
                                const float* x, float* x_out) {
  const ModelConfig& c = model_.config();
  Ops& ops = device_.ops();
  const int N = B_ * T_, C = c.dim, F = c.ffn_dim, H = c.n_heads, KVH = c.n_kv_heads;
  const int D = c.head_dim(), HD = H * D, QKV = int(qkv_dim(c));  // int: checked at construction
  const FlatLayout& L = model_.unit(1 + layer).layout;
  const std::string pre = str("model.layers.", layer, ".");
  const float* w_ln1 = p + L.view(pre + "input_layernorm.weight").offset;
  const float* w_qkv = p + L.view(pre + "self_attn.q_proj.weight").offset;  // (QKV, C)
  const float* w_o = p + L.view(pre + "self_attn.o_proj.weight").offset;    // (C, HD)
  const float* w_ln2 = p + L.view(pre + "post_attention_layernorm.weight").offset;
  const float* w_gu = p + L.view(pre + "mlp.gate_proj.weight").offset;      // (2F, C)
  const float* w_d = p + L.view(pre + "mlp.down_proj.weight").offset;       // (C, F)

  ops.rmsnorm_fwd(s, a.ln1, a.rstd1, x, w_ln1, N, C, c.norm_eps);
  ops.linear_fwd(s, a.qkv, a.ln1, w_qkv, N, C, QKV);
  ops.rope_fwd(s, a.qkv, rope_cos_, rope_sin_, B_, T_, H, D, QKV);          // q
  ops.rope_fwd(s, a.qkv + HD, rope_cos_, rope_sin_, B_, T_, KVH, D, QKV);   // k
  ops.attention_fwd(s, a.att, a.lse, a.qkv, a.qkv + HD, a.qkv + HD + KVH * D, B_, T_, H, KVH, D,
                    QKV, QKV);
  ops.linear_fwd(s, a.x1, a.att, w_o, N, HD, C);
  ops.add(s, a.x1, a.x1, x, size_t(N) * C);                           // x1 = x + o
  ops.rmsnorm_fwd(s, a.ln2, a.rstd2, a.x1, w_ln2, N, C, c.norm_eps);
  ops.linear_fwd(s, a.gu, a.ln2, w_gu, N, C, 2 * F);
  ops.swiglu_fwd(s, a.h, a.gu, a.gu + F, N, F, 2 * F);
  ops.linear_fwd(s, x_out, a.h, w_d, N, F, C);
  ops.add(s, x_out, x_out, a.x1, size_t(N) * C);                      // out = x1 + mlp
}

void ModelRunner::forward(Stream& s, int u, const float* p, const float* embedding_params) {
  const ModelConfig& c = model_.config();
  Ops& ops = device_.ops();
  const int N = B_ * T_, C = c.dim, V = c.vocab_size;
  const UnitSpec& unit = model_.unit(u);
  switch (unit.kind) {
    case UnitKind::embedding:
      ops.embedding_fwd(s, xs_[0], inputs_, p, N, C, c.vocab_size);
      return;
    case UnitKind::block: {
      int l = unit.layer;
      block_forward(s, l, p, acts_[ckpt_ ? 0 : size_t(l)], xs_[size_t(l)], xs_[size_t(l) + 1]);
      return;
    }
    case UnitKind::head: {
      STRATA_CHECK(n_losses_ < max_heads_, "model::forward", "more head forwards (",
                   n_losses_ + 1, ") than loss slots (", max_heads_, ") since reset_loss()");
      const FlatLayout& L = unit.layout;
      const float* w_norm = p + L.view("model.norm.weight").offset;
      const float* w_head = model_.tied() ? embedding_params : p + L.view("lm_head.weight").offset;
      STRATA_CHECK(w_head != nullptr, "model::forward", "tied head needs the embedding's parameters");
      ops.rmsnorm_fwd(s, lnf_, rstdf_, xs_[size_t(c.n_layers)], w_norm, N, C, c.norm_eps);
      ops.linear_fwd(s, logits_, lnf_, w_head, N, C, V);
      ops.cross_entropy_fwd(s, losses_, logits_, targets_, N, V);
      ops.sum(s, loss_slots_ + n_losses_, losses_, size_t(N));
      ++n_losses_;
      return;
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------

void ModelRunner::backward(Stream& s, int u, const float* p, float* g, float dloss,
                           const float* embedding_params, float* embedding_grads) {
  const ModelConfig& c = model_.config();
  Ops& ops = device_.ops();
  const int N = B_ * T_, C = c.dim, V = c.vocab_size, F = c.ffn_dim, H = c.n_heads;
  const int KVH = c.n_kv_heads, D = c.head_dim(), HD = H * D, QKV = int(qkv_dim(c));
  const UnitSpec& unit = model_.unit(u);
  const FlatLayout& L = unit.layout;

  switch (unit.kind) {
    case UnitKind::head: {
      const size_t o_norm = L.view("model.norm.weight").offset;
      const float* w_head = model_.tied() ? embedding_params : p + L.view("lm_head.weight").offset;
      float* dw_head = model_.tied() ? embedding_grads : g + L.view("lm_head.weight").offset;
      STRATA_CHECK(w_head && dw_head, "model::backward", "tied head needs the embedding's buffers");
      ops.cross_entropy_bwd(s, logits_, logits_, targets_, dloss, N, V);   // dlogits in place
      ops.linear_bwd(s, dln_, dw_head, logits_, lnf_, w_head, N, C, V);
      s.fill_zero(dx_, size_t(N) * C * 4);
      ops.rmsnorm_bwd(s, dx_, g + o_norm, dln_, xs_[size_t(c.n_layers)], p + o_norm, rstdf_, N, C);
      return;
    }
    case UnitKind::block: {
      const int l = unit.layer;
      BlockActs& a = acts_[ckpt_ ? 0 : size_t(l)];
      const float* x = xs_[size_t(l)];
      if (ckpt_) block_forward(s, l, p, a, x, xs_[size_t(l) + 1]);  // recompute the activations
      const std::string pre = str("model.layers.", l, ".");
      const size_t o_ln1 = L.view(pre + "input_layernorm.weight").offset;
      const size_t o_qkv = L.view(pre + "self_attn.q_proj.weight").offset;
      const size_t o_o = L.view(pre + "self_attn.o_proj.weight").offset;
      const size_t o_ln2 = L.view(pre + "post_attention_layernorm.weight").offset;
      const size_t o_gu = L.view(pre + "mlp.gate_proj.weight").offset;
      const size_t o_d = L.view(pre + "mlp.down_proj.weight").offset;
      // dx_ holds d(block output); it becomes d(x1), then d(block input), in place.
      ops.linear_bwd(s, dh_, g + o_d, dx_, a.h, p + o_d, N, F, C);
      ops.swiglu_bwd(s, dgu_, dgu_ + F, dh_, a.gu, a.gu + F, N, F, 2 * F);
      ops.linear_bwd(s, dln_, g + o_gu, dgu_, a.ln2, p + o_gu, N, C, 2 * F);
      ops.rmsnorm_bwd(s, dx_, g + o_ln2, dln_, a.x1, p + o_ln2, a.rstd2, N, C);
      ops.linear_bwd(s, datt_, g + o_o, dx_, a.att, p + o_o, N, HD, C);
      ops.attention_bwd(s, dqkv_, dqkv_ + HD, dqkv_ + HD + KVH * D, datt_, a.att, a.lse, a.qkv,
                        a.qkv + HD, a.qkv + HD + KVH * D, B_, T_, H, KVH, D, QKV, QKV);
      ops.rope_bwd(s, dqkv_, rope_cos_, rope_sin_, B_, T_, H, D, QKV);
      ops.rope_bwd(s, dqkv_ + HD, rope_cos_, rope_sin_, B_, T_, KVH, D, QKV);
      ops.linear_bwd(s, dln_, g + o_qkv, dqkv_, a.ln1, p + o_qkv, N, C, QKV);
      ops.rmsnorm_bwd(s, dx_, g + o_ln1, dln_, x, p + o_ln1, a.rstd1, N, C);
      return;
    }
    case UnitKind::embedding:
      ops.embedding_bwd(s, g, dx_, inputs_, N, C, V);
      return;
  }
}

}  // namespace strata
