// The Program's ops of a Mixture-of-Experts layer's FFN (MoeFfn) and of its experts' weights
// and gradients (their parts of WeightFetches, GradientReductions and ResidentStates).
//
// Contract of the MoE ops (what the simulator prices and the executor runs). An MoE layer
// (ModelSpec::is_moe_layer) keeps the dense mlp block's frame: its saved activations are one
// alloc of Block::mlp (moe_kept_activation_bytes), and the tensor-parallel collectives around
// the block are the dense mlp's (tp_comm, token_stream_bytes over GroupKind::tp). Inside that
// frame, in place of the one Block::mlp compute op, each phase emits moe_ffn_steps
// (moe_recipe.hpp): the router, experts and combine parts and the collectives between them,
// each of which the next part waits for. The router part works on the rank's 1/tp slice of the
// micro-batch's tokens (its sequence shard under sp; without sp each tp rank holds the whole
// normalized stream and routes the slice it would hold, and the all-reduce after the block
// stands for sp's reduce-scatter, as Megatron-Core requires sp with tp and ep). Off its slice a
// rank's combine output is the shared experts' and the residual's only: the dense mlp's tp
// reduction after the block sums the slices.
// Every op carries its layer's etp and ep (Op::strategy), which select an expert group
// (Layout::ep_group, expert_tp_group, expert_dp_group). A compute op's flops and bytes are the
// balanced mean; the CostModel paces the experts and the all-to-alls by the plan's
// expert_load_factor(ep, experts) (the busiest expert rank).
// Gradients: the experts' (moe_expert_parameters_per_rank) are reduced over
// GroupKind::expert_dp on Stream::dp_comm, Block::experts, by grad_sync of expert_strategy
// (ZeRO over the expert data-parallel group: reduce-scatter at ZeRO >= 1, all-gather of the
// updated shard after the step at ZeRO 1-2); the rest of the layer over GroupKind::dp as a
// dense layer's, after (at tp > 1) the router weight's gradient, computed from each tp rank's
// slice, is summed over tp once final (all_reduce, Block::router, Phase::backward, tp_comm:
// moe_router_grads_reduce, beside the norms' sp_replicated_reduce). With etp x ep = 1 (only at tp
// 1: validate_moe) every rank holds the experts whole, its dp group is the expert data-parallel
// group, and they go with the rest over dp.
// At ZeRO-2/3 over an expert_dp > 1 the backward writes the experts' whole gradients into a
// staging buffer of their own (alloc, MemCategory::grads, Block::experts), which their
// reduce-scatter folds into the rank's piece; it is freed with the layer's own, after the
// next layer's mlp backward.
// Weights: at ZeRO-3 over an expert_dp > 1 (torchtitan's apply_fsdp: fully_shard of the
// experts over dp_mod_ep_mesh; DeepSpeed-MoE's expert data parallelism) the rank holds its
// piece of its experts. The dense ZeRO-3 fetch (WeightFetches::fetch) gathers them into a
// buffer (alloc, buffers, Block::experts; all_gather, dp_comm, GroupKind::expert_dp,
// Block::experts), issued at the FFN's first op so that it runs beside the router and the
// dispatch; the experts' compute waits for it. Forward frees it after the experts' forward;
// the backward pass gathers once for the recompute's and the backward's experts (Phase
// backward) and frees it after the experts' backward.
#include <utility>

#include "src/core/stage_builder.hpp"
#include "stratagem/moe_recipe.hpp"

namespace stratagem::program_detail {

int MoeFfn::ffn(Phase ph, int layer, int mb, int samples, const StageContext::BlockCost& dense) {
  if (!stage_.model.is_moe_layer(layer))
    return ops_.compute(Block::mlp, ph, layer, mb, samples, dense.flops, dense.bytes);
  return moe_ffn(ph, layer, mb, samples);
}

int MoeFfn::moe_ffn(Phase ph, int l, int mb, int b) {
  const StageContext::LayerWork& w = stage_.work(l);
  const StageContext::BlockCost* parts = ph == Phase::backward ? w.moe_backward : w.moe_forward;
  int weights_ready = -1;
  const int weights = ph == Phase::backward && experts_held_ >= 0
                          ? std::exchange(experts_held_, -1)
                          : weights_.fetch_experts(ph, l, mb, &weights_ready);
  int last = -1;
  for (const MoeStep& st : moe_ffn_steps(stage_.model, stage_.strat(l), b, ph, stage_.plan.dtype)) {
    if (!st.compute()) {  // the next compute part waits for it
      ops_.compute_waits_for(ops_.collective(st.stream, st.collective, st.group, st.purpose,
                                             st.bytes, st.block, ph, l, mb, {ops_.last_compute()}));
      continue;
    }
    const int i = st.block == Block::router ? 0 : st.block == Block::experts ? 1 : 2;
    if (st.block == Block::experts && weights_ready >= 0) ops_.compute_waits_for(weights_ready);
    last = ops_.compute(st.block, ph, l, mb, b, parts[i].flops, parts[i].bytes);
    if (st.block != Block::experts) continue;
    if (ph == Phase::recompute)
      experts_held_ = weights;  // the backward's experts compute with them too
    else
      ops_.release(weights, Stream::compute);
  }
  return last;
}

// The router saw one token slice on each tp rank: its weight's gradient is summed over the
// tp group once final (as sp_replicated_reduce sums the norms'), before the dp reduction.
int GradientReductions::moe_router_grads_reduce(int layer, int after) {
  const LayerStrategy& s = stage_.strat(layer);
  if (!stage_.model.is_moe_layer(layer) || s.tp == 1) return after;
  return ops_.collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp,
                         Purpose::replicated_grads,
                         moe_router_parameters(stage_.model) * stage_.element_bytes, Block::router,
                         Phase::backward, layer, -1, {after});
}

int WeightFetches::fetch_experts(Phase ph, int layer, int mb, int* wait_out) {
  if (stage_.expert_params(layer) == 0) return -1;
  // The backward's buffer whether the recompute or the backward uses it first.
  const Phase pass = ph == Phase::forward ? Phase::forward : Phase::backward;
  return fetch(expert_strategy(stage_.strat(layer)), stage_.expert_params(layer), layer, pass, mb,
               ops_.last_compute(), wait_out, /*experts=*/true);
}

void GradientReductions::stage_expert_grads(int layer, int mb) {
  if (stage_.expert_params(layer) == 0) return;
  if (staged_gradient_bytes(expert_strategy(stage_.strat(layer)), 1, stage_.plan.dtype,
                            stage_.framework.layer_gradient_staging) == 0)
    return;
  int& buf = expert_stage_buf_[stage_.local_of[layer]];
  if (buf < 0)
    buf = ops_.alloc(Stream::compute, MemCategory::grads,
                     stage_.expert_params(layer) * stage_.element_bytes, layer, mb, Phase::backward,
                     Block::experts);
}

std::pair<int, int> GradientReductions::reduce_expert_grads(int layer, int mb, int after) {
  if (!stage_.model.is_moe_layer(layer)) return {-1, -1};
  const LayerStrategy& s = stage_.strat(layer);

  // etp x ep = 1 (tp 1, validate_moe): every rank holds the experts whole and its dp group
  // is the expert data-parallel group; they go with the rest of the layer.
  if (s.ep * s.etp == 1) return {-1, -1};
  const LayerStrategy es = expert_strategy(s);
  const GradSync g = grad_sync(es);
  if (g.reduce == Collective::none) return {-1, -1};
  if (!g.per_microbatch && mb != stage_.last_backward_mb[ops_.chunk()]) return {-1, -1};
  const Op op =
      ops_.collective_op(Stream::dp_comm, g.reduce, GroupKind::expert_dp, Purpose::grad_reduce,
                         stage_.expert_params(layer) * stage_.element_bytes, Block::experts,
                         Phase::backward, layer, mb);
  if (stage_.plan.overlap_grad_reduce || g.per_microbatch) {
    flush_staging_free();
    const int rs = emit_reduction(op, {after});
    grad_reductions_.push_back(rs);
    // The staged gradients go on the dp stream once the reduction has landed.
    return {std::exchange(expert_stage_buf_[stage_.local_of[layer]], -1), rs};
  }
  deferred_.push_back(op);
  return {-1, -1};
}

// ZeRO-1/2 over the expert data-parallel group: each rank updated its shard of the experts.
void ResidentStates::gather_expert_weights(int layer, int opt, int updated) {
  if (stage_.expert_params(layer) == 0) return;
  const LayerStrategy& s = stage_.strat(layer);
  if (!grad_sync(expert_strategy(s)).gather_after_step) return;
  ops_.compute_waits_for(
      ops_.collective(Stream::dp_comm, Collective::all_gather, GroupKind::expert_dp,
                      Purpose::updated_weights, stage_.expert_params(layer) * stage_.element_bytes,
                      Block::optimizer, Phase::optimizer, layer, -1, {opt, updated}));
}

}  // namespace stratagem::program_detail
