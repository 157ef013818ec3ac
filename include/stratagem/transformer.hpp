// The decoder Transformer as separately callable pieces over explicit weights, gradients and
// saved activations, split where the Program puts a tensor-parallel collective (Megatron-LM):
//
//   block forward  = norm -> [all-gather] -> core (partial sum under tp) -> [reduce] -> + residual
//   block backward = [gather] -> core backward (partial) -> [reduce] -> norm backward (+ residual)
//
// The executor (executor.hpp) runs the pieces in the Program's order on any pipeline stage;
// with tp = 1 the collectives vanish and the pieces compose into the plain serial model.
// Tensor parallelism shards parameters: qkv and fc1 by rows (column-parallel), attn.proj and
// fc2 by columns (row-parallel), wte by vocabulary rows (padded to a multiple of tp); norms and
// row-parallel biases stay whole on every rank.
//
// Families: GPT-2 (layernorm, gelu, learned positions, biases, tied head) and LLaMA (rmsnorm,
// swiglu, RoPE, no biases, untied head, GQA); each ModelSpec field is honoured on its own.
// Dropout is not applied (p = 0). Encoders throw NotSupported.
//
// Flat parameter layout (one fp32 buffer, in this order; ParamTable has names and offsets):
//   wte                            (V,C)
//   wpe                            (maxT,C)          learned positions only
//   layers.<i>.attn.norm.weight    (C)
//   layers.<i>.attn.norm.bias      (C)               layernorm with bias only
//   layers.<i>.attn.qkv.weight     ((NH+2KV)*hd, C)  rows: NH q heads, KV k heads, KV v heads
//   layers.<i>.attn.qkv.bias       ((NH+2KV)*hd)     bias only
//   layers.<i>.attn.proj.weight    (C, NH*hd)
//   layers.<i>.attn.proj.bias      (C)
//   layers.<i>.mlp.norm.weight     (C)
//   layers.<i>.mlp.norm.bias       (C)
//   layers.<i>.mlp.fc1.weight      (F,C) gelu | (2F,C) swiglu: rows [0,F) gate, [F,2F) up
//   layers.<i>.mlp.fc1.bias        (F | 2F)
//   layers.<i>.mlp.fc2.weight      (C,F)
//   layers.<i>.mlp.fc2.bias        (C)
// An MoE layer (ModelSpec::is_moe_layer) holds, in place of mlp.fc1 and mlp.fc2 (moe_block.hpp):
//   layers.<i>.mlp.router.weight        (E,C)
//   layers.<i>.mlp.experts.<e>.fc1.weight  (2Fe,C) swiglu | (Fe,C) gelu, for each held expert e
//   layers.<i>.mlp.experts.<e>.fc2.weight  (C,Fe)
//   layers.<i>.mlp.shared.fc1.weight    (2S*Fe,C) | (S*Fe,C)   shared experts only (S of them)
//   layers.<i>.mlp.shared.fc2.weight    (C,S*Fe)
// without biases (Mixtral and DeepSeek-V3 have none). Expert parallelism holds experts
// [ep_rank*E/ep, (ep_rank+1)*E/ep); etp shards each held expert as tp shards the dense MLP.
//   norm_f.weight, norm_f.bias     (C)               final norm
//   lm_head.weight                 (V,C)             untied only; tied heads read wte
// Linear weights are (out, in) like torch.nn.Linear. The gradient buffer has the same layout.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stratagem/backend.hpp"
#include "stratagem/model.hpp"
#include "stratagem/optimizer.hpp"
#include "stratagem/plan.hpp"  // Recompute

namespace stratagem {

// ---- shapes -------------------------------------------------------------------------------
// Shapes of one tensor-parallel rank: heads, kv_heads, ffn_hidden and the vocabulary are this
// rank's share (tp = 1: the whole model).
struct TransformerConfig {
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn_hidden = 0;
  int vocab = 0, max_seq = 0;
  Norm norm = Norm::layernorm;
  Activation activation = Activation::gelu;
  Position position = Position::learned;
  bool tied_embeddings = true;
  bool bias = true;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  MoeSpec moe;         // routed experts (moe.enabled()); expert shapes are never tp shares
  int tp = 1;          // tensor-parallel degree these shapes are shares of
  int vocab_rows = 0;  // rows of this rank's wte shard: ceil(vocab / tp) (vocab when tp = 1)

  int qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  int attn_width() const { return heads * head_dim; }
  int fc1_width() const { return activation == Activation::swiglu ? 2 * ffn_hidden : ffn_hidden; }
  bool moe_layer(int layer) const { return moe.enabled() && layer >= moe.dense_layers; }
  // The fc1 rows of an FFN of width f (gate | up under SwiGLU).
  int fc1_rows(int f) const { return activation == Activation::swiglu ? 2 * f : f; }
  // The share of one rank of a tp group; throws NotSupported when heads, kv heads or the ffn
  // width do not divide by tp.
  TransformerConfig sharded(int tp) const;
  // Vocabulary ids [begin, begin + valid) held by tp rank r (the rest of its rows is padding).
  int64_t vocab_begin(int r) const { return int64_t(r) * vocab_rows; }
  int64_t vocab_valid(int r) const;
};
// Throws NotSupported for encoders, std::invalid_argument for inconsistent shapes.
TransformerConfig transformer_config(const ModelSpec& spec);

// ---- parameters ---------------------------------------------------------------------------
// Which part of the model a rank holds: a pipeline stage's layers and one tensor-parallel share.
// A stage with the head of a tied model holds its own copy of wte (the executor keeps the
// copies in sync, as Megatron does).
struct ModelPart {
  int first_layer = 0;
  int end_layer = -1;  // one past the last layer; -1 = all layers
  bool embedding = true;
  bool head = true;
  int tp = 1, tp_rank = 0;
  std::vector<int> layers;  // when set: exactly these layers (an interleaved stage's chunks)
  // Heterogeneous plans: per model layer, the tp degree and this rank's index in its tp group
  // (empty: every layer's share is (tp, tp_rank), as the embedding's).
  std::vector<int> layer_tp, layer_tp_rank;
  // MoE layers, per model layer: the expert-parallel share (which experts are held) and the
  // expert tensor-parallel share of each held expert (empty: every expert whole on the rank).
  struct ExpertShare {
    int ep = 1, ep_rank = 0, etp = 1, etp_rank = 0;
  };
  std::vector<ExpertShare> layer_experts;
  std::vector<int> layer_list(int num_layers) const;
};

// Local rows [local_row, local_row + rows) of a sharded tensor are the logical tensor's rows
// [logical_row, ...), starting at logical column `logical_col` (row-parallel weights).
struct ShardSegment {
  int64_t local_row = 0, rows = 0, logical_row = 0, logical_col = 0;
};

struct ParamInfo {
  std::string name;
  Shape shape;                         // this rank's (local) shape
  int64_t offset = 0;                  // in floats, into the flat buffer
  Shape logical;                       // the whole tensor's shape
  std::vector<ShardSegment> segments;  // where the local rows sit in the logical tensor
  bool replicated = true;              // whole on every rank of the tp group
  int tp_rank = 0;                     // this rank's index in the tp group it is shared over
  bool tied_copy = false;              // the last stage's copy of a tied wte
  int64_t numel() const { return shape.numel(); }
  bool decay() const { return shape.ndim() == 2; }  // weight decay on 2-D weights only
  // Flat index in the logical tensor of local element i, or -1 for padding.
  int64_t logical_index(int64_t i) const;
};

class ParamTable {
 public:
  void add(ParamInfo info);
  void add(std::string name, Shape shape);  // a whole (unsharded) tensor
  const std::vector<ParamInfo>& entries() const { return entries_; }
  int64_t size() const { return size_; }  // floats in the flat buffer
  const ParamInfo* find(std::string_view name) const;
  const ParamInfo& at(std::string_view name) const;  // throws std::out_of_range
  // AdamW spans covering flat range [begin, end), offsets relative to begin (ZeRO-1 shards).
  std::vector<ParamSpan> spans(int64_t begin, int64_t end) const;
  // Flat runs of the parameters of `layer` (-1: everything outside the layers); of an MoE
  // layer, all of them, those outside its routed experts, or its routed experts only.
  enum class Subset { all, without_experts, experts };
  std::vector<std::pair<int64_t, int64_t>> ranges_of_layer(int layer,
                                                           Subset subset = Subset::all) const;

 private:
  std::vector<ParamInfo> entries_;
  int64_t size_ = 0;
};
// `cfg` is the whole model's config; the part's tp shares it.
ParamTable make_param_table(const TransformerConfig& cfg, const ModelPart& part = {});
// A routed expert's tensor (layers.<i>.mlp.experts.<e>.*), held by expert parallelism.
bool is_expert_param(std::string_view name);

// Views into a flat buffer (parameters or gradients); absent tensors are undefined.
struct LayerWeights {
  Tensor attn_norm_w, attn_norm_b, qkv_w, qkv_b, proj_w, proj_b;
  Tensor mlp_norm_w, mlp_norm_b, fc1_w, fc1_b, fc2_w, fc2_b;
  // MoE layers only: the router, the held experts (first_expert, first_expert + 1, ...) and
  // the shared experts (undefined when there are none).
  Tensor router_w;
  int first_expert = 0;
  std::vector<Tensor> expert_fc1_w, expert_fc2_w;
  Tensor shared_fc1_w, shared_fc2_w;
};
struct ModelWeights {
  Tensor wte, wpe;
  std::vector<int> slot;             // model layer -> index into layers, -1 when not held
  std::vector<LayerWeights> layers;  // the held layers in increasing order
  Tensor norm_f_w, norm_f_b, lm_head_w;

  LayerWeights& layer(int l) { return layers.at(index(l)); }
  const LayerWeights& layer(int l) const { return layers.at(index(l)); }
  const Tensor& head_weight() const { return lm_head_w.defined() ? lm_head_w : wte; }
  Tensor& head_weight() { return lm_head_w.defined() ? lm_head_w : wte; }

 private:
  size_t index(int l) const;
};
ModelWeights bind_weights(const TransformerConfig& cfg, const ParamTable& table,
                          const Tensor& flat);
// The field of `w` that holds the tensor named `name` (a ParamTable name); throws for an
// unknown name or a layer `w` does not hold.
Tensor& weight_field(ModelWeights& w, std::string_view name);

// GPT-2 init: N(0, 0.02); attn.proj and mlp.fc2 weights N(0, 0.02/sqrt(2*layers)); norm
// weights 1; biases 0; vocabulary padding 0. Each value is a pure function of (seed, tensor
// name, logical element index) via a counter-based RNG, so it does not depend on thread count,
// pipeline stage or tensor-parallel share.
void init_parameters(Backend& backend, const TransformerConfig& cfg, const ParamTable& table,
                     Tensor& flat, uint64_t seed);

// ---- saved activations (one struct per layer, block and micro-batch) -----------------------
// T is the whole sequence; under sequence parallelism the norm tensors hold the rank's token
// shard (N/tp rows) instead.
struct AttentionActs {
  Tensor norm_out;   // (B,T,C) normalized input (the token shard under sp)
  Tensor norm_mean;  // (B,T) layernorm only
  Tensor norm_rstd;  // (B,T)
  Tensor qkv;        // (B,T,(NH+2KV)*hd) after RoPE
  Tensor att;        // (B,NH,T,T) probabilities; undefined = rebuilt in backward (selective)
  Tensor lse;        // (B,NH,T) log-sum-exp of each score row
  Tensor out;        // (B,T,NH*hd) attention output, the input of the projection
  // cp a2a: the core's output for its head group over the whole sequence (B,T*cp,NH/cp*hd),
  // which its backward reads (context_parallel.hpp).
  Tensor out_heads;
};
struct MlpActs {
  Tensor norm_out, norm_mean, norm_rstd;  // as above
  Tensor fc1_out;                         // (B,T,F | 2F)
  Tensor act_out;                         // (B,T,F)
};

// Backward scratch shared by all blocks of one rank; sized for micro-batch (B,T).
struct Workspace {
  int B = 0, T = 0;
  Tensor d_qkv;   // (B,T,(NH+2KV)*hd)
  Tensor d_attn;  // (B,T,NH*hd)
  Tensor d_fc1;   // (B,T,F | 2F)
  Tensor d_act;   // (B,T,F)
};
Workspace allocate_workspace(Backend& backend, const TransformerConfig& cfg, int B, int T);

// ---- the rank's share of the sequence (context parallelism) ----------------------------------
class Communicator;
// Under context parallelism a rank's rows (B, T/cp, ...) are the chunks cp_rank and
// 2 cp - 1 - cp_rank of the sequence cut into 2 cp (Megatron-Core's load-balanced order,
// src/runtime/context_parallel.hpp): positions (learned or rotary) are those chunks', and
// attention runs over the cp group by `kind`. The default, cp = 1, is the whole sequence.
struct SequenceShare {
  int cp = 1, cp_rank = 0;
  int64_t seq_len = 0;  // the whole sequence
  CpKind kind = CpKind::ring;
  Communicator* comm = nullptr;  // the cp group, when cp > 1
  bool split() const { return cp > 1; }
};

// ---- pieces ----------------------------------------------------------------------------------
// Norm over the last dim of x (N rows of C): mean is undefined for RMSNorm.
void norm_forward(Backend& be, const TransformerConfig& cfg, const Tensor& x, const Tensor& w,
                  const Tensor& b, Tensor& out, Tensor& mean, Tensor& rstd);
// dx ACCUMULATES (it is the residual stream's gradient); dw, db accumulate.
void norm_backward(Backend& be, const TransformerConfig& cfg, Tensor& dx, Tensor& dw, Tensor& db,
                   const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                   const Tensor& rstd);

// Vocabulary-parallel lookup: local_ids (B*T) are ids inside this rank's wte shard or -1.
// x_out (B,T,C) = wte rows (+ wpe when add_positions: one rank of a tp group adds them, so the
// group's sum holds them once).
void embedding_forward(Backend& be, const TransformerConfig& cfg, const ModelWeights& w,
                       std::span<const int32_t> local_ids, Tensor& x_out, bool add_positions,
                       const SequenceShare& seq = {});
void embedding_backward(Backend& be, const TransformerConfig& cfg, ModelWeights& grads,
                        std::span<const int32_t> local_ids, const Tensor& dx,
                        const SequenceShare& seq = {});

// Attention core: xn (B,T,C) normalized input -> qkv -> RoPE -> causal attention -> out proj.
// y (B,T,C) is this rank's partial sum of the block output (add_bias: the rank that adds the
// row-parallel bias). Saves qkv, att (when defined), lse and out in acts. Context parallelism
// runs the block in its parts instead (below).
void attention_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                       const Tensor& xn, Tensor& y, AttentionActs& acts, bool add_bias);
// dy (B,T,C) gradient of the block output (whole); d_xn (B,T,C) = this rank's partial gradient
// of the normalized input (overwritten). Weight gradients accumulate.
void attention_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                        LayerWeights& grads, const Tensor& dy, const Tensor& xn, Tensor& d_xn,
                        const AttentionActs& acts, Workspace& ws);
// Rebuilds the attention probabilities from the saved q, k (selective recompute) into att.
// Not under context parallelism, which never keeps them.
void attention_recompute(Backend& be, const TransformerConfig& cfg, AttentionActs& acts,
                         Tensor& att);

// The attention block's parts around its core, which context parallelism runs as ops of their
// own with the cp group's transfers between them (src/runtime/exec/ops_cp.cpp): forward the
// QKV projection and RoPE (at the rank's positions under cp), then the output projection;
// backward the reverse, through the workspace's views.
struct AttentionGrads {
  Tensor d_attn;  // (B,T,NH*hd) gradient of the core's output
  Tensor d_qkv;   // (B,T,(NH+2KV)*hd) gradient of the core's input
};
AttentionGrads attention_grads(const TransformerConfig& cfg, Workspace& ws, int64_t B, int64_t T);
// acts.qkv = RoPE(xn W_qkv + b).
void attention_qkv_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                           const Tensor& xn, AttentionActs& acts, const SequenceShare& seq);
// y = acts.out W_proj (+ b).
void attention_proj_forward(Backend& be, const LayerWeights& w, Tensor& y,
                            const AttentionActs& acts, bool add_bias);
// d_attn = dy W_proj^T (overwritten); the projection's gradients accumulate.
void attention_proj_backward(Backend& be, const LayerWeights& w, LayerWeights& grads,
                             const Tensor& dy, const AttentionActs& acts, Tensor& d_attn);
// RoPE's inverse on d_qkv (in place), then d_xn (overwritten) and the QKV gradients.
void attention_qkv_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                            LayerWeights& grads, Tensor& d_qkv, const Tensor& xn, Tensor& d_xn,
                            const SequenceShare& seq);

// MLP core: xn -> fc1 (gate|up) -> gelu | swiglu -> fc2 -> y partial; backward as above. Its
// backward leaves fc1's output gradient in the workspace's view mlp_fc1_grad.
Tensor mlp_fc1_grad(const TransformerConfig& cfg, Workspace& ws, int64_t B, int64_t T);
void mlp_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w, const Tensor& xn,
                 Tensor& y, MlpActs& acts, bool add_bias);
void mlp_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                  LayerWeights& grads, const Tensor& dy, const Tensor& xn, Tensor& d_xn,
                  const MlpActs& acts, Workspace& ws);

// LM head: logits (N,Vl) = xn (N,C) @ head_weight^T (this rank's vocabulary rows).
void lm_head_forward(Backend& be, const ModelWeights& w, const Tensor& xn, Tensor& logits);
// dlogits (N,Vl) -> head weight gradient (accumulates) and d_xn (N,C), this rank's partial.
void lm_head_backward(Backend& be, const ModelWeights& w, ModelWeights& grads,
                      const Tensor& dlogits, const Tensor& xn, Tensor& d_xn);

// ---- a whole model on one rank -----------------------------------------------------------
struct Model {
  TransformerConfig config;  // this rank's share
  int tp_rank = 0;
  ParamTable table;
  Tensor params, grads;  // flat, table.size() floats each
  ModelWeights weights, grad_weights;
};
Model make_model(Backend& be, const TransformerConfig& cfg, uint64_t seed,
                 const ModelPart& part = {});

}  // namespace stratagem
