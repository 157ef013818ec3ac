// An MoE layer's FFN as the Program emits it (src/core/program_moe.cpp states the contract):
// compute Block::router (norm, router, top-k, permutation), at tp > 1 the tp sum of the
// load-balancing loss's sums, at ep > 1 the dispatch all-to-all over the ep group, at etp > 1
// the all-gather over expert_tp, compute Block::experts (the held experts' GEMMs over their
// rows, each expert a 1/etp shard), at etp > 1 the reduce-scatter, at ep > 1 the combine
// all-to-all, compute Block::combine (the weighted sum, the shared experts, the residual
// flow); backward walks the same ops back. The pieces are moe_block.hpp's and
// moe_dispatch.hpp's; the saved tensors live in the layer's mlp activation buffer (the
// Program's one alloc for the block), transients in scratch. The load-balancing loss joins the
// step's loss with the weight of one micro-batch, as the cross-entropy's tokens do.
//
// Tensor parallelism: each tp rank routes its 1/tp slice of the micro-batch's tokens (rows
// [tp_index x N/tp, ...) of the normalized stream), the shared experts run tp-sharded on the
// whole stream, and the block's output (and input gradient) is a partial sum that the dense
// mlp's tp reduction completes: off its slice a rank's routed output is zero. Megatron-Core
// refuses MoE with tp > 1 in training without sequence parallelism (MoELayer.forward in
// megatron/core/transformer/moe/moe_layer.py), its router then seeing each tp rank's
// sequence shard; here, without it, every tp rank holds the whole normalized stream and routes
// the slice it would hold under sequence parallelism, and the all-reduce after the block does
// what the reduce-scatter does there (with --sequence-parallel the runtime runs Megatron's
// layout). The router's weight saw one slice on each rank: the Program sums its gradient over
// tp (Block::router, backward). The load-balancing loss's per-expert sums are summed over tp
// in forward: Megatron-Core's switch_load_balancing_loss_func (moe_utils.py) all-reduces
// tokens_per_expert over its sequence_partition_group, the tp-cp group (router.py); we add
// the probability sums too, so that every tp rank holds the micro-batch's loss itself.
#include "src/runtime/exec/ops_moe.hpp"

#include <algorithm>

#include "src/runtime/exec/ops_comm.hpp"
#include "src/runtime/exec/ops_compute.hpp"
#include "src/runtime/exec/rank_context.hpp"

namespace stratagem::exec {

namespace {
// The aux loss's weight in the step's loss: the mean over the global batch's micro-batches.
double aux_weight(const Program& program, const LayerShare& sh) {
  return 1.0 / (double(program.num_microbatches) * sh.dp);
}
// Rows an op hands to the next: from the top of the MoE scratch (scratch_arena.hpp); the
// pieces' own transients (MoeActs::temp) come from the bottom.
Tensor handed_on(Buffers& buffers, Shape shape) {
  return buffers.moe_scratch.take(shape, ArenaEnd::high);
}
// This tp rank's slice of the micro-batch's tokens, of a (B,T,C) stream tensor.
Tensor token_slice(const Tensor& full, const LayerShare& sh) {
  const int64_t C = full.dim(-1), N = full.numel() / C, R = N / sh.tp;
  return full.view(Shape{N, C}).rows(sh.tp_index * R, (sh.tp_index + 1) * R);
}
}  // namespace

void MoeOps::compute(const Op& op) {
  Micro& m = rank_.mb(op.microbatch);
  LayerState& ls = m.layers[op.layer];
  const bool bwd = op.phase == Phase::backward;
  switch (op.block) {
    case Block::router:
      bwd ? router_back(op, m, ls) : router(op, m, ls);
      return;
    case Block::experts:
      bwd ? experts_back(op, ls) : experts(op, ls);
      return;
    default:
      bwd ? combine_back(op, m, ls) : combine(op, m, ls);
      return;
  }
}

void MoeOps::add_aux_loss(const LayerShare& sh, const MoeActs& a) {
  rank_.current_step.loss_sum +=
      a.aux_loss * aux_weight(rank_.program, sh) * double(rank_.plan.global_batch) * rank_.T;
}

void MoeOps::router(const Op& op, Micro& m, LayerState& ls) {
  const int l = op.layer;
  const LayerShare& sh = rank_.share(l);
  const OpStrategy& st = op.strategy;
  // The norm, into the mlp block's activation buffer (under sp the tp all-gather ran it).
  if (!sh.sequence_parallel) compute_.block_input(op, m, ls);
  const bool rec = op.phase == Phase::recompute;
  const int acts =
      op.recompute == Recompute::full && !rec
          ? -1
          : rank_.buffers.of(Block::mlp, rec ? Phase::recompute : Phase::forward, l, op.microbatch);
  MoeState& s = ls.moe;
  s = MoeState{};
  // A fully recomputed layer's forward keeps nothing: what it would save is transient, handed
  // on within the forward.
  s.acts.saved = [this, acts](Shape shape) {
    return acts < 0 ? handed_on(rank_.buffers, shape) : rank_.buffers.pool.take(acts, shape);
  };
  s.acts.scratch = [this](Shape shape) { return rank_.buffers.moe_scratch.take(shape); };
  const Shape full_s = rank_.full_shape(l);
  s.xn = sh.sequence_parallel ? m.gathered.view(full_s) : ls.mlp.norm_out.view(full_s);
  m.gathered = Tensor{};
  const Tensor xn = token_slice(s.xn, sh);
  const LayerWeights& w = rank_.shards.model.weights.layer(l);
  moe_router_forward(rank_.backend, sh.local, w, xn, s.acts);
  const int64_t rows = xn.dim(0) * rank_.whole.moe.top_k;
  // With no collective on the way the permuted rows are the experts' saved input.
  s.rows = st.ep * st.etp > 1 ? handed_on(rank_.buffers, Shape{rows, rank_.whole.hidden})
                              : s.acts.save(rank_.backend, Shape{rows, rank_.whole.hidden});
  s.counts = s.acts.routing.counts;
  moe_permute_forward(rank_.backend, xn, s.acts.routing, s.rows);
  // Its loss counts once per micro-batch: in forward, not again in a recompute; under tp > 1
  // once the tp ranks' sums are added (aux_sum).
  if (!rec && sh.tp == 1) add_aux_loss(sh, s.acts);
}

void MoeOps::aux_sum(const Op& op) {
  const LayerShare& sh = rank_.share(op.layer);
  MoeState& s = rank_.mb(op.microbatch).layers.at(op.layer).moe;
  rank_.group_of(op).all_reduce_sum(s.acts.aux_sums.data(), int64_t(s.acts.aux_sums.size()));
  s.acts.aux_tokens *= sh.tp;
  moe_aux_loss_of(sh.local, s.acts);
  // Every tp rank now holds the micro-batch's loss: the first adds it (as the head's).
  if (op.phase == Phase::forward && sh.tp_index == 0) add_aux_loss(sh, s.acts);
}

void MoeOps::ep_collective(const Op& op, int index) {
  (void)index;  // blocking: done when the op returns (the counts decide the rows' sizes)
  LayerState& ls = rank_.mb(op.microbatch).layers.at(op.layer);
  MoeState& s = ls.moe;
  Communicator& ep = rank_.group_of(op);
  const bool bwd = op.phase == Phase::backward;
  // Toward the experts: forward's dispatch (Block::router), backward's of the combine's
  // gradients (Block::combine). Back home: the other two.
  const bool toward = (op.block == Block::router) != bwd;
  const int64_t C = rank_.whole.hidden;
  if (toward) {
    if (!bwd) {
      s.exchange = plan_exchange(ep, s.acts.routing.counts);
      const int64_t mean = s.acts.routing.tokens() * rank_.whole.moe.top_k;
      if (mean > 0)
        rank_.moe_busiest_load =
            std::max(rank_.moe_busiest_load, double(s.exchange.received()) / mean);
    }
    const ExpertExchange& x = s.exchange;
    Tensor received = s.acts.temp(rank_.backend, Shape{x.received(), C});
    exchange_rows(ep, x, s.rows, received, false);
    s.rows = Tensor{};  // sent: its scratch goes before the regrouped rows come
    // Forward saves the experts' input (at etp > 1 the all-gather's output is that).
    const bool saved = !bwd && op.strategy.etp == 1;
    s.rows = saved ? s.acts.save(rank_.backend, Shape{x.received(), C})
                   : handed_on(rank_.buffers, Shape{x.received(), C});
    rank_.backend.gather_rows(s.rows, received, x.regroup);
    s.counts = x.local_counts;
  } else {
    const ExpertExchange& x = s.exchange;
    // From expert order back into (source, expert) order, then home.
    Tensor ordered = s.acts.temp(rank_.backend, s.rows.shape);
    rank_.backend.gather_rows(ordered, s.rows, x.ungroup);
    s.rows = Tensor{};
    const int64_t home = s.acts.routing.tokens() * rank_.whole.moe.top_k;
    Tensor back =
        bwd ? handed_on(rank_.buffers, Shape{home, C}) : s.acts.save(rank_.backend, Shape{home, C});
    exchange_rows(ep, x, ordered, back, true);
    s.rows = back;
  }
}

void MoeOps::etp_collective(const Op& op) {
  MoeState& s = rank_.mb(op.microbatch).layers.at(op.layer).moe;
  Communicator& etp = rank_.group_of(op);
  const bool bwd = op.phase == Phase::backward;
  const int64_t C = rank_.whole.hidden;
  if (op.collective == Collective::all_gather) {  // before the experts (forward and backward)
    if (!bwd) s.gather = plan_expert_gather(etp, s.counts);
    const ExpertGather& g = s.gather;
    // Backward: the members' rows above the rows they come from, the gathered below them, so
    // that both leave the top free for the experts' input gradient.
    Tensor members = bwd ? handed_on(rank_.buffers, Shape{g.gathered(), C})
                         : s.acts.temp(rank_.backend, Shape{g.gathered(), C});
    Tensor gathered =
        bwd ? s.acts.temp(rank_.backend, Shape{g.gathered(), C})
            : s.acts.save(rank_.backend, Shape{g.gathered(), C});  // the experts' input
    gather_expert_rows(rank_.backend, etp, g, s.rows, gathered, members);
    s.rows = gathered;
    s.counts = g.counts;
    return;
  }
  // After the experts: this member's rows of the partial sums, summed over the members.
  const ExpertGather& g = s.gather;
  const int64_t mine = g.member_rows.at(size_t(etp.rank()));
  Tensor members = s.acts.temp(rank_.backend, Shape{g.gathered(), C});
  // Forward at ep 1: the combine's saved input.
  const bool saved = !bwd && op.strategy.ep == 1;
  Tensor out =
      saved ? s.acts.save(rank_.backend, Shape{mine, C}) : handed_on(rank_.buffers, Shape{mine, C});
  reduce_expert_rows(rank_.backend, etp, g, s.rows, out, members);
  s.rows = out;
}

void MoeOps::experts(const Op& op, LayerState& ls) {
  const LayerShare& sh = rank_.share(op.layer);
  const OpStrategy& st = op.strategy;
  MoeState& s = ls.moe;
  const LayerWeights& w = rank_.shards.model.weights.layer(op.layer);
  s.acts.expert_in = s.rows;
  // The combine's backward reads its input: these outputs when no collective moves them.
  const bool moves = st.ep * st.etp > 1;
  s.acts.expert_out =
      moves ? handed_on(rank_.buffers, s.rows.shape) : s.acts.save(rank_.backend, s.rows.shape);
  moe_experts_forward(rank_.backend, sh.local, w, s.acts.expert_in, s.counts, s.acts,
                      s.acts.expert_out);
  s.rows = s.acts.expert_out;
  if (moves) s.acts.expert_out = Tensor{};
  // A fully recomputed layer's forward needs none of what the experts saved again.
  if (op.phase == Phase::forward && op.recompute == Recompute::full)
    s.acts.expert_in = s.acts.fc1_out = s.acts.act_out = Tensor{};
}

void MoeOps::combine(const Op& op, Micro& m, LayerState& ls) {
  const LayerShare& sh = rank_.share(op.layer);
  MoeState& s = ls.moe;
  s.acts.combined_in = s.rows;
  s.rows = Tensor{};
  const Shape full_s = rank_.full_shape(op.layer);
  Tensor y = rank_.buffers.pool.scratch(full_s);
  if (sh.tp > 1) rank_.backend.fill(y, 0.0f);  // the routed output is this rank's slice's only
  Tensor y_slice = token_slice(y, sh);
  moe_combine_forward(rank_.backend, s.acts.combined_in, s.acts, y_slice);
  moe_shared_forward(rank_.backend, sh.local, rank_.shards.model.weights.layer(op.layer), s.xn,
                     s.acts, y);
  s.xn = Tensor{};  // backward takes it again (under sp, gathered again)
  const bool rec = op.phase == Phase::recompute;
  if (!rec && op.recompute == Recompute::full) {  // forward keeps only the layer input
    ls.mlp = MlpActs{};
    ls.moe = MoeState{};
  }
  Flow& flow = rec ? m.rec : m.fwd;
  if (sh.tp == 1) {
    flow = Flow{ls.x_mid, y, -1};
    compute_.drop_unsaved_block_input(op, ls);
  } else {
    m.partial = y;  // the tp reduction that follows completes the flow
  }
}

void MoeOps::combine_back(const Op& op, Micro& m, LayerState& ls) {
  const int l = op.layer;
  const LayerShare& sh = rank_.share(l);
  compute_.stage_gradients(l);
  if (rank_.shards.sharding.segments.count(expert_segment(l)))
    compute_.stage_gradients(expert_segment(l));
  comm_.fit_grad(m, l);
  MoeState& s = ls.moe;
  s.acts.scratch = [this](Shape shape) { return rank_.buffers.moe_scratch.take(shape); };
  const Shape full_s = rank_.full_shape(l);
  s.dy = sh.sequence_parallel ? m.gathered_dy.view(full_s) : m.grad.view(full_s);
  s.xn = sh.sequence_parallel ? m.gathered.view(full_s) : ls.mlp.norm_out.view(full_s);
  m.gathered = m.gathered_dy = Tensor{};
  s.d_weights = handed_on(rank_.buffers, s.acts.weights.shape);
  s.rows = handed_on(rank_.buffers, s.acts.combined_in.shape);
  moe_combine_backward(rank_.backend, token_slice(s.dy, sh), s.acts, s.rows, s.d_weights);
  s.acts.combined_in = Tensor{};
}

void MoeOps::experts_back(const Op& op, LayerState& ls) {
  const LayerShare& sh = rank_.share(op.layer);
  MoeState& s = ls.moe;
  const LayerWeights& w = rank_.shards.model.weights.layer(op.layer);
  LayerWeights& g = rank_.shards.model.grad_weights.layer(op.layer);
  // At etp > 1 a partial sum over the fc1 shards, which the reduce-scatter completes.
  Tensor d_in = handed_on(rank_.buffers, s.acts.expert_in.shape);
  moe_experts_backward(rank_.backend, sh.local, w, g, s.rows, s.acts.expert_in, s.counts, s.acts,
                       d_in);
  s.acts.expert_in = s.acts.expert_out = s.acts.fc1_out = s.acts.act_out = Tensor{};
  s.rows = d_in;
}

void MoeOps::router_back(const Op& op, Micro& m, LayerState& ls) {
  const int l = op.layer;
  const LayerShare& sh = rank_.share(l);
  MoeState& s = ls.moe;
  const LayerWeights& w = rank_.shards.model.weights.layer(l);
  LayerWeights& g = rank_.shards.model.grad_weights.layer(l);
  Tensor d_xn = rank_.buffers.pool.scratch(rank_.full_shape(l));
  if (sh.tp > 1) rank_.backend.fill(d_xn, 0.0f);  // the routed path's gradient is the slice's only
  Tensor d_slice = token_slice(d_xn, sh);
  moe_permute_backward(rank_.backend, s.rows, s.acts.routing, d_slice);
  moe_router_backward(rank_.backend, sh.local, w, g, s.d_weights, token_slice(s.xn, sh), s.acts,
                      aux_weight(rank_.program, sh), d_slice);
  moe_shared_backward(rank_.backend, sh.local, w, g, s.dy, s.xn, s.acts, d_xn);
  ls.moe = MoeState{};
  if (sh.tp == 1)
    compute_.finish_block_backward(l, Block::mlp, m, d_xn);
  else
    m.partial = d_xn;  // the tp reduction that follows completes it
}

}  // namespace stratagem::exec
