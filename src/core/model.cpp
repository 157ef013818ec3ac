#include "stratagem/model.hpp"

#include <cstdlib>
#include <filesystem>

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

std::string data_dir() {
  if (const char* env = std::getenv("STRATAGEM_DATA")) return env;
  return STRATAGEM_DATA_DIR;
}

namespace {
int64_t norm_parameters(const ModelSpec& m) {
  return m.norm == Norm::layernorm && m.bias ? 2LL * m.hidden : m.hidden;
}
}  // namespace

int64_t ModelSpec::layer_parameters() const {
  const int64_t h = hidden, f = ffn_hidden, kv = kv_hidden();
  int64_t attn = h * (h + 2 * kv) + h * h;
  int64_t mlp = (activation == Activation::swiglu ? 3 : 2) * h * f;
  if (bias) attn += (h + 2 * kv) + h, mlp += (activation == Activation::swiglu ? 2 * f : f) + h;
  return attn + mlp + 2 * norm_parameters(*this);
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

int64_t ModelSpec::parameters() const {
  return int64_t(layers) * layer_parameters() + embedding_parameters() + head_parameters();
}

double ModelSpec::flops_per_token() const {
  return model_flops_per_iteration(*this, 1) / seq_len;
}

void validate(const ModelSpec& m, const std::string& source) {
  auto bad = [&](const std::string& field, const std::string& what) {
    throw InputError(source + ": field '" + field + "': " + what);
  };
  if (m.layers < 1) bad("layers", "expected >= 1");
  if (m.hidden < 1) bad("hidden", "expected >= 1");
  if (m.heads < 1) bad("heads", "expected >= 1");
  if (m.hidden % m.heads) bad("heads", "must divide hidden (" + std::to_string(m.hidden) + ")");
  if (m.kv_heads < 1 || m.kv_heads > m.heads || m.heads % m.kv_heads)
    bad("kv_heads", "must divide heads (" + std::to_string(m.heads) + ")");
  if (m.position == Position::rope && m.head_dim() % 2) bad("heads", "RoPE needs an even head dim");
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
