// The Transformer blocks (see transformer.hpp for the layout and the calling contract), the
// parameter table, and the serial driver the tests use. Only Backend kernels touch tensor
// data here, so the same code runs on any backend.
#include "stratagem/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "stratagem/error.hpp"

namespace stratagem {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// A (possibly smaller) view at the start of a scratch buffer.
Tensor scratch_view(const Tensor& buf, Shape s, const char* what) {
  if (!buf.defined() || s.numel() > buf.numel())
    throw std::invalid_argument(std::string("workspace ") + what + " holds " +
                                std::to_string(buf.numel()) + " floats, " + s.str() +
                                " needs more: allocate the workspace for this micro-batch");
  return buf.slice(0, s);
}

struct BT {
  int64_t B, T;
};

BT stream_dims(const TransformerConfig& cfg, const Tensor& x, const char* where) {
  require(x.defined() && x.ndim() == 3 && x.dim(2) == cfg.hidden,
          std::string(where) + ": residual stream must be (B,T," + std::to_string(cfg.hidden) +
              "), got " + x.shape.str());
  require(x.dim(1) <= cfg.max_seq, std::string(where) + ": T = " + std::to_string(x.dim(1)) +
                                       " exceeds seq_len " + std::to_string(cfg.max_seq));
  return {x.dim(0), x.dim(1)};
}

void norm_forward(Backend& be, const TransformerConfig& cfg, const Tensor& x, const Tensor& w,
                  const Tensor& b, Tensor& out, Tensor& mean, Tensor& rstd) {
  if (cfg.norm == Norm::layernorm)
    be.layernorm_forward(out, mean, rstd, x, w, b, cfg.norm_eps);
  else
    be.rmsnorm_forward(out, rstd, x, w, cfg.norm_eps);
}

// Accumulates into dx (the residual gradient).
void norm_backward(Backend& be, const TransformerConfig& cfg, Tensor& dx, Tensor& dw, Tensor& db,
                   const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                   const Tensor& rstd) {
  if (cfg.norm == Norm::layernorm)
    be.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
  else
    be.rmsnorm_backward(dx, dw, dout, x, w, rstd);
}

std::string layer_prefix(int l) {
  return "layers." + std::to_string(l) + ".";
}

}  // namespace

// ---- config -------------------------------------------------------------------------------
TransformerConfig transformer_config(const ModelSpec& s) {
  if (s.arch != Arch::decoder)
    throw NotSupported("model '" + s.name + "': the training runtime supports decoders only");
  const std::string m = "model '" + s.name + "': ";
  require(s.layers > 0 && s.hidden > 0 && s.heads > 0 && s.vocab > 0 && s.seq_len > 0 &&
              s.ffn_hidden > 0,
          m + "layers, hidden, heads, ffn_hidden, vocab and seq_len must be positive");
  require(s.hidden % s.heads == 0, m + "heads must divide hidden");
  const int kv = s.kv_heads > 0 ? s.kv_heads : s.heads;
  require(s.heads % kv == 0, m + "kv_heads must divide heads");
  TransformerConfig c;
  c.layers = s.layers;
  c.hidden = s.hidden;
  c.heads = s.heads;
  c.kv_heads = kv;
  c.head_dim = s.hidden / s.heads;
  c.ffn_hidden = s.ffn_hidden;
  c.vocab = s.vocab;
  c.max_seq = s.seq_len;
  c.norm = s.norm;
  c.activation = s.activation;
  c.position = s.position;
  c.tied_embeddings = s.tied_embeddings;
  c.bias = s.bias;
  require(c.position != Position::rope || c.head_dim % 2 == 0, m + "RoPE needs an even head_dim");
  return c;
}

// ---- parameter table ----------------------------------------------------------------------
void ParamTable::add(std::string name, Shape shape) {
  if (find(name)) throw std::invalid_argument("ParamTable: duplicate tensor " + name);
  entries_.push_back(ParamInfo{std::move(name), shape, size_});
  size_ += shape.numel();
}

const ParamInfo* ParamTable::find(std::string_view name) const {
  for (const ParamInfo& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const ParamInfo& ParamTable::at(std::string_view name) const {
  if (const ParamInfo* e = find(name)) return *e;
  throw std::out_of_range("ParamTable: no tensor named " + std::string(name));
}

std::vector<ParamSpan> ParamTable::spans(int64_t begin, int64_t end) const {
  require(0 <= begin && begin <= end && end <= size_,
          "ParamTable::spans: range [" + std::to_string(begin) + "," + std::to_string(end) +
              ") outside [0," + std::to_string(size_) + ")");
  std::vector<ParamSpan> out;
  for (const ParamInfo& e : entries_) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel());
    if (lo >= hi) continue;
    if (!out.empty() && out.back().decay == e.decay() &&
        out.back().offset + out.back().numel == lo - begin)
      out.back().numel += hi - lo;  // merge neighbours: fewer, longer kernel calls
    else
      out.push_back(ParamSpan{lo - begin, hi - lo, e.decay()});
  }
  return out;
}

ParamTable make_param_table(const TransformerConfig& c, const ModelPart& part) {
  const int end = part.end_layer < 0 ? c.layers : part.end_layer;
  require(0 <= part.first_layer && part.first_layer <= end && end <= c.layers,
          "ModelPart: layers [" + std::to_string(part.first_layer) + "," + std::to_string(end) +
              ") outside the model's " + std::to_string(c.layers));
  const int64_t C = c.hidden, V = c.vocab;
  const bool ln_bias = c.norm == Norm::layernorm && c.bias;
  ParamTable t;
  if (part.embedding || (part.head && c.tied_embeddings)) t.add("wte", Shape{V, C});
  if (part.embedding && c.position == Position::learned) t.add("wpe", Shape{c.max_seq, C});
  for (int l = part.first_layer; l < end; ++l) {
    const std::string p = layer_prefix(l);
    t.add(p + "attn.norm.weight", Shape{C});
    if (ln_bias) t.add(p + "attn.norm.bias", Shape{C});
    t.add(p + "attn.qkv.weight", Shape{c.qkv_width(), C});
    if (c.bias) t.add(p + "attn.qkv.bias", Shape{c.qkv_width()});
    t.add(p + "attn.proj.weight", Shape{C, c.attn_width()});
    if (c.bias) t.add(p + "attn.proj.bias", Shape{C});
    t.add(p + "mlp.norm.weight", Shape{C});
    if (ln_bias) t.add(p + "mlp.norm.bias", Shape{C});
    t.add(p + "mlp.fc1.weight", Shape{c.fc1_width(), C});
    if (c.bias) t.add(p + "mlp.fc1.bias", Shape{c.fc1_width()});
    t.add(p + "mlp.fc2.weight", Shape{C, c.ffn_hidden});
    if (c.bias) t.add(p + "mlp.fc2.bias", Shape{C});
  }
  if (part.head) {
    t.add("norm_f.weight", Shape{C});
    if (ln_bias) t.add("norm_f.bias", Shape{C});
    if (!c.tied_embeddings) t.add("lm_head.weight", Shape{V, C});
  }
  return t;
}

ModelWeights bind_weights(const TransformerConfig& c, const ParamTable& table, const Tensor& flat) {
  require(flat.numel() >= table.size(), "bind_weights: buffer holds " +
                                            std::to_string(flat.numel()) + " floats, table needs " +
                                            std::to_string(table.size()));
  auto get = [&](const std::string& name) {
    const ParamInfo* e = table.find(name);
    return e ? flat.slice(e->offset, e->shape) : Tensor{};
  };
  ModelWeights w;
  w.wte = get("wte");
  w.wpe = get("wpe");
  w.norm_f_w = get("norm_f.weight");
  w.norm_f_b = get("norm_f.bias");
  w.lm_head_w = get("lm_head.weight");
  int first = -1;
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = layer_prefix(l);
    if (!table.find(p + "attn.qkv.weight")) continue;
    if (first < 0) first = l;
    require(l == first + static_cast<int>(w.layers.size()), "bind_weights: layers not contiguous");
    LayerWeights lw;
    lw.attn_norm_w = get(p + "attn.norm.weight");
    lw.attn_norm_b = get(p + "attn.norm.bias");
    lw.qkv_w = get(p + "attn.qkv.weight");
    lw.qkv_b = get(p + "attn.qkv.bias");
    lw.proj_w = get(p + "attn.proj.weight");
    lw.proj_b = get(p + "attn.proj.bias");
    lw.mlp_norm_w = get(p + "mlp.norm.weight");
    lw.mlp_norm_b = get(p + "mlp.norm.bias");
    lw.fc1_w = get(p + "mlp.fc1.weight");
    lw.fc1_b = get(p + "mlp.fc1.bias");
    lw.fc2_w = get(p + "mlp.fc2.weight");
    lw.fc2_b = get(p + "mlp.fc2.bias");
    w.layers.push_back(std::move(lw));
  }
  w.first_layer = std::max(first, 0);
  return w;
}

// ---- activation and scratch buffers -------------------------------------------------------
AttentionActs allocate_attention_acts(Backend& be, const TransformerConfig& c, int B, int T,
                                      Recompute mode) {
  AttentionActs a;
  a.norm_out = be.allocate(Shape{B, T, c.hidden});
  if (c.norm == Norm::layernorm) a.norm_mean = be.allocate(Shape{B, T});
  a.norm_rstd = be.allocate(Shape{B, T});
  a.qkv = be.allocate(Shape{B, T, c.qkv_width()});
  if (mode == Recompute::none) a.att = be.allocate(Shape{B, c.heads, T, T});
  a.lse = be.allocate(Shape{B, c.heads, T});
  a.out = be.allocate(Shape{B, T, c.attn_width()});
  return a;
}

MlpActs allocate_mlp_acts(Backend& be, const TransformerConfig& c, int B, int T) {
  MlpActs a;
  a.norm_out = be.allocate(Shape{B, T, c.hidden});
  if (c.norm == Norm::layernorm) a.norm_mean = be.allocate(Shape{B, T});
  a.norm_rstd = be.allocate(Shape{B, T});
  a.fc1_out = be.allocate(Shape{B, T, c.fc1_width()});
  a.act_out = be.allocate(Shape{B, T, c.ffn_hidden});
  return a;
}

Workspace allocate_workspace(Backend& be, const TransformerConfig& c, int B, int T) {
  Workspace ws;
  ws.B = B;
  ws.T = T;
  ws.d_norm = be.allocate(Shape{B, T, c.hidden});
  ws.d_qkv = be.allocate(Shape{B, T, c.qkv_width()});
  ws.d_attn = be.allocate(Shape{B, T, c.attn_width()});
  ws.d_fc1 = be.allocate(Shape{B, T, c.fc1_width()});
  ws.d_act = be.allocate(Shape{B, T, c.ffn_hidden});
  ws.head_norm_out = be.allocate(Shape{B, T, c.hidden});
  ws.head_mean = be.allocate(Shape{B, T});
  ws.head_rstd = be.allocate(Shape{B, T});
  ws.losses = be.allocate(Shape{int64_t{B} * T});
  return ws;
}

// ---- blocks -------------------------------------------------------------------------------
void embedding_forward(Backend& be, const TransformerConfig& c, const ModelWeights& w,
                       std::span<const int32_t> tokens, Tensor& x_out) {
  stream_dims(c, x_out, "embedding_forward");
  const Tensor none;
  be.embedding_forward(x_out, tokens, w.wte, c.position == Position::learned ? w.wpe : none);
}

void embedding_backward(Backend& be, const TransformerConfig& c, ModelWeights& g,
                        std::span<const int32_t> tokens, const Tensor& dx) {
  stream_dims(c, dx, "embedding_backward");
  Tensor none;
  be.embedding_backward(g.wte, c.position == Position::learned ? g.wpe : none, tokens, dx);
}

void attention_forward(Backend& be, const TransformerConfig& c, const LayerWeights& w,
                       const Tensor& x_in, Tensor& x_out, AttentionActs& a) {
  stream_dims(c, x_in, "attention_forward");
  expect_shape(x_out, x_in.shape, "attention_forward", "x_out");
  require(x_out.data != x_in.data, "attention_forward: x_out must not alias x_in");
  norm_forward(be, c, x_in, w.attn_norm_w, w.attn_norm_b, a.norm_out, a.norm_mean, a.norm_rstd);
  be.matmul_forward(a.qkv, a.norm_out, w.qkv_w, w.qkv_b);  // (B,T,QKV)
  if (c.position == Position::rope) be.rope_forward(a.qkv, c.heads, c.kv_heads, c.rope_theta);
  be.attention_forward(a.out, a.att, a.lse, a.qkv, c.heads, c.kv_heads);  // (B,T,NH*hd)
  be.matmul_forward(x_out, a.out, w.proj_w, w.proj_b);                    // (B,T,C)
  be.residual_forward(x_out, x_out, x_in);
}

void attention_backward(Backend& be, const TransformerConfig& c, const LayerWeights& w,
                        LayerWeights& g, const Tensor& x_in, Tensor& dx, const AttentionActs& a,
                        Workspace& ws) {
  const auto [B, T] = stream_dims(c, x_in, "attention_backward");
  expect_shape(dx, x_in.shape, "attention_backward", "dx");
  Tensor d_attn = scratch_view(ws.d_attn, Shape{B, T, c.attn_width()}, "d_attn");
  Tensor d_qkv = scratch_view(ws.d_qkv, Shape{B, T, c.qkv_width()}, "d_qkv");
  Tensor d_norm = scratch_view(ws.d_norm, Shape{B, T, c.hidden}, "d_norm");
  be.matmul_backward(d_attn, g.proj_w, g.proj_b, dx, a.out, w.proj_w);
  be.attention_backward(d_qkv, d_attn, a.out, a.qkv, a.att, a.lse, c.heads, c.kv_heads);
  if (c.position == Position::rope) be.rope_backward(d_qkv, c.heads, c.kv_heads, c.rope_theta);
  be.matmul_backward(d_norm, g.qkv_w, g.qkv_b, d_qkv, a.norm_out, w.qkv_w);
  norm_backward(be, c, dx, g.attn_norm_w, g.attn_norm_b, d_norm, x_in, w.attn_norm_w, a.norm_mean,
                a.norm_rstd);
}

void mlp_forward(Backend& be, const TransformerConfig& c, const LayerWeights& w, const Tensor& x_in,
                 Tensor& x_out, MlpActs& a) {
  stream_dims(c, x_in, "mlp_forward");
  expect_shape(x_out, x_in.shape, "mlp_forward", "x_out");
  require(x_out.data != x_in.data, "mlp_forward: x_out must not alias x_in");
  norm_forward(be, c, x_in, w.mlp_norm_w, w.mlp_norm_b, a.norm_out, a.norm_mean, a.norm_rstd);
  be.matmul_forward(a.fc1_out, a.norm_out, w.fc1_w, w.fc1_b);  // (B,T,F|2F)
  if (c.activation == Activation::gelu)
    be.gelu_forward(a.act_out, a.fc1_out);
  else
    be.swiglu_forward(a.act_out, a.fc1_out);              // (B,T,F)
  be.matmul_forward(x_out, a.act_out, w.fc2_w, w.fc2_b);  // (B,T,C)
  be.residual_forward(x_out, x_out, x_in);
}

void mlp_backward(Backend& be, const TransformerConfig& c, const LayerWeights& w, LayerWeights& g,
                  const Tensor& x_in, Tensor& dx, const MlpActs& a, Workspace& ws) {
  const auto [B, T] = stream_dims(c, x_in, "mlp_backward");
  expect_shape(dx, x_in.shape, "mlp_backward", "dx");
  Tensor d_act = scratch_view(ws.d_act, Shape{B, T, c.ffn_hidden}, "d_act");
  Tensor d_fc1 = scratch_view(ws.d_fc1, Shape{B, T, c.fc1_width()}, "d_fc1");
  Tensor d_norm = scratch_view(ws.d_norm, Shape{B, T, c.hidden}, "d_norm");
  be.matmul_backward(d_act, g.fc2_w, g.fc2_b, dx, a.act_out, w.fc2_w);
  if (c.activation == Activation::gelu)
    be.gelu_backward(d_fc1, d_act, a.fc1_out);
  else
    be.swiglu_backward(d_fc1, d_act, a.fc1_out);
  be.matmul_backward(d_norm, g.fc1_w, g.fc1_b, d_fc1, a.norm_out, w.fc1_w);
  norm_backward(be, c, dx, g.mlp_norm_w, g.mlp_norm_b, d_norm, x_in, w.mlp_norm_w, a.norm_mean,
                a.norm_rstd);
}

namespace {
// Shapes shared by the head's two halves: N = B*T rows of the residual stream.
int64_t head_rows(const TransformerConfig& c, const Tensor& x_in, std::span<const int32_t> targets,
                  const Tensor& logits, const char* who) {
  const auto [B, T] = stream_dims(c, x_in, who);
  const int64_t N = B * T;
  require(static_cast<int64_t>(targets.size()) == N, std::string(who) + ": got " +
                                                         std::to_string(targets.size()) +
                                                         " targets for B*T = " + std::to_string(N));
  expect_shape(logits, Shape{N, c.vocab}, who, "logits");
  return N;
}
}  // namespace

float lm_head_forward(Backend& be, const TransformerConfig& c, const ModelWeights& w,
                      const Tensor& x_in, std::span<const int32_t> targets, Tensor& logits,
                      Workspace& ws) {
  const int64_t N = head_rows(c, x_in, targets, logits, "lm_head_forward");
  const auto [B, T] = stream_dims(c, x_in, "lm_head_forward");
  const int64_t C = c.hidden;
  Tensor xn = scratch_view(ws.head_norm_out, Shape{B, T, C}, "head_norm_out");
  Tensor mean =
      c.norm == Norm::layernorm ? scratch_view(ws.head_mean, Shape{B, T}, "head_mean") : Tensor{};
  Tensor rstd = scratch_view(ws.head_rstd, Shape{B, T}, "head_rstd");
  Tensor losses = scratch_view(ws.losses, Shape{N}, "losses");
  norm_forward(be, c, x_in, w.norm_f_w, w.norm_f_b, xn, mean, rstd);
  const Tensor none;
  be.matmul_forward(logits, xn.view(Shape{N, C}), w.head_weight(), none);  // (N,V)
  be.crossentropy_forward(losses, logits, targets);
  std::vector<float> host(static_cast<size_t>(N));
  be.download(host.data(), losses);
  double total = 0;
  for (float l : host) total += l;
  return static_cast<float>(total / static_cast<double>(N));
}

void lm_head_backward(Backend& be, const TransformerConfig& c, const ModelWeights& w,
                      ModelWeights& g, const Tensor& x_in, std::span<const int32_t> targets,
                      float grad_scale, Tensor& logits, Tensor& dx, Workspace& ws) {
  const int64_t N = head_rows(c, x_in, targets, logits, "lm_head_backward");
  const auto [B, T] = stream_dims(c, x_in, "lm_head_backward");
  expect_shape(dx, x_in.shape, "lm_head_backward", "dx");
  const int64_t C = c.hidden;
  // The forward's saved norm output and statistics (the workspace holds one micro-batch's, and
  // the Program runs a head's backward right after its forward).
  Tensor xn = scratch_view(ws.head_norm_out, Shape{B, T, C}, "head_norm_out");
  Tensor mean =
      c.norm == Norm::layernorm ? scratch_view(ws.head_mean, Shape{B, T}, "head_mean") : Tensor{};
  Tensor rstd = scratch_view(ws.head_rstd, Shape{B, T}, "head_rstd");
  Tensor d_norm = scratch_view(ws.d_norm, Shape{N, C}, "d_norm");
  be.crossentropy_softmax_backward(logits, logits, targets,
                                   grad_scale / static_cast<float>(N));  // logits -> dlogits
  const Tensor none;
  Tensor no_bias;
  be.matmul_backward(d_norm, g.head_weight(), no_bias, logits, xn.view(Shape{N, C}),
                     w.head_weight());
  be.fill(dx, 0.0f);
  Tensor d_norm3 = d_norm.view(Shape{B, T, C});
  norm_backward(be, c, dx, g.norm_f_w, g.norm_f_b, d_norm3, x_in, w.norm_f_w, mean, rstd);
}

float lm_head_loss(Backend& be, const TransformerConfig& c, const ModelWeights& w, ModelWeights& g,
                   const Tensor& x_in, std::span<const int32_t> targets, float grad_scale,
                   Tensor& logits, Tensor& dx, Workspace& ws) {
  const float loss = lm_head_forward(be, c, w, x_in, targets, logits, ws);
  lm_head_backward(be, c, w, g, x_in, targets, grad_scale, logits, dx, ws);
  return loss;
}

// ---- the serial driver --------------------------------------------------------------------
Model make_model(Backend& be, const TransformerConfig& cfg, uint64_t seed, const ModelPart& part) {
  Model m;
  m.config = cfg;
  m.table = make_param_table(cfg, part);
  m.params = be.allocate(Shape{m.table.size()});
  m.grads = be.zeros(Shape{m.table.size()});
  init_parameters(be, cfg, m.table, m.params, seed);
  m.weights = bind_weights(cfg, m.table, m.params);
  m.grad_weights = bind_weights(cfg, m.table, m.grads);
  return m;
}

TrainBuffers allocate_train_buffers(Backend& be, const TransformerConfig& c, int micro_batch,
                                    int seq, Recompute mode) {
  require(
      micro_batch > 0 && seq > 0 && seq <= c.max_seq,
      "allocate_train_buffers: need micro_batch > 0 and 0 < seq <= " + std::to_string(c.max_seq));
  TrainBuffers b;
  b.micro_batch = micro_batch;
  b.seq = seq;
  b.recompute = mode;
  const Shape stream{micro_batch, seq, c.hidden};
  for (int i = 0; i < 2 * c.layers + 1; ++i) b.x.push_back(be.allocate(stream));
  const int sets = mode == Recompute::full ? 1 : c.layers;
  for (int i = 0; i < sets; ++i) {
    b.attn.push_back(allocate_attention_acts(be, c, micro_batch, seq, mode));
    b.mlp.push_back(allocate_mlp_acts(be, c, micro_batch, seq));
  }
  if (mode == Recompute::full) b.x_scratch = be.allocate(stream);
  b.dx = be.allocate(stream);
  b.ws = allocate_workspace(be, c, micro_batch, seq);
  b.logits = be.allocate(Shape{int64_t{micro_batch} * seq, c.vocab});
  return b;
}

float forward_backward(Backend& be, Model& model, const Batch& batch, int micro_batches,
                       TrainBuffers& buf, float extra_scale) {
  const TransformerConfig& c = model.config;
  ModelWeights& w = model.weights;
  ModelWeights& g = model.grad_weights;
  require(w.wte.defined() && w.norm_f_w.defined() && static_cast<int>(w.layers.size()) == c.layers,
          "forward_backward: the serial driver needs the whole model (ModelPart{})");
  require(
      micro_batches > 0 && batch.batch == micro_batches * buf.micro_batch && batch.seq == buf.seq,
      "forward_backward: batch " + std::to_string(batch.batch) + "x" + std::to_string(batch.seq) +
          " does not split into " + std::to_string(micro_batches) +
          " micro-batches of the buffers' " + std::to_string(buf.micro_batch) + "x" +
          std::to_string(buf.seq));
  const size_t n = static_cast<size_t>(batch.batch) * batch.seq;
  require(batch.tokens.size() == n && batch.targets.size() == n,
          "forward_backward: tokens and targets must hold batch*seq ids");
  const bool full = buf.recompute == Recompute::full;
  const size_t per_mb = static_cast<size_t>(buf.micro_batch) * buf.seq;
  const int L = c.layers;
  double total = 0;
  for (int mb = 0; mb < micro_batches; ++mb) {
    const auto tokens = batch.tokens.subspan(mb * per_mb, per_mb);
    const auto targets = batch.targets.subspan(mb * per_mb, per_mb);
    auto& x = buf.x;
    embedding_forward(be, c, w, tokens, x[0]);
    for (int l = 0; l < L; ++l) {
      attention_forward(be, c, w.layer(l), x[2 * l], x[2 * l + 1], buf.attn[full ? 0 : l]);
      mlp_forward(be, c, w.layer(l), x[2 * l + 1], x[2 * l + 2], buf.mlp[full ? 0 : l]);
    }
    total += lm_head_loss(be, c, w, g, x[2 * L], targets, extra_scale / micro_batches, buf.logits,
                          buf.dx, buf.ws);
    for (int l = L - 1; l >= 0; --l) {
      if (full) mlp_forward(be, c, w.layer(l), x[2 * l + 1], buf.x_scratch, buf.mlp[0]);
      mlp_backward(be, c, w.layer(l), g.layer(l), x[2 * l + 1], buf.dx, buf.mlp[full ? 0 : l],
                   buf.ws);
      if (full) attention_forward(be, c, w.layer(l), x[2 * l], buf.x_scratch, buf.attn[0]);
      attention_backward(be, c, w.layer(l), g.layer(l), x[2 * l], buf.dx, buf.attn[full ? 0 : l],
                         buf.ws);
    }
    embedding_backward(be, c, g, tokens, buf.dx);
  }
  return static_cast<float>(total / micro_batches);
}

StepStats train_step(Backend& be, Model& model, AdamW& opt, TrainBuffers& buf, const Batch& batch,
                     const TrainOptions& options, int64_t step) {
  StepStats s;
  be.fill(model.grads, 0.0f);
  s.loss = forward_backward(be, model, batch, options.micro_batches, buf);
  s.grad_norm = clip_grad_norm(be, model.grads, options.grad_clip);
  s.lr = options.schedule.at(step);
  const std::vector<ParamSpan> spans = model.table.spans(0, model.table.size());
  opt.step(be, model.params, model.grads, spans, s.lr);
  return s;
}

}  // namespace stratagem
