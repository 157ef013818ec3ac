#include "src/cli/model_support.hpp"

#include "stratagem/error.hpp"

namespace stratagem::cli {

void require_supported_model(const ModelSpec& m, const std::string& command, ModelUse use) {
  // "stratagem estimate" -> "estimate"
  const std::string name = command.rfind("stratagem ", 0) == 0 ? command.substr(10) : command;
  // The Program, the cost model, the simulator and the runtime run experts (issue #26); the
  // search's ep choice and the exporters do not yet: pricing or writing the model as dense
  // would be silently wrong.
  if (m.moe.enabled() && (use == ModelUse::write || name == "search"))
    throw InputError(command + ": MoE models are not yet supported by " + name + " (issue #26)");
  // The forecast prices MLA at tp 1 (src/core/workload_mla.cpp); the runtime and the exporters
  // know only multi-head attention.
  if (m.attention == AttentionKind::mla && use != ModelUse::forecast)
    throw InputError(command + ": MLA attention (model " + m.name + ") is not yet supported by " +
                     name + " (issue #26)");
}

}  // namespace stratagem::cli
