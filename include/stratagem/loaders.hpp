// The specs read from files, by built-in name or path: io's part (src/io/*_json.cpp), so that
// the specs themselves (model.hpp, cluster.hpp, framework.hpp, plan.hpp, all core) read no file.
// The JSON forms are in stratagem/spec_json.hpp. Every loader throws InputError naming the file
// and the field on any problem.
#pragma once
#include <string>

#include "stratagem/cluster.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"

namespace stratagem {

// A built-in model by name (data/models/<name>.json) or a JSON file path
// (src/io/model_json.cpp).
ModelSpec load_model(const std::string& name_or_path);

// A built-in cluster by name (data/clusters/<name>.json) or a JSON file path
// (src/io/cluster_json.cpp).
ClusterSpec load_cluster(const std::string& name_or_path);

// A built-in framework by name (data/frameworks/<name>.json) or a JSON file path
// (src/io/framework_json.cpp).
FrameworkSpec load_framework(const std::string& name_or_path);

// A plan file for model `m` (src/io/plan_json.cpp).
Plan load_plan(const std::string& path, const ModelSpec& m);

}  // namespace stratagem
