// The specs in JSON: parsing (strict: every field typed and range-checked, unknown fields are
// errors, messages name the source and the field) and writing. Implemented in src/io/, so that
// the specs themselves (model.hpp, cluster.hpp, framework.hpp, plan.hpp) depend on no JSON
// library. Loading a spec from a file by name or path: stratagem/loaders.hpp.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "stratagem/cluster.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"

namespace stratagem {

ModelSpec model_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json to_json(const ModelSpec& m);

ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json to_json(const ClusterSpec& c);

FrameworkSpec framework_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json to_json(const FrameworkSpec& f);

Plan plan_from_json(const nlohmann::json& j, const ModelSpec& m, const std::string& source);
nlohmann::json to_json(const Plan& p);

}  // namespace stratagem
