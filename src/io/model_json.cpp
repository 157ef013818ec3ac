// ModelSpec from and to JSON, and loading a model file (see stratagem/spec_json.hpp).
#include <nlohmann/json.hpp>

#include "src/io/json_reader.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/model.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem {

ModelSpec model_from_json(const nlohmann::json& j, const std::string& source) {
  io::JsonReader r(j, source);
  ModelSpec m;
  m.name = r.get_string("name");
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
  // Documentation fields, kept so that files can cite their source.
  r.get_string("source", "");
  if (r.has("published_parameters")) r.get_double("published_parameters", 0, 1e15);
  r.reject_unknown();
  validate(m, source);
  return m;
}

nlohmann::json to_json(const ModelSpec& m) {
  return {{"name", m.name},
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
}

ModelSpec load_model(const std::string& name_or_path) {
  std::string path = resolve_data_file(name_or_path, "models", "--model");
  return model_from_json(io::read_json_file(path), path);
}

}  // namespace stratagem
