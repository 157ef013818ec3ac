// ModelSpec from and to JSON, and loading a model file (see stratagem/spec_json.hpp).
#include <nlohmann/json.hpp>

#include "stratagem/json_reader.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/model.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem {
namespace {

MlaSpec mla_from_json(io::JsonReader r) {
  constexpr int kBig = limits::kMaxDim;
  MlaSpec a;
  // Every field is required: a zero taken by default would describe another attention.
  a.q_lora_rank = r.get_int("q_lora_rank", 0, kBig);
  a.kv_lora_rank = r.get_int("kv_lora_rank", 1, kBig);
  a.qk_nope_head_dim = r.get_int("qk_nope_head_dim", 1, kBig);
  a.qk_rope_head_dim = r.get_int("qk_rope_head_dim", 1, kBig);
  a.v_head_dim = r.get_int("v_head_dim", 1, kBig);
  r.get_string("source", "");
  r.reject_unknown();
  return a;
}

MoeSpec moe_from_json(io::JsonReader r, const ModelSpec& m) {
  constexpr int kBig = limits::kMaxDim;
  MoeSpec e;
  e.experts = r.get_int("experts", 1, kBig);
  e.top_k = r.get_int("top_k", 1, kBig);
  // Mixtral's experts are as wide as its dense FFN would be (intermediate_size).
  e.expert_ffn_hidden = r.get_int("expert_ffn_hidden", 1, kBig, m.ffn_hidden);
  e.shared_experts = r.get_int("shared_experts", 0, kBig, 0);
  e.dense_layers = r.get_int("dense_layers", 0, limits::kMaxLayers, 0);
  e.router_score = r.get_enum("router_score", {"softmax", "sigmoid"}, "softmax") == "softmax"
                       ? RouterScore::softmax
                       : RouterScore::sigmoid;
  e.aux_loss_coeff = r.get_double("aux_loss_coeff", 0, 1e6, 0.0);
  e.expert_groups = r.get_int("expert_groups", 1, kBig, 1);
  e.group_top_k = r.get_int("group_top_k", 1, kBig, 1);
  r.get_string("source", "");
  r.reject_unknown();
  return e;
}

}  // namespace

ModelSpec model_from_json(const nlohmann::json& j, const std::string& source) {
  io::JsonReader r(j, source);
  ModelSpec m;
  m.name = r.get_name("name");
  m.arch = r.get_enum("arch", {"decoder", "encoder"}, "decoder") == "decoder" ? Arch::decoder
                                                                              : Arch::encoder;
  constexpr int kBig = limits::kMaxDim;
  m.layers = r.get_int("layers", 1, limits::kMaxLayers);
  m.hidden = r.get_int("hidden", 1, kBig);
  m.heads = r.get_int("heads", 1, kBig);
  m.kv_heads = r.get_int("kv_heads", 1, kBig, m.heads);
  if (!r.has("ffn_hidden") && 4LL * m.hidden > kBig)
    r.fail("ffn_hidden", "a value: its default 4 x hidden is above " + std::to_string(kBig));
  m.ffn_hidden = r.get_int("ffn_hidden", 1, kBig, 4 * m.hidden);
  m.vocab = r.get_int("vocab", 2, kBig);
  m.seq_len = r.get_int("seq_len", 1, kBig);
  m.norm = r.get_enum("norm", {"layernorm", "rmsnorm"}, "layernorm") == "layernorm"
               ? Norm::layernorm
               : Norm::rmsnorm;
  m.activation = r.get_enum("activation", {"gelu", "swiglu"}, "gelu") == "gelu"
                     ? Activation::gelu
                     : Activation::swiglu;
  m.position = r.get_enum("position", {"learned", "rope"}, "learned") == "learned"
                   ? Position::learned
                   : Position::rope;
  m.tied_embeddings = r.get_bool("tied_embeddings", true);
  m.bias = r.get_bool("bias", true);
  m.dropout = r.get_bool("dropout", true);
  m.type_vocab = r.get_int("type_vocab", 0, kBig, 0);
  m.attention = r.get_enum("attention", {"mha", "mla"}, "mha") == "mha" ? AttentionKind::mha
                                                                        : AttentionKind::mla;
  if (m.attention == AttentionKind::mla) {
    if (!r.has("mla")) r.fail("mla", "a section (attention is \"mla\")");
    m.mla = mla_from_json(r.object("mla"));
  } else if (r.has("mla")) {
    r.fail("mla", "no section: attention is not \"mla\"");
  }
  if (r.has("moe")) m.moe = moe_from_json(r.object("moe"), m);
  // Documentation fields, kept so that files can cite their source.
  r.get_string("source", "");
  if (r.has("published_parameters")) r.get_double("published_parameters", 0, 1e15);
  if (r.has("published_active_parameters")) r.get_double("published_active_parameters", 0, 1e15);
  m.mtp_modules = r.get_int("mtp_modules", 0, limits::kMaxLayers, 0);
  if (r.has("rope")) {
    if (m.position != Position::rope) r.fail("rope", "no section: position is not \"rope\"");
    io::JsonReader rr = r.object("rope");
    m.rope.base = rr.get_double("base", 1, 1e12, 10000);
    m.rope.percent = rr.get_double("percent", 1e-6, 1, 1.0);
    m.rope.llama3_factor = rr.get_double("llama3_factor", 0, 1e6, 0);
    rr.reject_unknown();
  }
  m.qkv_bias = r.get_bool("qkv_bias", false);
  r.reject_unknown();
  validate(m, source);
  return m;
}

nlohmann::json to_json(const ModelSpec& m) {
  // The attention and moe sections are written only when they are not the dense default, so
  // that a dense model's JSON (checkpoints, traces, goldens) is unchanged.
  nlohmann::json j = {{"name", m.name},
                      {"arch", to_string(m.arch)},
                      {"layers", m.layers},
                      {"hidden", m.hidden},
                      {"heads", m.heads},
                      {"kv_heads", m.kv_heads},
                      {"ffn_hidden", m.ffn_hidden},
                      {"vocab", m.vocab},
                      {"seq_len", m.seq_len},
                      {"norm", to_string(m.norm)},
                      {"activation", to_string(m.activation)},
                      {"position", to_string(m.position)},
                      {"tied_embeddings", m.tied_embeddings},
                      {"bias", m.bias},
                      {"dropout", m.dropout},
                      {"type_vocab", m.type_vocab}};
  if (m.attention == AttentionKind::mla) {
    j["attention"] = to_string(m.attention);
    j["mla"] = {{"q_lora_rank", m.mla.q_lora_rank},
                {"kv_lora_rank", m.mla.kv_lora_rank},
                {"qk_nope_head_dim", m.mla.qk_nope_head_dim},
                {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                {"v_head_dim", m.mla.v_head_dim}};
  }
  if (m.mtp_modules > 0) j["mtp_modules"] = m.mtp_modules;
  // As the sections above: written only where not the default, so older files read the same.
  if (!(m.rope == RopeSpec{}))
    j["rope"] = {{"base", m.rope.base},
                 {"percent", m.rope.percent},
                 {"llama3_factor", m.rope.llama3_factor}};
  if (m.qkv_bias) j["qkv_bias"] = true;
  if (m.moe.enabled())
    j["moe"] = {{"experts", m.moe.experts},
                {"top_k", m.moe.top_k},
                {"expert_ffn_hidden", m.moe.expert_ffn_hidden},
                {"shared_experts", m.moe.shared_experts},
                {"dense_layers", m.moe.dense_layers},
                {"router_score", to_string(m.moe.router_score)},
                {"aux_loss_coeff", m.moe.aux_loss_coeff},
                {"expert_groups", m.moe.expert_groups},
                {"group_top_k", m.moe.group_top_k}};
  return j;
}

ModelSpec load_model(const std::string& name_or_path) {
  std::string path = resolve_data_file(name_or_path, "models", "--model");
  return model_from_json(io::read_json_file(path), path);
}

}  // namespace stratagem
