#include "src/cli/model_support.hpp"

#include "stratagem/error.hpp"

namespace stratagem::cli {

void require_supported_model(const ModelSpec& m, const std::string& command, ModelUse use) {
  // "stratagem estimate" -> "estimate"
  const std::string name = command.rfind("stratagem ", 0) == 0 ? command.substr(10) : command;
  // The Program, the cost model, the search (program_moe.cpp, moe_cost.cpp) and the runtime
  // (src/runtime/exec/ops_moe.cpp) run experts; the exporters do not write them yet.
  if (m.moe.enabled() && use == ModelUse::write)
    throw InputError(command + ": MoE models are not yet supported by " + name + " (issue #26)");
  // The forecast prices MLA at tp 1 (src/core/workload_mla.cpp); the runtime and the exporters
  // know only multi-head attention.
  if (m.attention == AttentionKind::mla && use != ModelUse::forecast)
    throw InputError(command + ": MLA attention (model " + m.name + ") is not yet supported by " +
                     name + " (issue #26)");
}

}  // namespace stratagem::cli
