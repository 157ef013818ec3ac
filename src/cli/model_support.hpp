// What the commands cannot do yet with a model, said in one place: a model they would price,
// run or write as another one (an MoE model as dense) is refused here with exit 2, and the work
// that adds the feature removes its line.
#pragma once
#include <string>

#include "stratagem/model.hpp"

namespace stratagem::cli {

enum class ModelUse {
  forecast,  // estimate, simulate, search, plan check, program: the Program and the cost model
  train,     // the runtime's kernels
  write,     // export: another framework's configuration
};

// Throws InputError "<command>: MoE models are not yet supported by <command> (issue #26)" and
// the like; `command` is Args::command().
void require_supported_model(const ModelSpec& m, const std::string& command, ModelUse use);

}  // namespace stratagem::cli
