// The Transformer's pieces (see transformer.hpp for the layout and the calling contract) and the
// tensor-parallel parameter table. Only Backend kernels touch tensor data here, so the same code
// runs on any backend.
#include "stratagem/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "src/runtime/context_parallel.hpp"
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
  c.moe = s.moe;
  if (c.moe.enabled()) {
    require(c.moe.top_k >= 1 && c.moe.top_k <= c.moe.experts && c.moe.expert_ffn_hidden > 0 &&
                c.moe.shared_experts >= 0 && c.moe.dense_layers >= 0,
            m + "moe needs 1 <= top_k <= experts, expert_ffn_hidden > 0 and shared_experts >= 0");
  }
  require(c.position != Position::rope || c.head_dim % 2 == 0, m + "RoPE needs an even head_dim");
  c.vocab_rows = c.vocab;
  return c;
}

TransformerConfig TransformerConfig::sharded(int t) const {
  if (tp != 1) throw std::logic_error("TransformerConfig::sharded: already a share");
  auto check = [&](int n, const char* what) {
    if (t < 1 || n % t)
      throw NotSupported("tp " + std::to_string(t) + " does not divide " + what + " (" +
                         std::to_string(n) + "); the runtime shards them evenly");
  };
  check(heads, "the attention heads");
  check(kv_heads, "the key/value heads (GQA)");
  check(ffn_hidden, "ffn_hidden");
  TransformerConfig c = *this;
  c.tp = t;
  c.heads = heads / t;
  c.kv_heads = kv_heads / t;
  c.ffn_hidden = ffn_hidden / t;
  c.vocab_rows = (vocab + t - 1) / t;
  return c;
}

int64_t TransformerConfig::vocab_valid(int r) const {
  return std::max<int64_t>(0, std::min<int64_t>(vocab_rows, vocab - vocab_begin(r)));
}

std::vector<int> ModelPart::layer_list(int num_layers) const {
  if (!layers.empty()) return layers;
  const int end = end_layer < 0 ? num_layers : end_layer;
  std::vector<int> out;
  for (int l = first_layer; l < end; ++l) out.push_back(l);
  return out;
}

int64_t ParamInfo::logical_index(int64_t i) const {
  if (segments.empty()) return i;
  const int64_t cols = shape.ndim() == 2 ? shape[1] : 1;
  const int64_t lcols = logical.ndim() == 2 ? logical[1] : 1;
  const int64_t r = i / cols, c = i % cols;
  for (const ShardSegment& s : segments)
    if (r >= s.local_row && r < s.local_row + s.rows)
      return (s.logical_row + r - s.local_row) * lcols + s.logical_col + c;
  return -1;
}

// ---- parameter table ----------------------------------------------------------------------
void ParamTable::add(ParamInfo info) {
  if (find(info.name)) throw std::invalid_argument("ParamTable: duplicate tensor " + info.name);
  info.offset = size_;
  size_ += info.shape.numel();
  entries_.push_back(std::move(info));
}

void ParamTable::add(std::string name, Shape shape) {
  ParamInfo info;
  info.name = std::move(name);
  info.shape = shape;
  info.logical = shape;
  add(std::move(info));
}

bool is_expert_param(std::string_view name) {
  return name.find(".mlp.experts.") != std::string_view::npos;
}

std::vector<std::pair<int64_t, int64_t>> ParamTable::ranges_of_layer(int layer,
                                                                     Subset subset) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  for (const auto& e : entries_) {
    const bool in_layer = e.name.rfind("layers.", 0) == 0;
    const bool mine = layer >= 0 ? e.name.rfind(prefix, 0) == 0 : !in_layer;
    if (!mine) continue;
    if (subset != Subset::all && is_expert_param(e.name) != (subset == Subset::experts)) continue;
    if (!out.empty() && out.back().second == e.offset)
      out.back().second += e.numel();
    else
      out.push_back({e.offset, e.offset + e.numel()});
  }
  return out;
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

namespace {
// Builders of the tensor-parallel shares (Megatron-LM's column- and row-parallel linears).
struct ShardBuilder {
  const TransformerConfig& c;  // whole model
  int tp, r;
  ParamTable& t;

  void whole(const std::string& name, Shape shape) {
    ParamInfo p;
    p.name = name;
    p.shape = p.logical = shape;
    p.tp_rank = r;
    t.add(std::move(p));
  }
  // Rows split into groups (e.g. q|k|v heads); each group is cut evenly across tp.
  void rows(const std::string& name, std::vector<int64_t> groups, int64_t cols) {
    ParamInfo p;
    p.name = name;
    int64_t local = 0, logical = 0;
    for (int64_t g : groups) {
      p.segments.push_back({local, g / tp, logical + r * (g / tp), 0});
      local += g / tp;
      logical += g;
    }
    p.shape = cols ? Shape{local, cols} : Shape{local};
    p.logical = cols ? Shape{logical, cols} : Shape{logical};
    p.replicated = tp == 1;
    p.tp_rank = r;
    t.add(std::move(p));
  }
  // Columns cut evenly across tp (row-parallel weights).
  void cols(const std::string& name, int64_t rows_, int64_t cols_) {
    ParamInfo p;
    p.name = name;
    p.shape = Shape{rows_, cols_ / tp};
    p.logical = Shape{rows_, cols_};
    p.segments.push_back({0, rows_, 0, r * (cols_ / tp)});
    p.replicated = tp == 1;
    p.tp_rank = r;
    t.add(std::move(p));
  }
  // The vocabulary-parallel word embedding: ceil(V/tp) rows, the last share padded.
  void vocab(const std::string& name, bool tied_copy) {
    const TransformerConfig l = c.sharded(tp);
    ParamInfo p;
    p.name = name;
    p.shape = Shape{l.vocab_rows, c.hidden};
    p.logical = Shape{c.vocab, c.hidden};
    p.segments.push_back({0, l.vocab_valid(r), l.vocab_begin(r), 0});
    p.replicated = tp == 1;
    p.tied_copy = tied_copy;
    p.tp_rank = r;
    t.add(std::move(p));
  }
};
}  // namespace

namespace {
// An MoE layer's router, held experts and shared experts (the layout in transformer.hpp).
void add_moe_params(const TransformerConfig& c, const ModelPart::ExpertShare& part,
                    ShardBuilder& lb, const std::string& p) {
  const MoeSpec& moe = c.moe;
  const int64_t C = c.hidden, Fe = moe.expert_ffn_hidden;
  require(part.ep >= 1 && moe.experts % part.ep == 0 && part.ep_rank >= 0 && part.ep_rank < part.ep,
          "ModelPart: ep " + std::to_string(part.ep) + " must divide the " +
              std::to_string(moe.experts) + " experts");
  require(part.etp >= 1 && Fe % part.etp == 0 && part.etp_rank >= 0 && part.etp_rank < part.etp,
          "ModelPart: etp " + std::to_string(part.etp) + " must divide expert_ffn_hidden " +
              std::to_string(Fe));
  const bool swiglu = c.activation == Activation::swiglu;
  const std::vector<int64_t> groups =
      swiglu ? std::vector<int64_t>{Fe, Fe} : std::vector<int64_t>{Fe};
  lb.whole(p + "mlp.router.weight", Shape{moe.experts, C});
  ShardBuilder eb{c, part.etp, part.etp_rank, lb.t};
  const int local = moe.experts / part.ep;
  for (int e = part.ep_rank * local; e < (part.ep_rank + 1) * local; ++e) {
    const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
    eb.rows(x + "fc1.weight", groups, C);
    eb.cols(x + "fc2.weight", C, Fe);
  }
  if (moe.shared_experts > 0) {
    const int64_t Fs = int64_t(moe.shared_experts) * Fe;
    require(Fs % lb.tp == 0, "ModelPart: tp " + std::to_string(lb.tp) +
                                 " must divide the shared experts' width " + std::to_string(Fs));
    lb.rows(p + "mlp.shared.fc1.weight",
            swiglu ? std::vector<int64_t>{Fs, Fs} : std::vector<int64_t>{Fs}, C);
    lb.cols(p + "mlp.shared.fc2.weight", C, Fs);
  }
}
}  // namespace

ParamTable make_param_table(const TransformerConfig& c, const ModelPart& part) {
  const std::vector<int> layers = part.layer_list(c.layers);
  for (size_t i = 0; i < layers.size(); ++i)
    require(
        layers[i] >= 0 && layers[i] < c.layers && (i == 0 || layers[i] > layers[i - 1]),
        "ModelPart: layers must be increasing and inside the model's " + std::to_string(c.layers));
  require(part.tp >= 1 && part.tp_rank >= 0 && part.tp_rank < part.tp,
          "ModelPart: tp rank outside the tp group");
  const TransformerConfig l = c.sharded(part.tp);  // validates divisibility
  const int64_t C = c.hidden, hd = c.head_dim, F = c.ffn_hidden;
  const bool ln_bias = c.norm == Norm::layernorm && c.bias;
  ParamTable t;
  ShardBuilder sb{c, part.tp, part.tp_rank, t};
  const std::vector<int64_t> qkv_groups = {int64_t(c.heads) * hd, int64_t(c.kv_heads) * hd,
                                           int64_t(c.kv_heads) * hd};
  const std::vector<int64_t> fc1_groups =
      c.activation == Activation::swiglu ? std::vector<int64_t>{F, F} : std::vector<int64_t>{F};
  if (part.embedding || (part.head && c.tied_embeddings)) sb.vocab("wte", !part.embedding);
  if (part.embedding && c.position == Position::learned) sb.whole("wpe", Shape{c.max_seq, C});
  const bool per_layer = !part.layer_tp.empty();
  require(!per_layer ||
              (int(part.layer_tp.size()) == c.layers && int(part.layer_tp_rank.size()) == c.layers),
          "ModelPart: layer_tp and layer_tp_rank need one entry per model layer");
  for (int layer : layers) {
    const std::string p = layer_prefix(layer);
    // A heterogeneous plan's layer is a share of its own tp group.
    ShardBuilder lb{c, per_layer ? part.layer_tp[layer] : part.tp,
                    per_layer ? part.layer_tp_rank[layer] : part.tp_rank, t};
    if (per_layer) {
      require(lb.r >= 0 && lb.r < lb.tp, "ModelPart: a layer's tp rank is outside its tp group");
      c.sharded(lb.tp);  // validates divisibility
    }
    lb.whole(p + "attn.norm.weight", Shape{C});
    if (ln_bias) lb.whole(p + "attn.norm.bias", Shape{C});
    lb.rows(p + "attn.qkv.weight", qkv_groups, C);
    if (c.bias) lb.rows(p + "attn.qkv.bias", qkv_groups, 0);
    lb.cols(p + "attn.proj.weight", C, c.attn_width());
    if (c.bias) lb.whole(p + "attn.proj.bias", Shape{C});
    lb.whole(p + "mlp.norm.weight", Shape{C});
    if (ln_bias) lb.whole(p + "mlp.norm.bias", Shape{C});
    if (c.moe_layer(layer)) {
      require(part.layer_experts.empty() || int(part.layer_experts.size()) == c.layers,
              "ModelPart: layer_experts needs one entry per model layer");
      add_moe_params(
          c,
          part.layer_experts.empty() ? ModelPart::ExpertShare{} : part.layer_experts[size_t(layer)],
          lb, p);
      continue;
    }
    lb.rows(p + "mlp.fc1.weight", fc1_groups, C);
    if (c.bias) lb.rows(p + "mlp.fc1.bias", fc1_groups, 0);
    lb.cols(p + "mlp.fc2.weight", C, F);
    if (c.bias) lb.whole(p + "mlp.fc2.bias", Shape{C});
  }
  if (part.head) {
    sb.whole("norm_f.weight", Shape{C});
    if (ln_bias) sb.whole("norm_f.bias", Shape{C});
    if (!c.tied_embeddings) sb.vocab("lm_head.weight", false);
  }
  (void)l;
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
  w.slot.assign(c.layers, -1);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = layer_prefix(l);
    if (!table.find(p + "attn.qkv.weight")) continue;
    w.slot[l] = static_cast<int>(w.layers.size());
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
    lw.router_w = get(p + "mlp.router.weight");
    for (int e = 0; e < c.moe.experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      Tensor fc1 = get(x + "fc1.weight");
      if (!fc1.defined()) continue;
      if (lw.expert_fc1_w.empty()) lw.first_expert = e;
      require(e == lw.first_expert + int(lw.expert_fc1_w.size()),
              "bind_weights: the experts held by a rank must be consecutive");
      lw.expert_fc1_w.push_back(fc1);
      lw.expert_fc2_w.push_back(get(x + "fc2.weight"));
    }
    lw.shared_fc1_w = get(p + "mlp.shared.fc1.weight");
    lw.shared_fc2_w = get(p + "mlp.shared.fc2.weight");
    w.layers.push_back(std::move(lw));
  }
  return w;
}

Tensor& weight_field(ModelWeights& w, std::string_view name) {
  if (name == "wte") return w.wte;
  if (name == "wpe") return w.wpe;
  if (name == "norm_f.weight") return w.norm_f_w;
  if (name == "norm_f.bias") return w.norm_f_b;
  if (name == "lm_head.weight") return w.lm_head_w;
  if (name.rfind("layers.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    const int l = std::stoi(std::string(name.substr(7, dot - 7)));
    LayerWeights& lw = w.layer(l);
    const std::string_view rest = name.substr(dot + 1);
    const std::pair<std::string_view, Tensor LayerWeights::*> fields[] = {
        {"attn.norm.weight", &LayerWeights::attn_norm_w},
        {"attn.norm.bias", &LayerWeights::attn_norm_b},
        {"attn.qkv.weight", &LayerWeights::qkv_w},
        {"attn.qkv.bias", &LayerWeights::qkv_b},
        {"attn.proj.weight", &LayerWeights::proj_w},
        {"attn.proj.bias", &LayerWeights::proj_b},
        {"mlp.norm.weight", &LayerWeights::mlp_norm_w},
        {"mlp.norm.bias", &LayerWeights::mlp_norm_b},
        {"mlp.fc1.weight", &LayerWeights::fc1_w},
        {"mlp.fc1.bias", &LayerWeights::fc1_b},
        {"mlp.fc2.weight", &LayerWeights::fc2_w},
        {"mlp.fc2.bias", &LayerWeights::fc2_b}};
    for (const auto& [n, f] : fields)
      if (n == rest) return lw.*f;
    if (rest == "mlp.router.weight") return lw.router_w;
    if (rest == "mlp.shared.fc1.weight") return lw.shared_fc1_w;
    if (rest == "mlp.shared.fc2.weight") return lw.shared_fc2_w;
    if (rest.rfind("mlp.experts.", 0) == 0) {
      const std::string_view tail = rest.substr(12);
      const size_t d = tail.find('.');
      const int e = std::stoi(std::string(tail.substr(0, d))) - lw.first_expert;
      if (e >= 0 && e < int(lw.expert_fc1_w.size())) {
        if (tail.substr(d + 1) == "fc1.weight") return lw.expert_fc1_w[size_t(e)];
        if (tail.substr(d + 1) == "fc2.weight") return lw.expert_fc2_w[size_t(e)];
      }
    }
  }
  throw std::logic_error("weight_field: no tensor named " + std::string(name));
}

size_t ModelWeights::index(int l) const {
  if (l < 0 || l >= static_cast<int>(slot.size()) || slot[l] < 0)
    throw std::logic_error("ModelWeights: layer " + std::to_string(l) + " is not on this rank");
  return static_cast<size_t>(slot[l]);
}

// ---- scratch ------------------------------------------------------------------------------
Workspace allocate_workspace(Backend& be, const TransformerConfig& c, int B, int T) {
  Workspace ws;
  ws.B = B;
  ws.T = T;
  ws.d_qkv = be.allocate(Shape{B, T, c.qkv_width()});
  ws.d_attn = be.allocate(Shape{B, T, c.attn_width()});
  ws.d_fc1 = be.allocate(Shape{B, T, c.fc1_width()});
  ws.d_act = be.allocate(Shape{B, T, c.ffn_hidden});
  return ws;
}

// ---- pieces -------------------------------------------------------------------------------
void norm_forward(Backend& be, const TransformerConfig& cfg, const Tensor& x, const Tensor& w,
                  const Tensor& b, Tensor& out, Tensor& mean, Tensor& rstd) {
  if (cfg.norm == Norm::layernorm)
    be.layernorm_forward(out, mean, rstd, x, w, b, cfg.norm_eps);
  else
    be.rmsnorm_forward(out, rstd, x, w, cfg.norm_eps);
}

void norm_backward(Backend& be, const TransformerConfig& cfg, Tensor& dx, Tensor& dw, Tensor& db,
                   const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                   const Tensor& rstd) {
  if (cfg.norm == Norm::layernorm)
    be.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
  else
    be.rmsnorm_backward(dx, dw, dout, x, w, rstd);
}

void embedding_forward(Backend& be, const TransformerConfig& c, const ModelWeights& w,
                       std::span<const int32_t> ids, Tensor& x_out, bool add_positions,
                       const SequenceShare& seq) {
  stream_dims(c, x_out, "embedding_forward");
  const Tensor none;
  const Tensor& wpe = c.position == Position::learned && add_positions ? w.wpe : none;
  if (seq.split() && wpe.defined())
    cp_embedding_forward(be, seq, x_out, ids, w.wte, wpe);
  else
    be.embedding_forward(x_out, ids, w.wte, wpe);
}

void embedding_backward(Backend& be, const TransformerConfig& c, ModelWeights& g,
                        std::span<const int32_t> ids, const Tensor& dx, const SequenceShare& seq) {
  stream_dims(c, dx, "embedding_backward");
  Tensor none;
  Tensor& dwpe = c.position == Position::learned ? g.wpe : none;
  if (seq.split() && dwpe.defined())
    cp_embedding_backward(be, seq, g.wte, dwpe, ids, dx);
  else
    be.embedding_backward(g.wte, dwpe, ids, dx);
}

void attention_qkv_forward(Backend& be, const TransformerConfig& c, const LayerWeights& w,
                           const Tensor& xn, AttentionActs& a, const SequenceShare& seq) {
  be.matmul_forward(a.qkv, xn, w.qkv_w, w.qkv_b);  // (B,T,QKV)
  if (c.position != Position::rope) return;
  if (seq.split())
    cp_rope(be, seq, a.qkv, c, /*backward=*/false);
  else
    be.rope_forward(a.qkv, c.heads, c.kv_heads, c.rope_theta);
}

void attention_proj_forward(Backend& be, const LayerWeights& w, Tensor& y, const AttentionActs& a,
                            bool add_bias) {
  const Tensor none;
  be.matmul_forward(y, a.out, w.proj_w, add_bias ? w.proj_b : none);  // (B,T,C)
}

AttentionGrads attention_grads(const TransformerConfig& c, Workspace& ws, int64_t B, int64_t T) {
  return {scratch_view(ws.d_attn, Shape{B, T, c.attn_width()}, "d_attn"),
          scratch_view(ws.d_qkv, Shape{B, T, c.qkv_width()}, "d_qkv")};
}

void attention_proj_backward(Backend& be, const LayerWeights& w, LayerWeights& g, const Tensor& dy,
                             const AttentionActs& a, Tensor& d_attn) {
  be.matmul_backward(d_attn, g.proj_w, g.proj_b, dy, a.out, w.proj_w);
}

void attention_qkv_backward(Backend& be, const TransformerConfig& c, const LayerWeights& w,
                            LayerWeights& g, Tensor& d_qkv, const Tensor& xn, Tensor& d_xn,
                            const SequenceShare& seq) {
  if (c.position == Position::rope) {
    if (seq.split())
      cp_rope(be, seq, d_qkv, c, /*backward=*/true);
    else
      be.rope_backward(d_qkv, c.heads, c.kv_heads, c.rope_theta);
  }
  be.matmul_backward(d_xn, g.qkv_w, g.qkv_b, d_qkv, xn, w.qkv_w);
}

void attention_forward(Backend& be, const TransformerConfig& c, const LayerWeights& w,
                       const Tensor& xn, Tensor& y, AttentionActs& a, bool add_bias) {
  stream_dims(c, xn, "attention_forward");
  expect_shape(y, xn.shape, "attention_forward", "y");
  attention_qkv_forward(be, c, w, xn, a, SequenceShare{});
  be.attention_forward(a.out, a.att, a.lse, a.qkv, c.heads, c.kv_heads);  // (B,T,NH*hd)
  attention_proj_forward(be, w, y, a, add_bias);
}

void attention_recompute(Backend& be, const TransformerConfig& c, AttentionActs& a, Tensor& att) {
  // The forward kernel is deterministic: out and lse are rewritten with the values they hold.
  be.attention_forward(a.out, att, a.lse, a.qkv, c.heads, c.kv_heads);
  a.att = att;
}

void attention_backward(Backend& be, const TransformerConfig& c, const LayerWeights& w,
                        LayerWeights& g, const Tensor& dy, const Tensor& xn, Tensor& d_xn,
                        const AttentionActs& a, Workspace& ws) {
  const auto [B, T] = stream_dims(c, xn, "attention_backward");
  expect_shape(dy, xn.shape, "attention_backward", "dy");
  expect_shape(d_xn, xn.shape, "attention_backward", "d_xn");
  AttentionGrads d = attention_grads(c, ws, B, T);
  attention_proj_backward(be, w, g, dy, a, d.d_attn);
  be.attention_backward(d.d_qkv, d.d_attn, a.out, a.qkv, a.att, a.lse, c.heads, c.kv_heads);
  attention_qkv_backward(be, c, w, g, d.d_qkv, xn, d_xn, SequenceShare{});
}

void mlp_forward(Backend& be, const TransformerConfig& c, const LayerWeights& w, const Tensor& xn,
                 Tensor& y, MlpActs& a, bool add_bias) {
  stream_dims(c, xn, "mlp_forward");
  expect_shape(y, xn.shape, "mlp_forward", "y");
  const Tensor none;
  be.matmul_forward(a.fc1_out, xn, w.fc1_w, w.fc1_b);  // (B,T,F|2F)
  if (c.activation == Activation::gelu)
    be.gelu_forward(a.act_out, a.fc1_out);
  else
    be.swiglu_forward(a.act_out, a.fc1_out);                            // (B,T,F)
  be.matmul_forward(y, a.act_out, w.fc2_w, add_bias ? w.fc2_b : none);  // (B,T,C)
}

Tensor mlp_fc1_grad(const TransformerConfig& c, Workspace& ws, int64_t B, int64_t T) {
  return scratch_view(ws.d_fc1, Shape{B, T, c.fc1_width()}, "d_fc1");
}

void mlp_backward(Backend& be, const TransformerConfig& c, const LayerWeights& w, LayerWeights& g,
                  const Tensor& dy, const Tensor& xn, Tensor& d_xn, const MlpActs& a,
                  Workspace& ws) {
  const auto [B, T] = stream_dims(c, xn, "mlp_backward");
  expect_shape(dy, xn.shape, "mlp_backward", "dy");
  expect_shape(d_xn, xn.shape, "mlp_backward", "d_xn");
  Tensor d_act = scratch_view(ws.d_act, Shape{B, T, c.ffn_hidden}, "d_act");
  Tensor d_fc1 = mlp_fc1_grad(c, ws, B, T);
  be.matmul_backward(d_act, g.fc2_w, g.fc2_b, dy, a.act_out, w.fc2_w);
  if (c.activation == Activation::gelu)
    be.gelu_backward(d_fc1, d_act, a.fc1_out);
  else
    be.swiglu_backward(d_fc1, d_act, a.fc1_out);
  be.matmul_backward(d_xn, g.fc1_w, g.fc1_b, d_fc1, xn, w.fc1_w);
}

void lm_head_forward(Backend& be, const ModelWeights& w, const Tensor& xn, Tensor& logits) {
  const Tensor none;
  be.matmul_forward(logits, xn, w.head_weight(), none);  // (N,Vl)
}

void lm_head_backward(Backend& be, const ModelWeights& w, ModelWeights& g, const Tensor& dlogits,
                      const Tensor& xn, Tensor& d_xn) {
  Tensor no_bias;
  be.matmul_backward(d_xn, g.head_weight(), no_bias, dlogits, xn, w.head_weight());
}

// ---- a model part on one rank ------------------------------------------------------------
Model make_model(Backend& be, const TransformerConfig& cfg, uint64_t seed, const ModelPart& part) {
  Model m;
  m.config = cfg.sharded(part.tp);
  m.tp_rank = part.tp_rank;
  m.table = make_param_table(cfg, part);
  m.params = be.allocate(Shape{m.table.size()});
  m.grads = be.zeros(Shape{m.table.size()});
  init_parameters(be, cfg, m.table, m.params, seed);
  m.weights = bind_weights(cfg, m.table, m.params);
  m.grad_weights = bind_weights(cfg, m.table, m.grads);
  return m;
}

}  // namespace stratagem
