// The decoder Transformer as separately callable blocks over explicit weights, gradients and
// saved activations, so a per-rank executor can run them in any pipeline order:
//
//   embedding fwd; for each layer: attention fwd, mlp fwd; lm_head fwd; lm_head bwd;
//   for each layer in reverse: mlp bwd, attention bwd; embedding bwd.
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
//   norm_f.weight, norm_f.bias     (C)               final norm
//   lm_head.weight                 (V,C)             untied only; tied heads read wte
// Linear weights are (out, in) like torch.nn.Linear. The gradient buffer has the same layout.
#pragma once
#include <cstdint>
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

  int qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  int attn_width() const { return heads * head_dim; }
  int fc1_width() const { return activation == Activation::swiglu ? 2 * ffn_hidden : ffn_hidden; }
};
// Throws NotSupported for encoders, std::invalid_argument for inconsistent shapes.
TransformerConfig transformer_config(const ModelSpec& spec);

// ---- parameters ---------------------------------------------------------------------------
// Which part of the model a rank holds (a pipeline stage). A stage with the head of a tied
// model holds its own copy of wte (the executor keeps the copies in sync, as Megatron does).
struct ModelPart {
  int first_layer = 0;
  int end_layer = -1;  // one past the last layer; -1 = all layers
  bool embedding = true;
  bool head = true;
};

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in floats, into the flat buffer
  int64_t numel() const { return shape.numel(); }
  bool decay() const { return shape.ndim() == 2; }  // weight decay on 2-D weights only
};

class ParamTable {
 public:
  void add(std::string name, Shape shape);
  const std::vector<ParamInfo>& entries() const { return entries_; }
  int64_t size() const { return size_; }  // floats in the flat buffer
  const ParamInfo* find(std::string_view name) const;
  const ParamInfo& at(std::string_view name) const;  // throws std::out_of_range
  // AdamW spans covering flat range [begin, end), offsets relative to begin (ZeRO-1 shards).
  std::vector<ParamSpan> spans(int64_t begin, int64_t end) const;

 private:
  std::vector<ParamInfo> entries_;
  int64_t size_ = 0;
};
ParamTable make_param_table(const TransformerConfig& cfg, const ModelPart& part = {});

// Views into a flat buffer (parameters or gradients); absent tensors are undefined.
struct LayerWeights {
  Tensor attn_norm_w, attn_norm_b, qkv_w, qkv_b, proj_w, proj_b;
  Tensor mlp_norm_w, mlp_norm_b, fc1_w, fc1_b, fc2_w, fc2_b;
};
struct ModelWeights {
  Tensor wte, wpe;
  int first_layer = 0;
  std::vector<LayerWeights> layers;  // layers[i] is model layer first_layer + i
  Tensor norm_f_w, norm_f_b, lm_head_w;

  LayerWeights& layer(int l) { return layers.at(static_cast<size_t>(l - first_layer)); }
  const LayerWeights& layer(int l) const { return layers.at(static_cast<size_t>(l - first_layer)); }
  const Tensor& head_weight() const { return lm_head_w.defined() ? lm_head_w : wte; }
  Tensor& head_weight() { return lm_head_w.defined() ? lm_head_w : wte; }
};
ModelWeights bind_weights(const TransformerConfig& cfg, const ParamTable& table,
                          const Tensor& flat);

// GPT-2 init: N(0, 0.02); attn.proj and mlp.fc2 weights N(0, 0.02/sqrt(2*layers)); norm
// weights 1; biases 0. Each value is a pure function of (seed, tensor name, element index)
// via a counter-based RNG, so it does not depend on thread count or on the ModelPart.
void init_parameters(Backend& backend, const TransformerConfig& cfg, const ParamTable& table,
                     Tensor& flat, uint64_t seed);

// ---- saved activations (one struct per layer, block and micro-batch) -----------------------
struct AttentionActs {
  Tensor norm_out;   // (B,T,C)
  Tensor norm_mean;  // (B,T) layernorm only
  Tensor norm_rstd;  // (B,T)
  Tensor qkv;        // (B,T,(NH+2KV)*hd) after RoPE
  Tensor att;        // (B,NH,T,T) probabilities; undefined = selective recompute
  Tensor lse;        // (B,NH,T) log-sum-exp of each score row
  Tensor out;        // (B,T,NH*hd) attention output, the input of the projection
};
struct MlpActs {
  Tensor norm_out, norm_mean, norm_rstd;  // as above
  Tensor fc1_out;                         // (B,T,F | 2F)
  Tensor act_out;                         // (B,T,F)
};
// Recompute::none keeps att; selective and full do not. Under `full` the executor keeps only
// the block input and calls *_forward again (into one shared set of acts) right before the
// block's backward.
AttentionActs allocate_attention_acts(Backend& backend, const TransformerConfig& cfg, int B, int T,
                                      Recompute mode);
MlpActs allocate_mlp_acts(Backend& backend, const TransformerConfig& cfg, int B, int T);

// Backward scratch shared by all blocks of one rank; sized for micro-batch (B,T).
struct Workspace {
  int B = 0, T = 0;
  Tensor d_norm;                               // (B,T,C)
  Tensor d_qkv;                                // (B,T,(NH+2KV)*hd)
  Tensor d_attn;                               // (B,T,NH*hd)
  Tensor d_fc1;                                // (B,T,F | 2F)
  Tensor d_act;                                // (B,T,F)
  Tensor head_norm_out, head_mean, head_rstd;  // (B,T,C), (B,T), (B,T)
  Tensor losses;                               // (B*T)
};
Workspace allocate_workspace(Backend& backend, const TransformerConfig& cfg, int B, int T);

// ---- blocks --------------------------------------------------------------------------------
// x (B,T,C) is the residual stream. Forward: x_out = x_in + f(x_in); x_out must not alias
// x_in (backward needs x_in). Backward: dx holds dL/dx_out on entry and dL/dx_in on exit (in
// place); parameter gradients accumulate into `grads`.
void embedding_forward(Backend& be, const TransformerConfig& cfg, const ModelWeights& w,
                       std::span<const int32_t> tokens, Tensor& x_out);
void embedding_backward(Backend& be, const TransformerConfig& cfg, ModelWeights& grads,
                        std::span<const int32_t> tokens, const Tensor& dx);

// norm -> qkv -> RoPE -> causal attention -> out proj -> + residual.
void attention_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                       const Tensor& x_in, Tensor& x_out, AttentionActs& acts);
void attention_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                        LayerWeights& grads, const Tensor& x_in, Tensor& dx,
                        const AttentionActs& acts, Workspace& ws);

// norm -> fc1 (gate|up) -> gelu | swiglu -> fc2 -> + residual.
void mlp_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                 const Tensor& x_in, Tensor& x_out, MlpActs& acts);
void mlp_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                  LayerWeights& grads, const Tensor& x_in, Tensor& dx, const MlpActs& acts,
                  Workspace& ws);

// Final norm -> logits (B*T,V) -> cross-entropy. Returns the mean loss over the B*T tokens.
// logits is the caller's fp32 (B*T,V) buffer: it lives until the backward, as the Program's
// head allocation says; the norm output and statistics stay in the workspace.
float lm_head_forward(Backend& be, const TransformerConfig& cfg, const ModelWeights& w,
                      const Tensor& x_in, std::span<const int32_t> targets, Tensor& logits,
                      Workspace& ws);
// Gradients of grad_scale * mean loss (pass 1/(micro-batches * dp) so accumulation yields the
// global-batch mean) into the head weight and the final norm; logits become dlogits in place;
// dx (B,T,C) is overwritten with dL/dx_in. Must follow the forward of the same micro-batch.
void lm_head_backward(Backend& be, const TransformerConfig& cfg, const ModelWeights& w,
                      ModelWeights& grads, const Tensor& x_in, std::span<const int32_t> targets,
                      float grad_scale, Tensor& logits, Tensor& dx, Workspace& ws);
// Both halves in one call (the serial driver).
float lm_head_loss(Backend& be, const TransformerConfig& cfg, const ModelWeights& w,
                   ModelWeights& grads, const Tensor& x_in, std::span<const int32_t> targets,
                   float grad_scale, Tensor& logits, Tensor& dx, Workspace& ws);

// ---- a whole model on one rank -----------------------------------------------------------
struct Model {
  TransformerConfig config;
  ParamTable table;
  Tensor params, grads;  // flat, table.size() floats each
  ModelWeights weights, grad_weights;
};
Model make_model(Backend& be, const TransformerConfig& cfg, uint64_t seed,
                 const ModelPart& part = {});

// tokens/targets (batch, seq) row-major host ids; micro-batches split the batch dimension.
struct Batch {
  std::span<const int32_t> tokens, targets;
  int batch = 0, seq = 0;
};

// Everything the serial driver needs for one micro-batch shape, allocated once.
struct TrainBuffers {
  int micro_batch = 0, seq = 0;
  Recompute recompute = Recompute::none;
  std::vector<Tensor> x;            // 2*layers+1 residual streams (B,T,C)
  std::vector<AttentionActs> attn;  // per layer; one shared set under Recompute::full
  std::vector<MlpActs> mlp;
  Tensor x_scratch;  // forward output sink when re-running under full
  Tensor dx;         // (B,T,C)
  Tensor logits;     // (B*T,V) fp32, from the head's forward to its backward
  Workspace ws;
};
TrainBuffers allocate_train_buffers(Backend& be, const TransformerConfig& cfg, int micro_batch,
                                    int seq, Recompute mode);

// Serial forward + backward of every micro-batch through the block functions above.
// Gradients accumulate into model.grads (zero them first); each micro-batch's loss is scaled
// by 1/micro_batches * extra_scale. Returns the mean loss over the batch.
float forward_backward(Backend& be, Model& model, const Batch& batch, int micro_batches,
                       TrainBuffers& buf, float extra_scale = 1.0f);

struct TrainOptions {
  int micro_batches = 1;
  float grad_clip = 1.0f;  // <= 0 disables
  LrSchedule schedule;
};
struct StepStats {
  float loss = 0, grad_norm = 0, lr = 0;
};
// zero grads -> forward_backward -> clip -> AdamW at lr = schedule.at(step).
StepStats train_step(Backend& be, Model& model, AdamW& opt, TrainBuffers& buf, const Batch& batch,
                     const TrainOptions& options, int64_t step);

}  // namespace stratagem
