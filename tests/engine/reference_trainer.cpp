// tests/engine/reference_trainer.cpp — reference_train: the Llama forward and backward written
// out layer by layer on host vectors with the scalar reference ops, then clipping and AdamW.
// Deliberately plain and slow; see the header for what it leaves to the engine tests.
#include "tests/engine/reference_trainer.h"

#include <cmath>
#include <memory>

#include "core/dtype.h"
#include "engine/data.h"
#include "engine/model.h"
#include "kernels/cpu/ref_ops.h"
#include "kernels/rope_tables.h"
#include "optimizer/adamw.h"
#include "optimizer/schedule.h"

namespace strata::test {
namespace {

namespace ref = cpu::ref;
using Tensor = std::vector<float>;

// Saved activations of one decoder block for one micro-batch.
struct BlockActs {
  Tensor x;              // (N, C) block input
  Tensor ln1, rstd1;     // (N, C), (N)
  Tensor q, k, v;        // (N, H·D), (N, KVH·D), (N, KVH·D); q and k after rotary
  Tensor att, lse;       // (N, H·D), (B, H, T)
  Tensor x1;             // (N, C) residual after attention
  Tensor ln2, rstd2;     // (N, C), (N)
  Tensor gate, up, h;    // (N, F) each; h = silu(gate) · up
};

bool is_norm(const std::string& name) {
  return name == "model.norm.weight" || name.ends_with("_layernorm.weight");
}

class ReferenceLoop {
 public:
  explicit ReferenceLoop(const Config& c) : c_(c), m_(c.model) {
    // The seeded initial values, read out of a 1-rank layout into one tensor per name.
    LlamaModel model(m_, 1);
    for (int u = 0; u < model.num_units(); ++u) {
      const FlatLayout& layout = model.unit(u).layout;
      Tensor flat(layout.padded_numel());
      model.init_values(u, c.train.seed, 0, flat.size(), flat.data());
      for (const ParamView& v : layout.views()) {
        const auto first = flat.begin() + long(v.offset);
        master_[v.name] = Tensor(first, first + long(v.numel));
        grads_[v.name] = Tensor(v.numel, 0.0f);
        m_state_[v.name] = Tensor(v.numel, 0.0f);
        v_state_[v.name] = Tensor(v.numel, 0.0f);
      }
    }
    refresh_compute_copy();
  }

  ReferenceResult train() {
    const int B = c_.data.micro_batch, T = c_.data.seq_len, A = c_.train.grad_accum;
    auto source = open_tokens(c_.data.path, m_.vocab_size);
    WindowSampler windows(*source, T, c_.data.shuffle, c_.train.seed);
    LrSchedule schedule;
    schedule.shape = c_.train.schedule == Schedule::cosine ? LrShape::cosine : LrShape::constant;
    schedule.lr = c_.train.lr;
    schedule.warmup_steps = c_.train.warmup_steps;
    schedule.total_steps = c_.train.steps;
    schedule.min_ratio = c_.train.min_lr_ratio;
    const float dloss = float(1.0 / double(uint64_t(B) * A * T));  // d(mean loss)/d(token loss)
    std::vector<int32_t> in(size_t(B) * T), tgt(size_t(B) * T);
    ReferenceResult r;
    for (int64_t s = 0; s < c_.train.steps; ++s) {
      for (auto& [name, g] : grads_) std::fill(g.begin(), g.end(), 0.0f);
      double loss_sum = 0;
      for (int a = 0; a < A; ++a) {
        windows.windows(uint64_t(s) * B * A + uint64_t(a) * B, B, in.data(), tgt.data());
        loss_sum += forward_backward(in.data(), tgt.data(), dloss);
      }
      r.losses.push_back(loss_sum / double(uint64_t(B) * A * T));
      double sq = 0;
      for (const auto& [name, g] : grads_)
        for (float x : g) sq += double(x) * double(x);
      const double norm = std::sqrt(sq);
      r.grad_norms.push_back(norm);
      AdamWHyper h;
      h.lr = schedule.at(s);
      h.beta1 = c_.train.beta1;
      h.beta2 = c_.train.beta2;
      h.eps = c_.train.eps;
      const float clip = clip_coefficient(norm, c_.train.grad_clip);
      for (auto& [name, p] : master_) {
        h.weight_decay = (is_norm(name) && !c_.train.decay_norms) ? 0.0f : c_.train.weight_decay;
        AdamWTensors t;
        t.param = p.data();
        t.grad = grads_.at(name).data();
        t.m = m_state_.at(name).data();
        t.v = v_state_.at(name).data();
        t.n = p.size();
        adamw_update_isa(AdamIsa::scalar, h, s + 1, clip, t);
      }
      refresh_compute_copy();
    }
    r.weights = master_;
    return r;
  }

 private:
  // The weights forward and backward read: the master itself in f32, rounded to bf16 (nearest
  // even) and widened back under train.precision = bf16.
  void refresh_compute_copy() {
    compute_ = master_;
    if (c_.train.precision != Precision::bf16) return;
    for (auto& [name, w] : compute_)
      for (float& x : w) x = bf16_bits_to_f32(f32_to_bf16_bits(x));
  }

  const float* w(const std::string& name) const { return compute_.at(name).data(); }
  float* g(const std::string& name) { return grads_.at(name).data(); }

  // One micro-batch (B × T tokens): forward, loss, backward; gradients are added to grads_.
  // Returns the sum of the per-token losses.
  double forward_backward(const int32_t* in, const int32_t* tgt, float dloss) {
    const int B = c_.data.micro_batch, T = c_.data.seq_len, N = B * T;
    const int C = m_.dim, V = m_.vocab_size, F = m_.ffn_dim, H = m_.n_heads, KVH = m_.n_kv_heads;
    const int D = m_.head_dim(), HD = H * D, KVD = KVH * D;
    const float eps = m_.norm_eps;
    // The rotary tables as transformers computes them (kernels/rope_tables.h, itself held
    // bit-exact against transformers by test_rope_golden).
    const RopeTables rt = rope_tables(rope_inv_freq(m_.rope(), D), T);
    const std::string embed = "model.embed_tokens.weight";
    const std::string head = m_.tie_embeddings ? embed : "lm_head.weight";

    // ---- forward ----
    std::vector<BlockActs> acts(size_t(m_.n_layers));
    Tensor x(size_t(N) * C);
    ref::embedding_fwd(x.data(), in, w(embed), N, C, V);
    for (int l = 0; l < m_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      BlockActs& a = acts[size_t(l)];
      a.x = x;
      a.ln1.resize(size_t(N) * C);
      a.rstd1.resize(size_t(N));
      ref::rmsnorm_fwd(a.ln1.data(), a.rstd1.data(), a.x.data(), w(p + "input_layernorm.weight"),
                       N, C, eps);
      a.q.resize(size_t(N) * HD);
      a.k.resize(size_t(N) * KVD);
      a.v.resize(size_t(N) * KVD);
      ref::linear_fwd(a.q.data(), a.ln1.data(), w(p + "self_attn.q_proj.weight"), N, C, HD);
      ref::linear_fwd(a.k.data(), a.ln1.data(), w(p + "self_attn.k_proj.weight"), N, C, KVD);
      ref::linear_fwd(a.v.data(), a.ln1.data(), w(p + "self_attn.v_proj.weight"), N, C, KVD);
      ref::rope_fwd(a.q.data(), rt.cos.data(), rt.sin.data(), B, T, H, D, HD);
      ref::rope_fwd(a.k.data(), rt.cos.data(), rt.sin.data(), B, T, KVH, D, KVD);
      a.att.resize(size_t(N) * HD);
      a.lse.resize(size_t(B) * H * T);
      ref::attention_fwd(a.att.data(), a.lse.data(), a.q.data(), a.k.data(), a.v.data(), B, T, H,
                         KVH, D, HD, KVD);
      Tensor o(size_t(N) * C);
      ref::linear_fwd(o.data(), a.att.data(), w(p + "self_attn.o_proj.weight"), N, HD, C);
      a.x1.resize(size_t(N) * C);
      ref::add(a.x1.data(), a.x.data(), o.data(), a.x1.size());
      a.ln2.resize(size_t(N) * C);
      a.rstd2.resize(size_t(N));
      ref::rmsnorm_fwd(a.ln2.data(), a.rstd2.data(), a.x1.data(),
                       w(p + "post_attention_layernorm.weight"), N, C, eps);
      a.gate.resize(size_t(N) * F);
      a.up.resize(size_t(N) * F);
      a.h.resize(size_t(N) * F);
      ref::linear_fwd(a.gate.data(), a.ln2.data(), w(p + "mlp.gate_proj.weight"), N, C, F);
      ref::linear_fwd(a.up.data(), a.ln2.data(), w(p + "mlp.up_proj.weight"), N, C, F);
      ref::swiglu_fwd(a.h.data(), a.gate.data(), a.up.data(), N, F, F);
      Tensor down(size_t(N) * C);
      ref::linear_fwd(down.data(), a.h.data(), w(p + "mlp.down_proj.weight"), N, F, C);
      ref::add(x.data(), a.x1.data(), down.data(), x.size());
    }
    Tensor lnf(size_t(N) * C), rstdf(static_cast<size_t>(N)), logits(size_t(N) * V);
    Tensor losses(static_cast<size_t>(N));
    ref::rmsnorm_fwd(lnf.data(), rstdf.data(), x.data(), w("model.norm.weight"), N, C, eps);
    ref::linear_fwd(logits.data(), lnf.data(), w(head), N, C, V);
    ref::cross_entropy_fwd(losses.data(), logits.data(), tgt, N, V);
    double loss_sum = 0;
    for (float l : losses) loss_sum += l;

    // ---- backward ----
    ref::cross_entropy_bwd(logits.data(), logits.data(), tgt, dloss, N, V);  // dlogits in place
    Tensor dln(size_t(N) * C), tmp(size_t(N) * C), dx(size_t(N) * C, 0.0f);
    ref::linear_bwd(dln.data(), g(head), logits.data(), lnf.data(), w(head), N, C, V);
    ref::rmsnorm_bwd(dx.data(), g("model.norm.weight"), dln.data(), x.data(),
                     w("model.norm.weight"), rstdf.data(), N, C);
    for (int l = m_.n_layers - 1; l >= 0; --l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const BlockActs& a = acts[size_t(l)];
      // dx: d(block output) = d(x1 + mlp); below it becomes d(x1), then d(block input).
      Tensor dh(size_t(N) * F), dgate(size_t(N) * F), dup(size_t(N) * F);
      ref::linear_bwd(dh.data(), g(p + "mlp.down_proj.weight"), dx.data(), a.h.data(),
                      w(p + "mlp.down_proj.weight"), N, F, C);
      ref::swiglu_bwd(dgate.data(), dup.data(), dh.data(), a.gate.data(), a.up.data(), N, F, F);
      ref::linear_bwd(dln.data(), g(p + "mlp.gate_proj.weight"), dgate.data(), a.ln2.data(),
                      w(p + "mlp.gate_proj.weight"), N, C, F);
      ref::linear_bwd(tmp.data(), g(p + "mlp.up_proj.weight"), dup.data(), a.ln2.data(),
                      w(p + "mlp.up_proj.weight"), N, C, F);
      ref::add(dln.data(), dln.data(), tmp.data(), dln.size());
      ref::rmsnorm_bwd(dx.data(), g(p + "post_attention_layernorm.weight"), dln.data(), a.x1.data(),
                       w(p + "post_attention_layernorm.weight"), a.rstd2.data(), N, C);
      Tensor datt(size_t(N) * HD), dq(size_t(N) * HD), dk(size_t(N) * KVD), dv(size_t(N) * KVD);
      ref::linear_bwd(datt.data(), g(p + "self_attn.o_proj.weight"), dx.data(), a.att.data(),
                      w(p + "self_attn.o_proj.weight"), N, HD, C);
      ref::attention_bwd(dq.data(), dk.data(), dv.data(), datt.data(), a.att.data(), a.lse.data(),
                         a.q.data(), a.k.data(), a.v.data(), B, T, H, KVH, D, HD, KVD);
      ref::rope_bwd(dq.data(), rt.cos.data(), rt.sin.data(), B, T, H, D, HD);
      ref::rope_bwd(dk.data(), rt.cos.data(), rt.sin.data(), B, T, KVH, D, KVD);
      ref::linear_bwd(dln.data(), g(p + "self_attn.q_proj.weight"), dq.data(), a.ln1.data(),
                      w(p + "self_attn.q_proj.weight"), N, C, HD);
      ref::linear_bwd(tmp.data(), g(p + "self_attn.k_proj.weight"), dk.data(), a.ln1.data(),
                      w(p + "self_attn.k_proj.weight"), N, C, KVD);
      ref::add(dln.data(), dln.data(), tmp.data(), dln.size());
      ref::linear_bwd(tmp.data(), g(p + "self_attn.v_proj.weight"), dv.data(), a.ln1.data(),
                      w(p + "self_attn.v_proj.weight"), N, C, KVD);
      ref::add(dln.data(), dln.data(), tmp.data(), dln.size());
      ref::rmsnorm_bwd(dx.data(), g(p + "input_layernorm.weight"), dln.data(), a.x.data(),
                       w(p + "input_layernorm.weight"), a.rstd1.data(), N, C);
    }
    ref::embedding_bwd(g(embed), dx.data(), in, N, C, V);
    return loss_sum;
  }

  Config c_;
  ModelConfig m_;
  std::map<std::string, Tensor> master_, compute_, grads_, m_state_, v_state_;
};

}  // namespace

ReferenceResult reference_train(const Config& config) { return ReferenceLoop(config).train(); }

}  // namespace strata::test
