// engine/model.h — the Llama-style decoder (Hugging Face LlamaForCausalLM names and semantics)
// split into units: the embedding, each decoder block, and the final norm with the output head.
//
// LlamaModel is pure description: the units, their flat parameter layouts, the initial values
// (a pure function of seed, parameter name and element index, so any rank can initialize any
// slice), parameter and FLOP counts. ModelRunner executes units on a device: it owns the
// activations of one micro-batch and runs each unit's forward or backward on a stream, given the
// unit's gathered parameters. It does not own parameters, gradients or optimizer state (the ZeRO
// engine does) and never synchronizes with the host.
//
// Within a block the flat layout keeps q, k, v adjacent (one (QKV, C) GEMM) and gate, up
// adjacent (one (2F, C) GEMM); names and shapes are still Hugging Face's.
//
// Tensor parallelism (Megatron-LM's layout): a model built for tp rank r of tp holds only that
// rank's slices — q, k, v by heads and gate, up by rows (column-parallel); o_proj and down_proj
// by columns (row-parallel); the embedding and the head by vocabulary rows; norm weights whole.
// When tp > n_kv_heads each kv head is replicated on tp / n_kv_heads ranks. The runner adds the
// collectives: one all-reduce (tp group) after attention and one after the MLP in forward, the
// conjugate all-reduces in backward, and a cross-entropy computed from every rank's partial
// log-sum-exp, so no rank holds full logits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "engine/config.h"
#include "engine/flat_param.h"
#include "engine/pipeline.h"
#include "kernels/device.h"

namespace strata {

enum class UnitKind { embedding, block, head };

struct UnitSpec {
  UnitKind kind = UnitKind::block;
  int layer = -1;     // block index, -1 otherwise
  std::string name;   // "embedding", "block.3", "head"
  FlatLayout layout;
};

// This rank's share of the model under tensor parallelism (size 1: everything).
struct TpShard {
  int size = 1, index = 0;
  int heads = 0, kv_heads = 0, ffn = 0;  // local counts
  int first_head = 0, first_kv_head = 0;
  int vocab_begin = 0, vocab_rows = 0;   // rows of the embedding / head this rank holds
  int kv_replicas = 1;                   // tp ranks sharing each kv head (tp > n_kv_heads)
};
// The slices of tp rank `index`; an Error naming parallel.tp when the model does not split.
TpShard tp_shard(const ModelConfig& config, int tp, int index);

// Pipeline parallelism: a model built for one stage (`stage`, global units [begin, end); the
// default {0, 0} means every unit) holds only that stage's units, numbered from 0 — unit(0) is
// the stage's first. all_units() still describes the whole model (names, shapes, counts).
class LlamaModel {
 public:
  explicit LlamaModel(const ModelConfig& config, int dp = 1, int tp = 1, int tp_index = 0,
                      StageUnits stage = {});

  const ModelConfig& config() const { return cfg_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitSpec& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  const std::vector<UnitSpec>& units() const { return units_; }
  const std::vector<UnitSpec>& all_units() const { return all_units_; }  // every stage's
  bool tied() const { return cfg_.tie_embeddings; }
  const TpShard& tp() const { return tp_; }
  // This stage: its global units, its blocks [first_layer, first_layer + layers_here) and
  // whether it holds the embedding (the first stage) and the head (the last).
  const StageUnits& stage() const { return stage_; }
  bool whole() const { return stage_.begin == 0 && stage_.end == int(all_units_.size()); }
  int first_layer() const { return first_layer_; }
  int layers_here() const { return layers_here_; }
  bool has_embedding() const { return stage_.begin == 0; }
  bool has_head() const { return stage_.end == int(all_units_.size()); }
  int block_unit(int layer) const { return layer - first_layer_ + (has_embedding() ? 1 : 0); }

  int64_t num_params() const;              // every global parameter once (tied counted once)
  // Training FLOPs per token (forward + backward) at sequence length T: 6 × (matmul weights)
  // + 6 × n_layers × T × dim for causal attention (scores and values, fwd + 2 × bwd).
  double train_flops_per_token(int T) const;
  // The attention part of it (causal scores and their weighted sum: 6·layers·T·dim), which runs
  // on its own kernels rather than the GEMMs (engine/step_model.h times it at its own rate).
  double attention_flops_per_token(int T) const;

  // Initial values of flat elements [begin, begin + count) of unit u (padding is zero):
  // norm weights 1, everything else normal(0, init_std) from a counter-based generator keyed by
  // (seed, parameter name, global element index) — the same values whatever the tp layout.
  void init_values(int u, uint64_t seed, size_t begin, size_t count, float* out) const;

 private:
  ModelConfig cfg_;
  TpShard tp_;
  StageUnits stage_;
  int first_layer_ = 0, layers_here_ = 0;
  std::vector<UnitSpec> units_, all_units_;
};

// Tokens per loss chunk: model.loss_chunk, or (0) the whole micro-batch when its logits fit
// kAutoLogitsBytes, else as many rows as do.
inline constexpr uint64_t kAutoLogitsBytes = 256ull << 20;
int loss_chunk_rows(const ModelConfig& cfg, int B, int T, int tp);

// Device memory the runner allocates for a micro-batch of B × T tokens (tp rank 0's share,
// the largest).
uint64_t activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpointing, int tp = 1,
                          bool sequence_parallel = false);
// The same for the runner of `model` (its tp slice and pipeline stage) holding `slots`
// micro-batches at once: per micro-batch its residual stream, saved activations, tokens, head
// inputs and stage-boundary gradients; shared the backward scratch, logits and recomputed
// activations.
uint64_t activation_bytes(const LlamaModel& model, int B, int T, bool checkpointing,
                          bool sequence_parallel, int slots);
// The logits part of it: (loss chunk, vocabulary rows) f32.
uint64_t logits_bytes(const ModelConfig& cfg, int B, int T, int tp = 1);

// How the runner does tensor parallelism: its communicators (null with tp = 1) and whether
// the sequence is sharded too.
struct TpOptions {
  Communicator* tp = nullptr;  // the tp group
  Communicator* kv = nullptr;  // the ranks sharing this rank's kv head (kv_replicas > 1)
  // Megatron's sequence parallelism: the residual stream, norms and residual adds hold 1/tp of
  // the tokens (rows [index·N/tp, (index+1)·N/tp) of the micro-batch); an all-gather before
  // each column-parallel linear and a reduce-scatter after each row-parallel one replace the
  // all-reduces; norm weight gradients are summed over the tp group.
  bool sequence_parallel = false;
};

class ModelRunner {
 public:
  // max_heads: how many head forwards (micro-batches) may run between reset_loss() calls.
  // micro_slots: micro-batches whose activations are held at once (a pipeline stage's
  // schedule needs several; engine/pipeline.h); use_slot() picks the one the calls below use.
  ModelRunner(const LlamaModel& model, Device& device, int B, int T, bool checkpointing,
              int max_heads = 1, TpOptions tp_options = {}, int micro_slots = 1);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  int batch() const { return B_; }
  int seq_len() const { return T_; }

  // Copies a micro-batch (B × T inputs and targets, host memory that must stay valid until the
  // stream has run the copy) into the runner's device buffers.
  void load_batch(Stream& s, const int32_t* inputs, const int32_t* targets);

  // Forward of unit u with its gathered parameters (f32, the unit's flat layout). The head also
  // reads the embedding's parameters when embeddings are tied (`embedding_params`), computes the
  // per-token losses and writes their sum (a double) into the next loss slot.
  void forward(Stream& s, int u, const float* params, const float* embedding_params = nullptr);
  // Backward of unit u: accumulates into `grads` (the unit's flat layout, f32), and for the head
  // with tied embeddings also into `embedding_grads`. `dloss` is d(loss)/d(per-token loss), i.e.
  // 1 / (tokens in the global batch). Units must run in reverse order after their forward.
  void backward(Stream& s, int u, const float* params, float* grads, float dloss,
                const float* embedding_params = nullptr, float* embedding_grads = nullptr);

  // Loss slots: one double per head forward since reset_loss(), in device memory.
  void reset_loss() { n_losses_ = 0; }
  int loss_count() const { return n_losses_; }
  // Enqueues a copy of the loss_count() slots to host memory (valid after the stream syncs).
  void copy_losses(Stream& s, double* host_out);
  // Enqueues a copy of the last head forward's logits (B × T × V) to host memory. Valid after a
  // forward and before the head's backward (which overwrites them with their gradient); only
  // when the logits are held whole (tp = 1, one loss chunk), an Error otherwise.
  void copy_logits(Stream& s, float* host_out);
  // Bytes of the tensor-parallel collectives enqueued since the last call (buffer sizes).
  uint64_t take_tp_bytes();

  // ---- pipeline stages (a model built for one stage; engine/pipeline.h) ----
  // Selects the micro-batch slot that load_batch, forward and backward use from now on; a
  // slot's activations live from its forward to its backward.
  void use_slot(int k);
  int slots() const { return int(slots_.size()); }
  // The current slot's stage boundary, (rows × dim) f32 each, rows = B·T (or B·T / tp with
  // sequence parallelism): the input activations a receive fills before the stage's first
  // forward (a stage without the embedding); the output activations its last forward leaves
  // for the send; the gradient of the output a receive fills before the stage's backward (a
  // stage without the head), and the gradient of the input its backward leaves for the send
  // (a stage without the embedding).
  size_t boundary_floats() const;
  float* stage_input();
  float* stage_output();
  float* grad_output();
  float* grad_input();

 private:
  struct BlockActs;
  // One micro-batch's own buffers (pointers into buffers_).
  struct Slot {
    int32_t* inputs = nullptr;
    int32_t* targets = nullptr;
    std::vector<float*> xs;
    std::vector<BlockActs> acts;
    float* lnf = nullptr;
    float* rstdf = nullptr;
    float* ce_lse = nullptr;
    float* lnf_rows = nullptr;
    float* dout = nullptr;  // d(stage output), received
    float* din = nullptr;   // d(stage input), to send
  };
  void backward_unit(Stream& s, int u, const float* params, float* grads, float dloss,
                     const float* embedding_params, float* embedding_grads);
  void block_forward(Stream& s, int layer, const float* p, BlockActs& a, const float* x_in,
                     float* x_out);

  void tp_all_reduce(Stream& s, float* buf, size_t count);
  // Sequence parallelism: full (N, C) from every rank's (N/tp, C) rows, and the converse sum.
  void sp_all_gather(Stream& s, float* full, const float* rows);
  void sp_reduce_scatter(Stream& s, float* rows, const float* full);
  // The tp group's sum of a norm weight's gradient (each rank saw 1/tp of the tokens).
  void sp_sum_norm_grad(Stream& s, float* dw);
  void head_forward_parts(Stream& s, const float* w_head);
  void head_backward_parts(Stream& s, const float* w_head, float* dw_head, float dloss,
                           float* dlnf);

  const LlamaModel& model_;
  Device& device_;
  int B_, T_;
  bool ckpt_;
  TpOptions comms_;
  bool sp_ = false;                     // sequence parallelism in effect
  int rows_ = 0;                        // tokens of the residual stream here: N, or N/tp with sp_
  int chunk_ = 0;                       // tokens per loss chunk
  bool whole_logits_ = true;            // tp = 1, one chunk, one slot: the plain cross-entropy
  bool recompute_logits_ = false;       // head backward recomputes the logits (chunks or slots)
  std::vector<Slot> slots_;
  int slot_ = 0;
  uint64_t tp_bytes_ = 0;
  std::vector<Buffer> buffers_;
  int32_t* inputs_ = nullptr;
  int32_t* targets_ = nullptr;
  std::vector<float*> xs_;              // residual stream (rows, C): xs_[l] is block l's input
  std::vector<BlockActs> acts_;         // one per block, or one shared when checkpointing
  float* lnf_ = nullptr;                // head: normed input (N, C), all tokens
  float* rstdf_ = nullptr;              // (rows)
  float* logits_ = nullptr;             // (chunk, Vp); overwritten by dlogits in backward
  float* losses_ = nullptr;             // (N)
  float* ce_stats_ = nullptr;           // (N, 2) this rank's partial lse and target logit
  float* ce_stats_all_ = nullptr;       // (tp, N, 2) every rank's
  float* ce_lse_ = nullptr;             // (N) the full log-sum-exp
  float* lnf_rows_ = nullptr;           // sp_: (rows, C) this rank's final-norm output
  float* full_ = nullptr;               // sp_: (N, C) a gathered norm output or a partial sum
  float* dfull_ = nullptr;              // sp_: (N, C) a gathered gradient or a partial sum
  double* loss_slots_ = nullptr;        // (max_heads)
  const float* rope_cos_ = nullptr;     // (T, D/2) rotary tables (kernels/rope_tables.h)
  const float* rope_sin_ = nullptr;     // (T, D/2)
  int max_heads_ = 1;
  int n_losses_ = 0;
  // backward scratch, shared by all blocks (the compute stream runs them one at a time)
  float* dx_ = nullptr;                 // (rows, C): gradient flowing down the residual stream
  float* dln_ = nullptr;                // (N, C) (its first rows only, with sp_)
  float* datt_ = nullptr;               // (N, H·D)
  float* dqkv_ = nullptr;               // (N, QKV)
  float* dgu_ = nullptr;                // (N, 2F)
  float* dh_ = nullptr;                 // (N, F)
};

}  // namespace strata
