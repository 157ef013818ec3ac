#include "stratagem/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string_view>

#include "stratagem/error.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

const char* to_string(Arch a) {
  return a == Arch::decoder ? "decoder" : "encoder";
}
const char* to_string(Norm n) {
  return n == Norm::layernorm ? "layernorm" : "rmsnorm";
}
const char* to_string(Activation a) {
  return a == Activation::gelu ? "gelu" : "swiglu";
}
const char* to_string(Position p) {
  return p == Position::learned ? "learned" : "rope";
}

const char* to_string(AttentionKind a) {
  return a == AttentionKind::mha ? "mha" : "mla";
}
const char* to_string(RouterScore r) {
  return r == RouterScore::softmax ? "softmax" : "sigmoid";
}

namespace {
bool safe_name_char(char ch) {
  const auto c = static_cast<unsigned char>(ch);
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view(" ._-+/:@()[]~").find(ch) != std::string_view::npos;
}
}  // namespace

bool is_safe_name(const std::string& name) {
  return name.size() <= kMaxNameBytes && std::all_of(name.begin(), name.end(), safe_name_char);
}

std::string to_safe_name(const std::string& text) {
  std::string out = text.substr(0, kMaxNameBytes);
  for (char& ch : out)
    if (!safe_name_char(ch)) ch = '_';
  return out;
}

std::string data_dir() {
  if (const char* env = std::getenv("STRATAGEM_DATA")) return env;
  return STRATAGEM_DATA_DIR;
}

namespace {
int64_t norm_parameters(const ModelSpec& m) {
  return m.norm == Norm::layernorm && m.bias ? 2LL * m.hidden : m.hidden;
}
}  // namespace

int64_t ModelSpec::attention_parameters() const {
  const int64_t h = hidden, kv = kv_hidden();
  if (attention == AttentionKind::mla) {
    // DeepSeek-V2/V3 (modeling_deepseek.py DeepseekV3Attention): the query through a low-rank
    // q_a_proj, its RMSNorm and q_b_proj (or one q_proj when q_lora_rank is 0); the compressed
    // KV and the shared RoPE key from kv_a_proj_with_mqa, the KV's RMSNorm, kv_b_proj to every
    // head's key (no RoPE part) and value; o_proj. No linear biases (validate() refuses them).
    const int64_t a = heads, q = mla.q_lora_rank, c = mla.kv_lora_rank;
    const int64_t dn = mla.qk_nope_head_dim, dr = mla.qk_rope_head_dim, dv = mla.v_head_dim;
    const int64_t query = q > 0 ? h * q + q + q * a * (dn + dr) : h * a * (dn + dr);
    const int64_t key_value = h * (c + dr) + c + c * a * (dn + dv);
    return query + key_value + a * dv * h + norm_parameters(*this);
  }
  int64_t attn = h * (h + 2 * kv) + h * h;
  if (bias) attn += (h + 2 * kv) + h;
  return attn + norm_parameters(*this);
}

namespace {
// An FFN of width f: GELU's fc1 and fc2, or SwiGLU's gate, up and down projections.
int64_t ffn_parameters(const ModelSpec& m, int64_t f) {
  const int64_t h = m.hidden;
  int64_t p = (m.activation == Activation::swiglu ? 3 : 2) * h * f;
  if (m.bias) p += (m.activation == Activation::swiglu ? 2 * f : f) + h;
  return p;
}
}  // namespace

int64_t ModelSpec::dense_ffn_parameters() const {
  return ffn_parameters(*this, ffn_hidden) + norm_parameters(*this);
}

int64_t ModelSpec::expert_parameters() const {
  return moe.enabled() ? ffn_parameters(*this, moe.expert_ffn_hidden) : 0;
}

int64_t ModelSpec::router_parameters() const {
  // The gate is a bias-free linear map from the token to one score per routed expert
  // (Mixtral's block_sparse_moe.gate, DeepSeek's MoEGate.weight). DeepSeek-V3's
  // e_score_correction_bias (one per expert, set by its balancing rule, not by gradients) is
  // left out: 256 per layer.
  return moe.enabled() ? int64_t(moe.experts) * hidden : 0;
}

int64_t ModelSpec::moe_ffn_parameters() const {
  if (!moe.enabled()) return 0;
  return int64_t(moe.experts + moe.shared_experts) * expert_parameters() + router_parameters() +
         norm_parameters(*this);
}

int64_t ModelSpec::layer_parameters() const {
  return attention_parameters() + dense_ffn_parameters();
}

int64_t ModelSpec::layer_parameters(int layer) const {
  return is_moe_layer(layer) ? attention_parameters() + moe_ffn_parameters() : layer_parameters();
}

int64_t ModelSpec::embedding_parameters() const {
  int64_t p = int64_t(vocab) * hidden;
  if (position == Position::learned) p += int64_t(seq_len) * hidden;
  if (type_vocab > 0) p += int64_t(type_vocab) * hidden;
  if (arch == Arch::encoder) p += norm_parameters(*this);  // BERT's embedding LayerNorm
  return p;
}

int64_t ModelSpec::head_parameters() const {
  const int64_t h = hidden;
  if (arch == Arch::encoder) {
    // BERT pre-training heads: pooler (h x h + h), MLM transform (h x h + h + norm), and the
    // decoder bias over the vocabulary (its weight is tied to the word embedding).
    return (h * h + h) + (h * h + h + norm_parameters(*this)) + vocab;
  }
  int64_t p = norm_parameters(*this);  // final norm
  if (!tied_embeddings) p += int64_t(vocab) * hidden;
  return p;
}

namespace {
int moe_layer_count(const ModelSpec& m) {
  return m.moe.enabled() ? m.layers - m.moe.dense_layers : 0;
}
}  // namespace

int64_t ModelSpec::parameters() const {
  const int64_t moe_layers = moe_layer_count(*this);
  return (layers - moe_layers) * layer_parameters() +
         moe_layers * (attention_parameters() + moe_ffn_parameters()) + embedding_parameters() +
         head_parameters();
}

int64_t ModelSpec::active_parameters() const {
  const int64_t idle_experts = moe.enabled() ? moe.experts - moe.top_k : 0;
  return parameters() - moe_layer_count(*this) * idle_experts * expert_parameters();
}

int64_t ModelSpec::kv_cache_elements_per_token() const {
  const int64_t per_layer = attention == AttentionKind::mla
                                ? int64_t(mla.kv_lora_rank) + mla.qk_rope_head_dim
                                : 2LL * kv_hidden();
  return layers * per_layer;
}

double ModelSpec::flops_per_token() const {
  return model_flops_per_iteration(*this, 1) / seq_len;
}

namespace {
using Bad = std::function<void(const std::string& field, const std::string& what)>;

void validate_mla(const ModelSpec& m, const std::string& source, const Bad& bad) {
  if (m.attention != AttentionKind::mla) {
    if (m.mla != MlaSpec{}) bad("mla", "given, but attention is not \"mla\"");
    return;
  }
  const MlaSpec& a = m.mla;
  if (a.q_lora_rank < 0) bad("mla.q_lora_rank", "expected >= 0 (0: an uncompressed query)");
  if (a.kv_lora_rank < 1) bad("mla.kv_lora_rank", "expected >= 1");
  if (a.qk_nope_head_dim < 1) bad("mla.qk_nope_head_dim", "expected >= 1");
  if (a.qk_rope_head_dim < 2 || a.qk_rope_head_dim % 2)
    bad("mla.qk_rope_head_dim", "expected an even number >= 2 (RoPE rotates pairs)");
  if (a.v_head_dim < 1) bad("mla.v_head_dim", "expected >= 1");
  if (m.kv_heads != m.heads)
    bad("kv_heads", "must equal heads under MLA (each head's key and value come from the latent)");
  if (m.position != Position::rope) bad("position", "must be rope under MLA (its decoupled RoPE)");
  if (m.bias) bad("bias", "must be false under MLA (DeepSeek's projections have no biases)");
  if (m.arch != Arch::decoder) bad("arch", "must be decoder under MLA");
  using limits::checked_product;
  using limits::checked_sum;
  const int64_t h = m.hidden, heads = m.heads, q = a.q_lora_rank, c = a.kv_lora_rank;
  const int64_t qk = int64_t(a.qk_nope_head_dim) + a.qk_rope_head_dim;
  const int64_t q_down = q > 0 ? checked_product(source, "MLA query down-projection weights",
                                                 {{"hidden", h}, {"q_lora_rank", q}})
                               : 0;
  const int64_t q_up = checked_product(
      source, "MLA query up-projection weights",
      {{"q_lora_rank or hidden", q > 0 ? q : h}, {"heads", heads}, {"qk head dim", qk}});
  const int64_t kv_down =
      checked_product(source, "MLA key/value down-projection weights",
                      {{"hidden", h}, {"kv_lora_rank + qk_rope_head_dim", c + a.qk_rope_head_dim}});
  const int64_t kv_up = checked_product(
      source, "MLA key/value up-projection weights",
      {{"kv_lora_rank", c},
       {"heads", heads},
       {"qk_nope_head_dim + v_head_dim", int64_t(a.qk_nope_head_dim) + a.v_head_dim}});
  const int64_t out =
      checked_product(source, "MLA output projection weights",
                      {{"heads", heads}, {"v_head_dim", a.v_head_dim}, {"hidden", h}});
  int64_t layer = q_down + q + c + h;  // q_down below 2^56 (checked), the norms below 2^32
  for (int64_t w : {q_up, kv_down, kv_up, out})
    layer = checked_sum(source, "MLA weights", layer, w);
  checked_product(source, "MLA weights of all layers",
                  {{"layers", m.layers}, {"MLA weights of one layer", layer}});
  checked_product(
      source, "MLA queries, keys and values of one sample",
      {{"seq_len", m.seq_len}, {"heads", heads}, {"3 x head dims", 3 * qk + a.v_head_dim}});
}

void validate_moe(const ModelSpec& m, const std::string& source, const Bad& bad) {
  const MoeSpec& e = m.moe;
  if (!e.enabled()) {
    if (e.experts < 0) bad("moe.experts", "expected >= 1");
    if (e != MoeSpec{}) bad("moe.experts", "expected >= 1 (other moe fields are set)");
    return;
  }
  const std::string experts = " (" + std::to_string(e.experts) + ")";
  if (e.top_k < 1) bad("moe.top_k", "expected >= 1");
  if (e.top_k > e.experts) bad("moe.top_k", "expected at most experts" + experts);
  if (e.expert_ffn_hidden < 1) bad("moe.expert_ffn_hidden", "expected >= 1");
  if (e.shared_experts < 0) bad("moe.shared_experts", "expected >= 0");
  if (e.dense_layers < 0) bad("moe.dense_layers", "expected >= 0");
  if (e.dense_layers >= m.layers)
    bad("moe.dense_layers", "expected fewer than layers (" + std::to_string(m.layers) +
                                "): at least one layer must have experts");
  if (!(e.aux_loss_coeff >= 0) || !std::isfinite(e.aux_loss_coeff))
    bad("moe.aux_loss_coeff", "expected a finite number >= 0");
  if (e.expert_groups < 1 || e.experts % e.expert_groups)
    bad("moe.expert_groups", "expected a divisor of experts" + experts);
  if (e.group_top_k < 1 || e.group_top_k > e.expert_groups)
    bad("moe.group_top_k", "expected 1..expert_groups (" + std::to_string(e.expert_groups) + ")");
  if (int64_t(e.top_k) * e.expert_groups > int64_t(e.group_top_k) * e.experts)
    bad("moe.top_k", "expected at most group_top_k x experts / expert_groups (" +
                         std::to_string(int64_t(e.group_top_k) * e.experts / e.expert_groups) +
                         "): the chosen groups must hold top_k experts");
  using limits::checked_product;
  using limits::checked_sum;
  const int64_t expert =
      checked_product(source, "expert weights",
                      {{"3", 3}, {"hidden", m.hidden}, {"expert_ffn_hidden", e.expert_ffn_hidden}});
  const int64_t layer = checked_product(
      source, "expert parameters of one layer",
      {{"experts + shared_experts", int64_t(e.experts) + e.shared_experts}, {"expert", expert}});
  checked_product(source, "expert parameters of all layers",
                  {{"layers", m.layers}, {"expert parameters of one layer", layer}});
  checked_product(source, "routed expert activations of one sample",
                  {{"seq_len", m.seq_len},
                   {"top_k + shared_experts", int64_t(e.top_k) + e.shared_experts},
                   {"expert_ffn_hidden + hidden", int64_t(e.expert_ffn_hidden) + m.hidden},
                   {"34", 34}});
}
}  // namespace

void validate(const ModelSpec& m, const std::string& source) {
  const Bad bad = [&](const std::string& field, const std::string& what) {
    throw InputError(source + ": field '" + field + "': " + what);
  };
  if (m.layers < 1) bad("layers", "expected >= 1");
  if (m.hidden < 1) bad("hidden", "expected >= 1");
  if (m.heads < 1) bad("heads", "expected >= 1");
  if (m.hidden % m.heads) bad("heads", "must divide hidden (" + std::to_string(m.hidden) + ")");
  if (m.kv_heads < 1 || m.kv_heads > m.heads || m.heads % m.kv_heads)
    bad("kv_heads", "must divide heads (" + std::to_string(m.heads) + ")");
  if (m.attention == AttentionKind::mha && m.position == Position::rope && m.head_dim() % 2)
    bad("heads", "RoPE needs an even head dim");
  if (m.ffn_hidden < 1) bad("ffn_hidden", "expected >= 1");
  if (m.vocab < 2) bad("vocab", "expected >= 2");
  if (m.seq_len < 1) bad("seq_len", "expected >= 1");
  // Every size the cost model, simulator and runtime derive from the shapes must fit int64 with
  // headroom: check the products here, once, naming the fields.
  using limits::checked_product;
  using limits::checked_sum;
  const int64_t h = m.hidden, f = m.ffn_hidden, kv = m.kv_hidden(), s = m.seq_len, V = m.vocab;
  const int64_t attn = checked_product(source, "attention weights",
                                       {{"hidden", h}, {"hidden + 2 kv_hidden", h + 2 * kv}});
  const int64_t mlp =
      checked_product(source, "MLP weights", {{"3", 3}, {"hidden", h}, {"ffn_hidden", f}});
  const int64_t layer = checked_sum(
      source, "layer parameters", checked_sum(source, "layer parameters", attn, mlp), 4 * (h + f));
  const int64_t layers = checked_product(source, "parameters of all layers",
                                         {{"layers", m.layers}, {"layer parameters", layer}});
  const int64_t emb = checked_product(
      source, "embedding parameters",
      {{"vocab + seq_len + type_vocab + 2", V + s + m.type_vocab + 2}, {"hidden", h}});
  checked_sum(source, "parameters", checked_sum(source, "parameters", layers, 2 * emb),
              2 * h * (h + 2));
  checked_product(source, "attention scores of one sample",
                  {{"seq_len", s}, {"seq_len", s}, {"heads", m.heads}});
  checked_product(source, "logits of one sample", {{"seq_len", s}, {"vocab", V}});
  checked_product(source, "activations of one sample",
                  {{"seq_len", s}, {"ffn_hidden + hidden", f + h}, {"34", 34}});
  validate_mla(m, source, bad);
  validate_moe(m, source, bad);
}

namespace {
// A name (no '/' and no ".json") is looked up under data/<folder>/; anything else is a path.
std::string resolve_spec_path(const std::string& name_or_path, const char* folder,
                              const char* flag) {
  namespace fs = std::filesystem;
  bool is_path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".json") == 0);
  if (is_path) return name_or_path;
  fs::path p = fs::path(data_dir()) / folder / (name_or_path + ".json");
  // Error-code overloads: a name the file system rejects (too long, say) is an unknown name,
  // not an exception of the file system library (found by fuzzing).
  std::error_code ec;
  if (!fs::exists(p, ec)) {
    std::string known;
    if (fs::is_directory(p.parent_path(), ec))
      for (const auto& e : fs::directory_iterator(p.parent_path(), ec))
        if (e.path().extension() == ".json") known += " " + e.path().stem().string();
    throw InputError(std::string(flag) + " '" + shorten(name_or_path) +
                     "': no such built-in (known:" + known + "), and not a path to a .json file");
  }
  return p.string();
}
}  // namespace

std::string resolve_data_file(const std::string& name_or_path, const char* folder,
                              const char* flag) {
  return resolve_spec_path(name_or_path, folder, flag);
}

}  // namespace stratagem
