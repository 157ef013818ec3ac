// Hugging Face config.json -> ModelSpec. Field names and defaults are those of the transformers
// configuration classes of each architecture (LlamaConfig, MistralConfig, Qwen2Config,
// GPT2Config, GPTNeoXConfig, MixtralConfig, DeepseekV3Config): a field a config leaves out takes
// that class's default.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "stratagem/error.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem::interop {
namespace {

enum class Family { llama, gpt2, neox, mixtral, deepseek };

struct Architecture {
  const char* name;
  Family family;
  bool tied_default;  // tie_word_embeddings when the config leaves it out
};

// Architectures whose shape stratagem models; Mistral and Qwen2 are Llama-shaped decoders.
constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", Family::llama, false},
    {"MistralForCausalLM", Family::llama, false},
    {"Qwen2ForCausalLM", Family::llama, false},
    {"GPT2LMHeadModel", Family::gpt2, true},
    {"GPTNeoXForCausalLM", Family::neox, false},
    {"MixtralForCausalLM", Family::mixtral, false},
    {"DeepseekV2ForCausalLM", Family::deepseek, false},
    {"DeepseekV3ForCausalLM", Family::deepseek, false},
};
// Qwen2-MoE's shared expert has a width of its own and a sigmoid gate of its own.
constexpr const char* kMoeArchitectures[] = {"Qwen2MoeForCausalLM"};

// A config's null fields mean "the class default", as if absent.
nlohmann::json without_nulls(const nlohmann::json& j) {
  nlohmann::json out = nlohmann::json::object();
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!it.value().is_null()) out[it.key()] = it.value();
  return out;
}

std::string architecture_name(const nlohmann::json& j, const std::string& source) {
  if (!j.contains("architectures"))
    throw InputError(source +
                     ": field 'architectures': missing (a Hugging Face config names its "
                     "model class there, e.g. [\"LlamaForCausalLM\"])");
  const auto& a = j.at("architectures");
  if (!a.is_array() || a.size() != 1 || !a[0].is_string())
    throw InputError(source + ": field 'architectures': expected a list of one class name");
  return a[0].get<std::string>();
}

const Architecture& find_architecture(const std::string& name, const std::string& source) {
  for (const char* moe : kMoeArchitectures)
    if (name == moe)
      throw InputError(source + ": architecture " + name +
                       ": Mixture-of-Experts is not supported yet (issue #26)");
  for (const auto& a : kArchitectures)
    if (name == a.name) return a;
  std::string known;
  for (const auto& a : kArchitectures) known += std::string(known.empty() ? "" : ", ") + a.name;
  throw InputError(source + ": field 'architectures': unknown architecture '" + shorten(name) +
                   "' (known: " + known + ")");
}

constexpr int kBig = limits::kMaxDim;

// The shape fields: GPT-2 has names of its own, the others share Llama's.
struct ShapeKeys {
  const char *layers, *hidden, *heads, *ffn, *positions;
};
constexpr ShapeKeys kLlamaKeys{"num_hidden_layers", "hidden_size", "num_attention_heads",
                               "intermediate_size", "max_position_embeddings"};
constexpr ShapeKeys kGpt2Keys{"n_layer", "n_embd", "n_head", "n_inner", "n_positions"};

void read_shape(io::JsonReader& r, ModelSpec& m, const ShapeKeys& k) {
  m.layers = r.get_int(k.layers, 1, limits::kMaxLayers);
  m.hidden = r.get_int(k.hidden, 1, kBig);
  m.heads = r.get_int(k.heads, 1, kBig);
  m.kv_heads = m.heads;
  // GPT2Config's n_inner defaults to 4 x n_embd; the others require their FFN width.
  m.ffn_hidden = &k == &kGpt2Keys
                     ? r.get_int(k.ffn, 1, kBig, int(std::min<int64_t>(4LL * m.hidden, kBig)))
                     : r.get_int(k.ffn, 1, kBig);
  m.vocab = r.get_int("vocab_size", 2, kBig);
  m.seq_len = r.get_int(k.positions, 1, kBig);
}

// RMSNorm, SiLU-gated FFNs and RoPE: Llama and the MoE decoders built on it.
void read_llama_blocks(io::JsonReader& r, ModelSpec& m) {
  if (r.get_string("hidden_act", "silu") != "silu")
    r.fail("hidden_act", "\"silu\" (the gated SiLU MLP these architectures define)");
  m.norm = Norm::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = Position::rope;
}

void read_llama(io::JsonReader& r, ModelSpec& m) {
  read_shape(r, m, kLlamaKeys);
  m.kv_heads = r.get_int("num_key_value_heads", 1, kBig, m.heads);
  read_llama_blocks(r, m);
  // Llama and Mistral: attention_bias and mlp_bias (default false). Qwen2 has a bias on the
  // query, key and value projections only, which ModelSpec cannot hold apart: it is left out
  // (28 x 4608 of Qwen2-7B's 7.6e9 parameters) and said in hf_import_notes.
  m.bias = r.get_bool("attention_bias", false) || r.get_bool("mlp_bias", false);
  m.dropout = r.get_double("attention_dropout", 0, 1, 0.0) > 0;
  if (r.has("head_dim") && r.get_int("head_dim", 1, kBig) * int64_t(m.heads) != m.hidden)
    r.fail("head_dim", "hidden_size / num_attention_heads (" +
                           std::to_string(m.hidden / std::max(1, m.heads)) +
                           "): a head width of its own is not modelled");
}

// Mixtral (MixtralConfig, modeling_mixtral.py): Mistral's attention and, in every layer, a softmax
// router over num_local_experts experts of intermediate_size each.
void read_mixtral(io::JsonReader& r, ModelSpec& m) {
  read_llama(r, m);
  m.moe.experts = r.get_int("num_local_experts", 1, kBig, 8);
  m.moe.top_k = r.get_int("num_experts_per_tok", 1, kBig, 2);
  m.moe.expert_ffn_hidden = m.ffn_hidden;
  m.moe.router_score = RouterScore::softmax;
  m.moe.aux_loss_coeff = r.get_double("router_aux_loss_coef", 0, 1e6, 0.001);
}

// DeepSeek-V2/V3 (configuration_deepseek.py, modeling_deepseek.py): MLA attention; the first
// first_k_dense_replace layers dense (intermediate_size), the others MoE with n_routed_experts of
// moe_intermediate_size, n_shared_experts beside them, group-limited routing (n_group,
// topk_group). The MLA and MoE shapes are required: a default would describe another model.
void read_deepseek(io::JsonReader& r, ModelSpec& m, const nlohmann::json& raw) {
  read_shape(r, m, kLlamaKeys);
  read_llama_blocks(r, m);
  if (r.get_int("num_key_value_heads", 1, kBig, m.heads) != m.heads)
    r.fail("num_key_value_heads", "num_attention_heads (MLA gives every head its key and value)");
  m.kv_heads = m.heads;
  if (r.get_bool("attention_bias", false))
    r.fail("attention_bias", "false (biased MLA projections are not modelled)");
  m.bias = false;
  m.dropout = r.get_double("attention_dropout", 0, 1, 0.0) > 0;
  m.attention = AttentionKind::mla;
  // q_lora_rank null is DeepSeek's "no query compression" (DeepSeek-V2-Lite), not the default.
  m.mla.q_lora_rank = raw.contains("q_lora_rank") && raw["q_lora_rank"].is_null()
                          ? 0
                          : r.get_int("q_lora_rank", 1, kBig);
  m.mla.kv_lora_rank = r.get_int("kv_lora_rank", 1, kBig);
  m.mla.qk_nope_head_dim = r.get_int("qk_nope_head_dim", 1, kBig);
  m.mla.qk_rope_head_dim = r.get_int("qk_rope_head_dim", 1, kBig);
  m.mla.v_head_dim = r.get_int("v_head_dim", 1, kBig);
  m.moe.experts = r.get_int("n_routed_experts", 1, kBig);
  m.moe.top_k = r.get_int("num_experts_per_tok", 1, kBig);
  m.moe.expert_ffn_hidden = r.get_int("moe_intermediate_size", 1, kBig);
  m.moe.shared_experts = r.get_int("n_shared_experts", 0, kBig, 0);
  m.moe.dense_layers = r.get_int("first_k_dense_replace", 0, limits::kMaxLayers, 0);
  if (r.get_int("moe_layer_freq", 1, kBig, 1) != 1)
    r.fail("moe_layer_freq", "1 (MoE layers between dense ones are not modelled)");
  m.moe.expert_groups = r.get_int("n_group", 1, kBig, 1);
  m.moe.group_top_k = r.get_int("topk_group", 1, kBig, 1);
  m.moe.router_score = r.get_enum("scoring_func", {"softmax", "sigmoid"}, "softmax") == "softmax"
                           ? RouterScore::softmax
                           : RouterScore::sigmoid;
  // DeepSeek-V3 balances its experts by a bias on the scores (topk_method noaux_tc) and keeps
  // aux_loss_alpha only for its small sequence-wise loss; absent, no auxiliary loss.
  m.moe.aux_loss_coeff = r.get_double("aux_loss_alpha", 0, 1e6, 0.0);
  m.mtp_modules = r.get_int("num_nextn_predict_layers", 0, limits::kMaxLayers, 0);
}

// GPT-2 and GPT-NeoX: LayerNorm, GELU MLP, biases; they differ in field names and defaults.
struct GeluDecoder {
  const ShapeKeys& shape;
  const char* act_key;
  const char* act_default;
  Position position;
  const char* bias_key;  // nullptr: always biased
  const char *dropout_key_a, *dropout_key_b;
  double dropout_default;
};
constexpr GeluDecoder kGpt2{kGpt2Keys, "activation_function", "gelu_new",   Position::learned,
                            nullptr,   "resid_pdrop",         "attn_pdrop", 0.1};
constexpr GeluDecoder kNeox{kLlamaKeys,       "hidden_act",        "gelu",           Position::rope,
                            "attention_bias", "attention_dropout", "hidden_dropout", 0.0};

void read_gelu_decoder(io::JsonReader& r, ModelSpec& m, const GeluDecoder& d) {
  read_shape(r, m, d.shape);
  if (r.get_string(d.act_key, d.act_default).rfind("gelu", 0) != 0)
    r.fail(d.act_key, "a GELU (gelu, gelu_new, gelu_fast)");
  m.norm = Norm::layernorm;
  m.activation = Activation::gelu;
  m.position = d.position;
  m.bias = d.bias_key ? r.get_bool(d.bias_key, true) : true;
  m.dropout = r.get_double(d.dropout_key_a, 0, 1, d.dropout_default) > 0 ||
              r.get_double(d.dropout_key_b, 0, 1, d.dropout_default) > 0;
}

// Longer than this, a config's max_position_embeddings is the context the model serves after a
// long-context extension (Qwen2/2.5's 131072, Mixtral's 32768), not a sequence length to train
// at: pretraining contexts are 2048-8192 (GPT-NeoX, Llama 2, Llama 3's 8192).
constexpr int kMaxTrainingContextDefault = 8192;

// The training sequence when the user gives no --seq-len: the context the model was pretrained
// at. A config that extends its context by RoPE scaling states it as rope_scaling's
// original_max_position_embeddings (Llama 3.1: 8192; DeepSeek-V3: 4096); otherwise
// max_position_embeddings, up to kMaxTrainingContextDefault. None where the config does not say
// (the caller then asks for --seq-len).
std::optional<int> default_training_sequence(const nlohmann::json& j, int positions,
                                             const std::string& source) {
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& rs = j["rope_scaling"];
    if (rs.contains("original_max_position_embeddings")) {
      const auto& v = rs["original_max_position_embeddings"];
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kBig)
        throw InputError(source +
                         ": field 'rope_scaling.original_max_position_embeddings': expected an "
                         "integer in [1, " +
                         std::to_string(kBig) + "]");
      return std::min(positions, int(v.get<int64_t>()));
    }
  }
  if (positions <= kMaxTrainingContextDefault) return positions;
  return std::nullopt;
}

}  // namespace

bool is_hf_config(const nlohmann::json& j) {
  return j.is_object() && (j.contains("architectures") || j.contains("model_type"));
}

namespace {

// _name_or_path is what save_pretrained was given: a Hub id ("meta-llama/Llama-3.1-8B", "gpt2")
// names the model, a local folder ("/scratch/ckpt/step-1000", "./llama", "~/m", "C:\\m",
// "ckpt/llama/8b") names the user's disk and would reach job files as the model's name. A Hub
// id is a name or owner/name; text with control characters is neither, and is checked (and
// refused) as a name.
bool is_local_path(const std::string& s) {
  if (s.empty() || std::any_of(s.begin(), s.end(), [](char ch) {
        return std::iscntrl(static_cast<unsigned char>(ch));
      }))
    return false;
  return s[0] == '/' || s[0] == '.' || s[0] == '~' || s.find('\\') != std::string::npos ||
         (s.size() > 1 && s[1] == ':') || std::count(s.begin(), s.end(), '/') > 1;
}

}  // namespace

namespace {

// RoPE's settings as transformers names them: rope_theta (GPT-NeoX: rotary_emb_base), the share
// rotated (partial_rotary_factor; GPT-NeoX: rotary_pct, default 0.25) and Llama 3.x's scaling
// (rope_scaling with rope_type, or the older type, "llama3"). Other scalings (YaRN, linear,
// dynamic) stretch the served context, not the sequence trained at: not carried.
void read_rope(io::JsonReader& r, const nlohmann::json& j, Family family, ModelSpec& m) {
  const bool neox = family == Family::neox;
  m.rope.base = r.get_double(neox ? "rotary_emb_base" : "rope_theta", 1, 1e12, 10000);
  m.rope.percent = neox ? r.get_double("rotary_pct", 1e-6, 1, 0.25)
                        : r.get_double("partial_rotary_factor", 1e-6, 1, 1.0);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& rs = j["rope_scaling"];
    const std::string type = rs.value("rope_type", rs.value("type", std::string()));
    if (type == "llama3" && rs.contains("factor") && rs["factor"].is_number() &&
        rs["factor"].get<double>() > 0)
      m.rope.llama3_factor = rs["factor"].get<double>();
  }
}

}  // namespace

ModelSpec model_from_hf_config(const nlohmann::json& raw, const std::string& source,
                               std::optional<int> seq_len) {
  if (!raw.is_object()) throw InputError(source + ": expected a JSON object");
  const nlohmann::json j = without_nulls(raw);
  const Architecture& arch = find_architecture(architecture_name(j, source), source);
  io::JsonReader r(j, source);
  ModelSpec m;
  // Named as the config names itself, else after its file (test/data/hf/llama3-8b.json).
  // The name reaches job files and the terminal: one that is not a safe name is refused.
  if (j.contains("_name_or_path") && j["_name_or_path"].is_string()) {
    if (is_local_path(j["_name_or_path"].get<std::string>()))
      r.get_string("_name_or_path");  // read, and left to the file to name the model
    else
      m.name = r.get_name("_name_or_path");
  }
  // A Hub download is <model>/config.json: the folder names the model. Made safe rather than
  // refused: the user chose the file's name, not the file's author.
  const std::filesystem::path file(source);
  if (m.name.empty())
    m.name = to_safe_name(file.stem() == "config" && file.has_parent_path()
                              ? file.parent_path().filename().string()
                              : file.stem().string());
  m.arch = Arch::decoder;
  if (arch.family == Family::llama) read_llama(r, m);
  if (arch.family == Family::gpt2) read_gelu_decoder(r, m, kGpt2);
  if (arch.family == Family::neox) read_gelu_decoder(r, m, kNeox);
  if (arch.family == Family::mixtral) read_mixtral(r, m);
  if (arch.family == Family::deepseek) read_deepseek(r, m, raw);
  m.tied_embeddings = r.get_bool("tie_word_embeddings", arch.tied_default);
  if (m.position == Position::rope) read_rope(r, j, arch.family, m);
  // Qwen2's attention has biased query, key and value projections (and no other biases).
  m.qkv_bias = std::string(arch.name) == "Qwen2ForCausalLM";
  // read_shape read the positions field (max_position_embeddings, GPT-2's n_positions).
  const int positions = m.seq_len;
  const std::optional<int> pretrained = default_training_sequence(j, positions, source);
  m.seq_len = seq_len ? *seq_len : pretrained.value_or(positions);
  // Sliding-window attention (Mistral v0.1; Qwen2 when use_sliding_window) attends to a window
  // shorter than the sequence: a cost this model does not have. Equal to full causal attention
  // while the sequence fits in the window.
  const bool window_on = (arch.family == Family::llama || arch.family == Family::mixtral) &&
                         r.has("sliding_window") &&
                         (!r.has("use_sliding_window") || r.get_bool("use_sliding_window"));
  if (window_on) {
    const int window = r.get_int("sliding_window", 1, INT32_MAX);
    if (window < m.seq_len)
      r.fail("sliding_window", "a window at least the sequence length (" +
                                   std::to_string(m.seq_len) +
                                   "): sliding-window attention is not modelled; give --seq-len " +
                                   std::to_string(window) + " or less");
  }
  // Checked after the window, whose refusal says which --seq-len the model can take.
  if (!pretrained && !seq_len)
    throw InputError(source + ": field 'max_position_embeddings': " + std::to_string(positions) +
                     " is the longest context the model serves, not the sequence it trains at "
                     "(the config states no shorter one); give --seq-len");
  validate(m, source);
  return m;
}

std::vector<std::string> hf_import_notes(const nlohmann::json& raw) {
  std::vector<std::string> notes;
  if (!raw.is_object()) return notes;  // not a config: model_from_hf_config says why
  const nlohmann::json j = without_nulls(raw);
  const auto& a = j.value("architectures", nlohmann::json::array());
  const std::string arch =
      a.is_array() && !a.empty() && a[0].is_string() ? a[0].get<std::string>() : "";
  if (arch == "Qwen2ForCausalLM")
    notes.push_back(
        "Qwen2's query/key/value biases are exported but not counted (under 0.01% of the "
        "parameters)");
  const auto flag = [&](const char* key, bool fallback) {
    return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
  };
  if (arch == "GPTNeoXForCausalLM" && flag("use_parallel_residual", true))
    notes.push_back(
        "GPT-NeoX's parallel residual (attention and MLP side by side) is costed as the "
        "sequential block: the same FLOPs, bytes and parameters");
  const double rotary = j.contains("rotary_pct") && j["rotary_pct"].is_number()
                            ? j["rotary_pct"].get<double>()
                            : 0.25;
  if (arch == "GPTNeoXForCausalLM" && rotary < 1.0)
    notes.push_back("partial rotary embedding (rotary_pct) is costed as full RoPE (elementwise)");
  if (arch == "DeepseekV2ForCausalLM" || arch == "DeepseekV3ForCausalLM") {
    const int mtp =
        j.contains("num_nextn_predict_layers") && j["num_nextn_predict_layers"].is_number_integer()
            ? j["num_nextn_predict_layers"].get<int>()
            : 0;
    if (mtp > 0)
      notes.push_back("the multi-token-prediction module(s) (num_nextn_predict_layers " +
                      std::to_string(mtp) + ") are left out of the model");
    notes.push_back(
        "the router's scaling (routed_scaling_factor, norm_topk_prob) and its bias-based "
        "balancing change no shape: they are not modelled");
  }
  return notes;
}

ModelSpec load_model_or_hf(const std::string& name_or_path, std::optional<int> seq_len) {
  const std::string path = resolve_data_file(name_or_path, "models", "--model");
  const nlohmann::json j = io::read_json_file(path);
  if (is_hf_config(j)) return model_from_hf_config(j, path, seq_len);
  return model_from_json(j, path);
}

}  // namespace stratagem::interop
