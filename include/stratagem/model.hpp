// ModelSpec: the shapes of a Transformer, loaded from data/models/<name>.json or a path.
#pragma once
#include <cstdint>
#include <string>

namespace stratagem {

enum class Arch { decoder, encoder };  // GPT/LLaMA are decoders, BERT is an encoder
enum class Norm { layernorm, rmsnorm };
enum class Activation { gelu, swiglu };
enum class Position { learned, rope };

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

  int head_dim() const { return hidden / heads; }
  int kv_hidden() const { return kv_heads * head_dim(); }

  // Parameter counts computed from the shapes.
  int64_t layer_parameters() const;      // one Transformer layer
  int64_t embedding_parameters() const;  // token (+ position, + type) embeddings
  int64_t head_parameters() const;       // final norm + untied LM head (+ BERT pooler-free head)
  int64_t parameters() const;
  // Model FLOPs (forward + backward, no recompute) per token at the full sequence length.
  double flops_per_token() const;
};

// Loads a built-in model by name (data/models/<name>.json) or a JSON file path.
// Throws InputError naming the file and the field on any problem. Reading files is io's part
// (src/io/model_json.cpp); the JSON form is in stratagem/spec_json.hpp.
ModelSpec load_model(const std::string& name_or_path);
// Checks internal consistency (divisibility etc.); `source` names where it came from.
void validate(const ModelSpec& m, const std::string& source);

// Where data/ lives: $STRATAGEM_DATA, else the source tree's data/ baked in at build time.
std::string data_dir();
// Path of a built-in (data/<folder>/<name>.json) or the given path; `flag` names it in errors.
std::string resolve_data_file(const std::string& name_or_path, const char* folder,
                              const char* flag);

const char* to_string(Arch a);
const char* to_string(Norm n);
const char* to_string(Activation a);
const char* to_string(Position p);

}  // namespace stratagem
