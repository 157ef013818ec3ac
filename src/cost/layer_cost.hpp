// The parts of a layer's cost (include/stratagem/layer_cost.hpp) that only the estimator and
// layer_cost.cpp compose: a strategy's gradient synchronisation, its weight fetch, and what an
// MoE layer's FFN changes. The search reaches layers through the public header alone.
#pragma once
#include <cstdint>

#include "stratagem/cost.hpp"
#include "stratagem/layer_cost.hpp"

namespace stratagem::cost_detail {

// The GradSyncCost of `params` parameters of strategy `s` over a dp group spanning dp_nodes
// nodes.
GradSyncCost grad_sync_cost(const CostModel& cost, const LayerStrategy& s, int64_t params,
                            int dp_nodes);

// The FetchCost of `params` parameters of strategy `s` (dp_nodes: nodes its dp group spans);
// without `with_time` only the bytes.
FetchCost fetch_cost(const CostModel& cost, const LayerStrategy& s, int64_t params, int dp_nodes,
                     bool with_time);

// What an MoE layer's FFN changes in its LayerCost (moe_layer_cost.cpp): the FFN's kernels,
// states, activations and workspace in place of the dense mlp's, the ep_comm collectives, and
// the experts' gradient synchronisation over the expert data-parallel group, and under tp > 1
// the tp sum of the load-balancing loss's sums.
void add_moe_costs(const CostModel& cost, const Plan& plan, const LayerStrategy& s, int samples,
                   int tp_nodes, int dp_nodes, const MoeNodes& nodes, bool with_time,
                   LayerCost& lc);

}  // namespace stratagem::cost_detail
