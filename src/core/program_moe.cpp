// The Program's ops of a Mixture-of-Experts layer's FFN and of its experts' gradients.
//
// Contract of the MoE ops (what the simulator prices and the executor runs). An MoE layer
// (ModelSpec::is_moe_layer) keeps the dense mlp block's frame: its saved activations are one
// alloc of Block::mlp (moe_kept_activation_bytes), and the tensor-parallel collectives around
// the block are the dense mlp's (tp_comm, token_stream_bytes over GroupKind::tp). Inside that
// frame, in place of the one Block::mlp compute op, forward and recompute emit:
//   1. compute  Block::router   norm, router logits (R x experts x hidden), scores and top-k,
//                               the permutation of the rank's R routed tokens into C = R x top_k
//                               copies grouped by expert, and the shared experts (a dense FFN
//                               of shared_experts x expert_ffn_hidden / tp over the stream).
//                               R is the rank's 1/tp slice of the micro-batch's tokens, slice
//                               index = the rank's tp index (its sequence shard under sp).
//   1b. collective all_reduce, Block::router, Stream::tp_comm, GroupKind::tp: only at tp > 1
//                               with the load-balancing loss: its per-expert sums (copies and
//                               probabilities, moe_aux_sums_bytes) over the tp ranks' slices,
//                               so that the loss and its gradient cover the micro-batch's
//                               tokens (Megatron-Core's aux loss over its tp-cp group).
//   2. collective all_to_all, Block::router, Stream::ep_comm, GroupKind::ep: the dispatch;
//                               bytes = C x hidden x dtype, what the rank sends in all (at the
//                               balanced mean; the real counts vary: MPI_Alltoallv). Absent at
//                               ep 1.
//   3. collective all_gather, Block::experts, Stream::ep_comm, GroupKind::expert_tp: only at
//                               etp > 1; bytes = etp x C x hidden x dtype (the output).
//   4. compute  Block::experts  the rank's experts / ep experts as grouped GEMMs (fc1, the
//                               activation, fc2), each expert_ffn_hidden / etp wide.
//   5. collective reduce_scatter, Block::experts, ep_comm, expert_tp: only at etp > 1; bytes as 3
//                               (the input).
//   6. collective all_to_all, Block::combine, ep_comm, GroupKind::ep: the combine, bytes as 2.
//   7. compute  Block::combine  un-permutation, each token's top_k outputs summed weighted by
//                               its scores, the residual. Off the token slice the rank's output
//                               is the shared experts' and the residual's only: under tp > 1
//                               the dense mlp's tp reduction after the block sums the slices.
// Megatron-Core's dispatcher takes each tp rank's sequence shard under sequence parallelism,
// which it requires with tp and ep; without sp our tp ranks hold the whole normalized stream and
// route the slice they would hold under sp, and the all-reduce after the block stands for sp's
// reduce-scatter. Backward runs the same seven in reverse order of dependency: combine's backward
// (7), the all-to-all of Block::combine (6), at etp > 1 the all-gather (5's backward) and the
// reduce-scatter (3's backward) around the experts' backward (4), the all-to-all of
// Block::router (2), the router's backward (1, with the top_k copies' gradients summed).
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
// piece of its experts. The dense ZeRO-3 fetch (StageBuilder::fetch) gathers them into a
// buffer (alloc, buffers, Block::experts; all_gather, dp_comm, GroupKind::expert_dp,
// Block::experts), issued at the FFN's first op so that it runs beside the router and the
// dispatch; the experts' compute waits for it. Forward frees it after the experts' forward;
// the backward pass gathers once for the recompute's and the backward's experts (Phase
// backward) and frees it after the experts' backward.
#include <utility>

#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

int StageBuilder::ffn(Phase ph, int layer, int mb, int samples, const BlockCost& dense) {
  if (!m_.is_moe_layer(layer))
    return compute(Block::mlp, ph, layer, mb, samples, dense.flops, dense.bytes);
  return moe_ffn(ph, layer, mb, samples);
}

int StageBuilder::moe_ffn(Phase ph, int l, int mb, int b) {
  const LayerStrategy& s = strat(l);
  const LayerWork& w = work(l);
  const BlockCost* parts = ph == Phase::backward ? w.moe_backward : w.moe_forward;
  const int64_t a2a = moe_dispatch_bytes(m_, s, b, p_.dtype);
  const int64_t gathered = moe_expert_tp_bytes(m_, s, b, p_.dtype);
  // A collective of the expert path on its own stream; the next compute op waits for it.
  auto exchange = [&](Collective c, GroupKind g, int64_t bytes, Block blk) {
    const Purpose why = g == GroupKind::ep ? Purpose::token_exchange : Purpose::expert_rows;
    const int op = collective(Stream::ep_comm, c, g, why, bytes, blk, ph, l, mb, {last_compute_});
    compute_waits_.push_back(op);
  };
  auto part = [&](Block blk, int i) {
    return compute(blk, ph, l, mb, b, parts[i].flops, parts[i].bytes);
  };
  const bool bwd = ph == Phase::backward;
  int weights_ready = -1;
  const int weights = bwd && experts_held_ >= 0 ? std::exchange(experts_held_, -1)
                                                : fetch_experts(ph, l, mb, &weights_ready);
  // Forward: router, dispatch, experts, combine. Backward: the same path walked back.
  part(bwd ? Block::combine : Block::router, bwd ? 2 : 0);
  if (const int64_t sums = moe_aux_sums_bytes(m_, s); sums > 0 && !bwd)
    compute_waits_.push_back(collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp,
                                        Purpose::router_stats, sums, Block::router, ph, l, mb,
                                        {last_compute_}));
  if (s.ep > 1)
    exchange(Collective::all_to_all, GroupKind::ep, a2a, bwd ? Block::combine : Block::router);
  if (s.etp > 1) exchange(Collective::all_gather, GroupKind::expert_tp, gathered, Block::experts);
  if (weights_ready >= 0) compute_waits_.push_back(weights_ready);
  part(Block::experts, 1);
  if (ph == Phase::recompute)
    experts_held_ = weights;
  else
    release(weights, Stream::compute);
  if (s.etp > 1)
    exchange(Collective::reduce_scatter, GroupKind::expert_tp, gathered, Block::experts);
  if (s.ep > 1)
    exchange(Collective::all_to_all, GroupKind::ep, a2a, bwd ? Block::router : Block::combine);
  return part(bwd ? Block::router : Block::combine, bwd ? 0 : 2);
}

// The router saw one token slice on each tp rank: its weight's gradient is summed over the
// tp group once final (as sp_replicated_reduce sums the norms'), before the dp reduction.
int StageBuilder::moe_router_grads_reduce(int layer, int after) {
  const LayerStrategy& s = strat(layer);
  if (!m_.is_moe_layer(layer) || s.tp == 1) return after;
  return collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp,
                    Purpose::replicated_grads, moe_router_parameters(m_) * e_, Block::router,
                    Phase::backward, layer, -1, {after});
}

int StageBuilder::fetch_experts(Phase ph, int layer, int mb, int* wait_out) {
  if (expert_params(layer) == 0) return -1;
  // The backward's buffer whether the recompute or the backward uses it first.
  const Phase pass = ph == Phase::forward ? Phase::forward : Phase::backward;
  return fetch(expert_strategy(strat(layer)), expert_params(layer), layer, pass, mb, last_compute_,
               wait_out, /*experts=*/true);
}

void StageBuilder::stage_expert_grads(int layer, int mb) {
  if (expert_params(layer) == 0) return;
  if (staged_gradient_bytes(expert_strategy(strat(layer)), 1, p_.dtype, staging_) == 0) return;
  int& buf = expert_stage_buf_[local_of_[layer]];
  if (buf < 0)
    buf = alloc(Stream::compute, MemCategory::grads, expert_params(layer) * e_, layer, mb,
                Phase::backward, Block::experts);
}

std::pair<int, int> StageBuilder::reduce_expert_grads(int layer, int mb, int after) {
  if (!m_.is_moe_layer(layer)) return {-1, -1};
  const LayerStrategy& s = strat(layer);

  // etp x ep = 1 (tp 1, validate_moe): every rank holds the experts whole and its dp group
  // is the expert data-parallel group; they go with the rest of the layer.
  if (s.ep * s.etp == 1) return {-1, -1};
  const LayerStrategy es = expert_strategy(s);
  const GradSync g = grad_sync(es);
  if (g.reduce == Collective::none) return {-1, -1};
  if (!g.per_microbatch && mb != last_bwd_mb_[chunk_]) return {-1, -1};
  const Op op =
      collective_op(Stream::dp_comm, g.reduce, GroupKind::expert_dp, Purpose::grad_reduce,
                    expert_params(layer) * e_, Block::experts, Phase::backward, layer, mb);
  if (p_.overlap_grad_reduce || g.per_microbatch) {
    flush_staging_free();
    const int rs = emit_reduction(op, {after});
    grad_reductions_.push_back(rs);
    // The staged gradients go on the dp stream once the reduction has landed.
    return {std::exchange(expert_stage_buf_[local_of_[layer]], -1), rs};
  }
  deferred_.push_back(op);
  return {-1, -1};
}

// ZeRO-1/2 over the expert data-parallel group: each rank updated its shard of the experts.
void StageBuilder::gather_expert_weights(int layer, int opt, int updated) {
  if (expert_params(layer) == 0) return;
  const LayerStrategy& s = strat(layer);
  if (!grad_sync(expert_strategy(s)).gather_after_step) return;
  compute_waits_.push_back(collective(
      Stream::dp_comm, Collective::all_gather, GroupKind::expert_dp, Purpose::updated_weights,
      expert_params(layer) * e_, Block::optimizer, Phase::optimizer, layer, -1, {opt, updated}));
}

}  // namespace stratagem::program_detail
