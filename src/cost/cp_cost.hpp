// Context parallelism in the closed-form estimator and the search's tables: the kernels of a
// cp layer's split attention and the cp communication its compute waits for, per micro-batch,
// from the same rules (iteration.hpp's cp_comm, workload.hpp's attention_part_work) and prices
// (CostModel) the Program and the simulator use.
#pragma once
#include "stratagem/cost.hpp"

namespace stratagem::cost_detail {

// Kernels of a cp layer's attention block in phase ph (forward, backward with its gradient
// passes, or recompute): its parts, the ring's cp core steps each a kernel of its own.
double cp_attention_kernels_s(const CostModel& cost, const LayerStrategy& s, int samples, Phase ph,
                              bool flash_attention);

// The cp communication of one attention block that its compute waits for, per phase:
//  - ring: each of the cp - 1 K/V transfers runs beside a core step, exposed by what it
//    exceeds it; backward carries a K/V block and a dK/dV block beside each core step (no core
//    step waits for an accumulator), and the last dK/dV hop home is exposed whole;
//  - allgather: the all-gather before the core (backward: beside post's backward) and the
//    reduce-scatter of dK, dV after it;
//  - a2a: both all-to-alls.
// `cp_nodes`: nodes the cp group spans (a ring step crosses the network when it is above 1).
struct CpCost {
  double fwd_s = 0, bwd_s = 0;  // recompute costs fwd_s again
};
CpCost cp_cost(const CostModel& cost, const LayerStrategy& s, int samples, int cp_nodes,
               bool flash_attention);

}  // namespace stratagem::cost_detail
