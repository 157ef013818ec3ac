// The ops of one MoE FFN for one micro-batch in one phase, in order: the one statement of what
// the Program emits for it (src/core/program_moe.cpp wires the steps into the schedule) and what
// the estimator prices (src/cost/moe_layer_cost.cpp). The rules behind the sizes are
// workload_moe.hpp's.
#pragma once
#include <cstdint>
#include <vector>

#include "stratagem/program.hpp"
#include "stratagem/workload_moe.hpp"

namespace stratagem {

// A compute part of the FFN (collective none: Block::router, experts or combine, whose work is
// moe_forward_work's / moe_backward_work's part), or a collective that the next compute part
// waits for.
struct MoeStep {
  Block block = Block::none;
  Collective collective = Collective::none;
  GroupKind group = GroupKind::none;
  Stream stream = Stream::compute;
  Purpose purpose = Purpose::none;
  int64_t bytes = 0;
  bool compute() const { return collective == Collective::none; }
};

// Forward and recompute, after Megatron-Core's alltoall token dispatcher:
//   router (norm, router, top-k, permutation, shared experts)
//   [tp > 1 with the load-balancing loss: its sums all-reduced over tp, tp_comm]
//   [ep > 1: the dispatch all-to-all over ep, ep_comm]
//   [etp > 1: the all-gather of the rows over expert_tp, ep_comm]
//   experts (grouped GEMMs)
//   [etp > 1: the reduce-scatter back over expert_tp]
//   [ep > 1: the combine all-to-all]
//   combine (un-permutation, the weighted sum, the residual)
// Backward walks the path back: combine, its all-to-all, the etp all-gather (the
// reduce-scatter's backward), experts, the reduce-scatter, the dispatch's all-to-all, router.
std::vector<MoeStep> moe_ffn_steps(const ModelSpec& m, const LayerStrategy& s, int samples,
                                   Phase ph, Dtype dt);

}  // namespace stratagem
