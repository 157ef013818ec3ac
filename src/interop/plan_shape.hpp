// What the exporters ask of a plan: which per-layer fields vary and where, and the stage split
// in the terms each framework uses.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "stratagem/plan.hpp"

namespace stratagem::interop::detail {

using LayerKey = std::function<std::string(const LayerStrategy&)>;

// "layers 0-47 tp8 dp4, layers 48-95 tp4 dp8": consecutive layers grouped by `key`.
std::string runs(const Plan& p, const LayerKey& key);
// Every layer gives the same key.
bool uniform_by(const Plan& p, const LayerKey& key);
// The strategy most layers use (the first of the most common, in layer order).
const LayerStrategy& most_common(const Plan& p);
// Samples a data-parallel rank processes per iteration (micro-batches x micro-batch).
int local_batch(const Plan& p);

// Megatron's recompute: every layer the same (none, selective, full) or the block method (the
// first `block_layers` layers of every chunk full, the rest none).
struct RecomputeShape {
  Recompute mode = Recompute::none;
  int block_layers = 0;  // > 0: the block method
};
std::optional<RecomputeShape> recompute_shape(const Plan& p);

// Megatron's stage split without virtual stages: first and last stage free, the others equal.
// nullopt where the plan's split is not of that form; {0, 0} where it is the even split.
struct FirstLast {
  int first = 0, last = 0;
};
std::optional<FirstLast> first_last_split(const Plan& p);
bool chunks_equal(const Plan& p);  // every chunk holds as many layers

}  // namespace stratagem::interop::detail
