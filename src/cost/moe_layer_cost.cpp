// An MoE layer's share of the estimator's and the search's closed form (layer_cost.hpp): the
// FFN's ops as the Program emits them (moe_recipe.hpp's steps, workload_moe.hpp's sizes),
// priced by the same CostModel.
#include <algorithm>

#include "src/cost/layer_cost.hpp"
#include "stratagem/moe_recipe.hpp"
#include "stratagem/workload_moe.hpp"

namespace stratagem::cost_detail {
MoeNodes moe_nodes(const Geometry& geo, int stage, const LayerStrategy& s, bool moe) {
  MoeNodes n;
  n.moe = moe;
  if (!moe) return n;
  n.ep = geo.ep_nodes(stage, s.etp, s.ep);
  n.expert_dp = geo.expert_dp_nodes(stage, s.etp, s.ep);
  n.expert_tp = geo.expert_tp_nodes(stage, s.etp);
  return n;
}

void add_moe_costs(const CostModel& c, const Plan& p, const LayerStrategy& s, int b, int tp_nodes,
                   int dp_nodes, const MoeNodes& nodes, bool with_time, LayerCost& lc) {
  const ModelSpec& m = c.model();
  const bool flash = p.flash_attention;
  const Dtype dt = p.dtype;
  const double load = p.expert_load_factor(s.ep, m.moe.experts);  // the busiest expert rank
  // Parameters: reduced over dp (the attention, the FFN's dense part, and the experts when
  // every rank holds them whole), and the experts' over the expert data-parallel group.
  const bool sharded = s.ep * s.etp > 1;
  const int64_t experts = moe_expert_parameters_per_rank(m, s);
  const int64_t dense = block_parameters_per_rank(m, s.tp, Block::attention) +
                        moe_dense_parameters_per_rank(m, s) + (sharded ? 0 : experts);
  const int64_t expert_params = sharded ? experts : 0;
  lc.states = ModelStates{};
  const int g = c.framework().grad_buffer_bytes;
  lc.states.add(s, dense, dt, g);
  if (expert_params > 0) lc.states.add(expert_strategy(s), expert_params, dt, g);
  // Activations: the attention block's as before, the MoE FFN's in place of the mlp's.
  const int64_t sa = kept_activation_bytes(m, s, Block::attention, b, s.recompute, flash, dt);
  const int64_t sm = moe_kept_activation_bytes(m, s, b, s.recompute, dt, load);
  const FetchCost fetch = fetch_cost(c, s, dense, dp_nodes, with_time);
  // The experts over the expert data-parallel group (program_moe.cpp): their ZeRO-3 gather,
  // their ZeRO-2/3 staged gradients and the piece their reduce-scatter receives.
  const LayerStrategy es = expert_strategy(s);
  const FetchCost expert_fetch = fetch_cost(c, es, expert_params, nodes.expert_dp, with_time);
  const bool staging = c.framework().layer_gradient_staging;
  lc.expert_fetch_bytes = expert_fetch.bytes;
  if (grad_sync(es).per_microbatch || p.overlap_grad_reduce)
    lc.expert_piece_bytes = receive_piece_bytes(es, expert_params, dt);
  lc.kept = s.offload_activations ? 0 : sa + sm;
  lc.staged_bytes = staged_gradient_bytes(s, dense, dt, staging) +
                    staged_gradient_bytes(es, expert_params, dt, staging);
  lc.piece_bytes = receive_piece_bytes(s, dense, dt);
  lc.workspace = moe_layer_workspace_bytes(m, s, b, dt, load);
  lc.pipelined_workspace = moe_layer_workspace_bytes(m, s, b, dt, load, /*pipelined=*/true);
  lc.fwd_act = sa + sm;
  lc.fwd_buf = fetch.bytes;
  lc.bwd_buf = fetch.bytes;
  int64_t during_mlp = sa + sm;
  if (s.recompute == Recompute::full)
    during_mlp += recomputed_activation_bytes(m, s, Block::attention, b, flash, dt) +
                  moe_kept_activation_bytes(m, s, b, Recompute::none, dt, load);
  lc.bwd_mlp_act = during_mlp;
  if (!with_time) return;

  // Kernels: the mlp block's out, the three MoE parts in.
  double fwd = 0, bwd = 0;
  for (Block part : {Block::router, Block::experts, Block::combine}) {
    fwd += c.moe_part_time_s(s, part, Phase::forward, b, load);
    bwd += c.moe_part_time_s(s, part, Phase::backward, b, load);
  }
  lc.fwd_s += fwd - c.block_time_s(forward_work(m, s, Block::mlp, b, flash));
  lc.bwd_s += bwd - c.backward_block_time_s(s, Block::mlp, b, flash);
  if (s.recompute == Recompute::full) lc.rec_s = lc.fwd_s;
  // The FFN's collectives as the Program emits them (moe_recipe.hpp), forward's, priced: the
  // expert path's (ep_comm: the dispatch and combine all-to-alls, then the expert-tensor
  // gather and reduce-scatter; backward moves the same) and, under tp > 1 with the
  // load-balancing loss, its sums over tp (forward and recompute only). The router
  // gradient's once-per-iteration sum is left to the simulator, as the norms' under sequence
  // parallelism are.
  double exchanges = 0, expert_rows = 0, aux_sums = 0;
  for (const MoeStep& st : moe_ffn_steps(m, s, b, Phase::forward, dt)) {
    if (st.compute()) continue;
    if (st.stream == Stream::tp_comm) {
      aux_sums += c.fabric().collective_cost(st.collective, st.bytes, s.tp, tp_nodes).time_s();
      continue;
    }
    const bool ep = st.group == GroupKind::ep;
    (ep ? exchanges : expert_rows) +=
        c.moe_comm_cost(st.collective, st.bytes, ep ? s.ep : s.etp, ep ? nodes.ep : nodes.expert_tp,
                        load, p.moe_node_limit)
            .time_s();
  }
  const double per_pass = exchanges + expert_rows;
  lc.ep_fwd_s = lc.ep_bwd_s = per_pass;
  lc.ep_rec_s = s.recompute == Recompute::full ? per_pass : 0;
  lc.tp_fwd_s += aux_sums;
  if (s.recompute == Recompute::full) lc.tp_rec_s += aux_sums;
  // Gradient synchronisation: the dense part over dp, the experts over expert_dp.
  lc.fetch_s = fetch.time_s + expert_fetch.time_s;
  lc.fetch_on_h2d = fetch.on_h2d;
  lc.grad_rs_mb_s = lc.grad_reduce_s = lc.gather_s = 0;
  auto add_sync = [&](const GradSyncCost& x) {
    (x.per_microbatch ? lc.grad_rs_mb_s : lc.grad_reduce_s) += x.reduce_s;
    lc.gather_s += x.gather_s;
  };
  add_sync(grad_sync_cost(c, s, dense, dp_nodes));
  if (expert_params > 0)
    add_sync(grad_sync_cost(c, expert_strategy(s), expert_params, nodes.expert_dp));
  if (s.offload_activations) {
    lc.act_d2h_s = c.fabric().copy_cost(sa + sm).time_s();
    lc.act_h2d_s = lc.act_d2h_s;
  }
}

}  // namespace stratagem::cost_detail
