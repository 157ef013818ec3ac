// ModelSpec: the shapes of a Transformer, loaded from data/models/<name>.json or a path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace stratagem {

enum class Arch { decoder, encoder };  // GPT/LLaMA are decoders, BERT is an encoder
enum class Norm { layernorm, rmsnorm };
enum class Activation { gelu, swiglu };
enum class Position { learned, rope };
// mha covers multi-head, grouped-query and multi-query attention (kv_heads); mla is
// DeepSeek-V2/V3's Multi-head Latent Attention (compressed query and KV, decoupled RoPE).
enum class AttentionKind { mha, mla };
enum class RouterScore { softmax, sigmoid };

// Multi-head Latent Attention's shapes (DeepSeek-V3's config.json names in comments).
struct MlaSpec {
  int q_lora_rank = 0;       // q_lora_rank: the compressed query's width (0 = no compression)
  int kv_lora_rank = 0;      // kv_lora_rank: the compressed KV's width
  int qk_nope_head_dim = 0;  // qk_nope_head_dim: per-head query/key width without RoPE
  int qk_rope_head_dim = 0;  // qk_rope_head_dim: the decoupled RoPE width (key shared by heads)
  int v_head_dim = 0;        // v_head_dim: per-head value width
  bool operator==(const MlaSpec&) const = default;
};

// Mixture-of-Experts: which layers route their tokens to experts, and how.
struct MoeSpec {
  int experts = 0;            // routed experts per MoE layer (0: a dense model)
  int top_k = 0;              // experts chosen per token
  int expert_ffn_hidden = 0;  // each expert's FFN width (per gate/up projection under SwiGLU)
  int shared_experts = 0;     // experts every token passes through, of expert_ffn_hidden each
  int dense_layers = 0;       // the first layers keep a dense FFN of ffn_hidden (DeepSeek-V3: 3)
  RouterScore router_score = RouterScore::softmax;
  double aux_loss_coeff = 0.0;  // the load-balancing loss's weight (0: none)
  // Group-limited routing (DeepSeek-V3's n_group / topk_group, its "node-limited routing"): the
  // experts form expert_groups equal groups and a token's top_k come from its best group_top_k
  // groups. 1 and 1: no limit.
  int expert_groups = 1;
  int group_top_k = 1;
  bool enabled() const { return experts > 0; }
  bool operator==(const MoeSpec&) const = default;
};

// Rotary position embedding's settings (position == rope): what a framework must be told to
// build the same model. No cost depends on them (RoPE is elementwise whatever its base).
struct RopeSpec {
  double base = 10000;       // rope_theta (GPT-NeoX: rotary_emb_base); Megatron's --rotary-base
  double percent = 1.0;      // share of each head's width rotated (GPT-NeoX rotary_pct)
  double llama3_factor = 0;  // Llama 3.x's rope_scaling (rope_type llama3) factor; 0: none
  bool operator==(const RopeSpec&) const = default;
};

struct ModelSpec {
  std::string name;
  Arch arch = Arch::decoder;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;    // == heads for multi-head attention, < heads for GQA
  int ffn_hidden = 0;  // for SwiGLU this is the width of each of the gate and up projections
  int vocab = 0;
  int seq_len = 0;
  Norm norm = Norm::layernorm;
  Activation activation = Activation::gelu;
  Position position = Position::learned;
  bool tied_embeddings = true;
  bool bias = true;     // linear and norm biases (GPT/BERT yes, LLaMA no)
  bool dropout = true;  // dropout masks are saved for backward (Megatron's activation formula)
  int type_vocab = 0;   // BERT token-type embeddings (0 = none)
  AttentionKind attention = AttentionKind::mha;
  MlaSpec mla;    // when attention == mla
  MoeSpec moe;    // when moe.enabled()
  RopeSpec rope;  // when position == rope
  // Biases on the query, key and value projections only (Qwen2), where bias is false: carried
  // to the exports; not counted or costed (28 x 4608 of Qwen2-7B's 7.6e9 parameters).
  bool qkv_bias = false;
  // Multi-token-prediction modules of the published model (DeepSeek-V3's num_nextn_predict_layers:
  // 1). Not modelled: no count, cost or runtime includes them, and model show says so.
  int mtp_modules = 0;

  // Whether Transformer layer `layer` (0-based) has routed experts in place of a dense FFN.
  bool is_moe_layer(int layer) const { return moe.enabled() && layer >= moe.dense_layers; }

  int head_dim() const { return hidden / heads; }
  int kv_hidden() const { return kv_heads * head_dim(); }

  // Parameter counts computed from the shapes.
  // Layer parameters depend on the layer under MoE: a dense layer (and every layer of a dense
  // model) has one FFN of ffn_hidden; an MoE layer has the router, every routed expert and the
  // shared experts. layer_parameters() is a dense layer's (what every layer of a dense model
  // holds).
  int64_t layer_parameters() const;           // a dense Transformer layer
  int64_t layer_parameters(int layer) const;  // Transformer layer `layer` (0-based), all experts
  int64_t attention_parameters() const;       // the attention block with its norm
  int64_t dense_ffn_parameters() const;       // the FFN block of a dense layer with its norm
  int64_t expert_parameters() const;          // one expert's FFN (routed or shared)
  int64_t router_parameters() const;          // the router's gate (experts x hidden)
  int64_t moe_ffn_parameters() const;         // an MoE layer's FFN block: all experts, router, norm
  int64_t embedding_parameters() const;       // token (+ position, + type) embeddings
  int64_t head_parameters() const;  // final norm + untied LM head (+ BERT pooler-free head)
  int64_t parameters() const;       // every parameter (every expert of every MoE layer)
  // Parameters one token passes through: parameters() less the routed experts it is not sent
  // to (experts - top_k per MoE layer). Equal to parameters() for a dense model.
  int64_t active_parameters() const;
  // Elements of the key/value cache one token leaves in every layer together: 2 kv_hidden per
  // layer under multi-head attention; under MLA the compressed KV and the shared RoPE key,
  // kv_lora_rank + qk_rope_head_dim (DeepSeek-V3: 70,272 bytes in bf16, as its authors state).
  int64_t kv_cache_elements_per_token() const;
  // Model FLOPs (forward + backward, no recompute) per token at the full sequence length, from
  // the active parameters (top_k routed and the shared experts of each MoE layer).
  double flops_per_token() const;
};

// Loading a model from a file is io's part: stratagem/loaders.hpp.

// Checks internal consistency (divisibility etc.); `source` names where it came from.
void validate(const ModelSpec& m, const std::string& source);

// Where data/ lives: $STRATAGEM_DATA, else the source tree's data/ baked in at build time.
std::string data_dir();
// Path of a built-in (data/<folder>/<name>.json) or the given path; `flag` names it in errors.
std::string resolve_data_file(const std::string& name_or_path, const char* folder,
                              const char* flag);

// Names read from input files (a model's, a cluster's, a framework's) are written into job
// files (export), TOML and onto the terminal, so a name is at most kMaxNameBytes of letters,
// digits, spaces and ._-+/:@()[]~ : no newline or control character can start a line of its
// own there, and no escape code reaches the terminal. Readers refuse any other (exit 2 naming
// the file and field); kSafeNameChars says which in their messages.
inline constexpr size_t kMaxNameBytes = 200;
inline constexpr const char* kSafeNameChars = "letters, digits, spaces and ._-+/:@()[]~";
bool is_safe_name(const std::string& name);
// `text` made a safe name (each other byte becomes '_', cut to kMaxNameBytes): for a name
// derived from a file's name rather than read from a field.
std::string to_safe_name(const std::string& text);

const char* to_string(Arch a);
const char* to_string(Norm n);
const char* to_string(Activation a);
const char* to_string(Position p);
const char* to_string(AttentionKind a);
const char* to_string(RouterScore r);

}  // namespace stratagem
