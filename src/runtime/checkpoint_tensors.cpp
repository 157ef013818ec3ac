// The logical tensors of a model's checkpoint: its parameters and both Adam moments, in their
// full shapes (apart from the executor, so that the checkpoint loader's fuzz target can name
// them without a runtime).
#include "stratagem/trainer.hpp"

namespace stratagem {

std::vector<CheckpointTensor> checkpoint_tensors(const ModelSpec& spec) {
  const ParamTable whole = make_param_table(transformer_config(spec));
  std::vector<CheckpointTensor> out;
  for (const char* group : {"params", "optimizer/m", "optimizer/v"})
    for (const ParamInfo& e : whole.entries()) {
      CheckpointTensor t;
      t.dataset = std::string(group) + "/" + e.name;
      for (int i = 0; i < e.logical.ndim(); ++i) t.shape.push_back(e.logical[i]);
      out.push_back(t);
    }
  return out;
}

}  // namespace stratagem
