// The MoE FFN's ops of one micro-batch (moe_recipe.hpp).
#include "stratagem/moe_recipe.hpp"

namespace stratagem {

std::vector<MoeStep> moe_ffn_steps(const ModelSpec& m, const LayerStrategy& s, int samples,
                                   Phase ph, Dtype dt) {
  const bool bwd = ph == Phase::backward;
  const int64_t a2a = moe_dispatch_bytes(m, s, samples, dt);
  const int64_t rows = moe_expert_tp_bytes(m, s, samples, dt);
  std::vector<MoeStep> steps;
  auto part = [&](Block b) { steps.push_back(MoeStep{b}); };
  // The expert path's collectives run on their own stream.
  auto exchange = [&](Collective c, GroupKind g, int64_t bytes, Block b) {
    const Purpose why = g == GroupKind::ep ? Purpose::token_exchange : Purpose::expert_rows;
    steps.push_back(MoeStep{b, c, g, Stream::ep_comm, why, bytes});
  };
  part(bwd ? Block::combine : Block::router);
  // Each tp rank routed its slice of the tokens: the aux loss's sums cover the micro-batch.
  if (const int64_t sums = moe_aux_sums_bytes(m, s); sums > 0 && !bwd)
    steps.push_back(MoeStep{Block::router, Collective::all_reduce, GroupKind::tp, Stream::tp_comm,
                            Purpose::router_stats, sums});
  if (s.ep > 1)
    exchange(Collective::all_to_all, GroupKind::ep, a2a, bwd ? Block::combine : Block::router);
  if (s.etp > 1) exchange(Collective::all_gather, GroupKind::expert_tp, rows, Block::experts);
  part(Block::experts);
  if (s.etp > 1) exchange(Collective::reduce_scatter, GroupKind::expert_tp, rows, Block::experts);
  if (s.ep > 1)
    exchange(Collective::all_to_all, GroupKind::ep, a2a, bwd ? Block::router : Block::combine);
  part(bwd ? Block::router : Block::combine);
  return steps;
}

}  // namespace stratagem
