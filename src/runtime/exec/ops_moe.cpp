// An MoE layer's FFN as the Program emits it (src/core/program_moe.cpp states the contract):
// compute Block::router (norm, router, top-k, permutation), at ep > 1 the dispatch all-to-all
// over the ep group, compute Block::experts (the held experts' GEMMs over their rows), at
// ep > 1 the combine all-to-all, compute Block::combine (the weighted sum, the shared experts,
// the residual flow); backward walks the same ops back. The pieces are moe_block.hpp's and
// moe_dispatch.hpp's; the saved tensors live in the layer's mlp activation buffer (the
// Program's one alloc for the block), transients in scratch. The load-balancing loss joins the
// step's loss with the weight of one micro-batch, as the cross-entropy's tokens do.
// Runs tp = etp = 1 (check_runnable refuses the rest): every rank routes its own tokens.
#include <algorithm>

#include "src/runtime/exec/impl.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

namespace {
// The aux loss's weight in the step's loss: the mean over the global batch's micro-batches.
double aux_weight(const Program& program, const exec::LayerShare& sh) {
  return 1.0 / (double(program.num_microbatches) * sh.dp);
}
bool spread(const LayerWeights& w, const TransformerConfig& c) {
  return int(w.expert_fc1_w.size()) != c.moe.experts;
}
}  // namespace

int Executor::Impl::segment_key(const Op& op) const {
  return op.group == GroupKind::expert_dp ? exec::expert_segment(op.layer) : op.layer;
}

void Executor::Impl::moe_compute(const Op& op) {
  exec::Micro& m = mb(op.microbatch);
  exec::LayerState& ls = m.layers[op.layer];
  const bool bwd = op.phase == Phase::backward;
  switch (op.block) {
    case Block::router:
      bwd ? moe_router_back(op, m, ls) : moe_router(op, m, ls);
      return;
    case Block::experts:
      bwd ? moe_experts_back(op, ls) : moe_experts(op, ls);
      return;
    default:
      bwd ? moe_combine_back(op, m, ls) : moe_combine(op, m, ls);
      return;
  }
}

void Executor::Impl::moe_router(const Op& op, exec::Micro& m, exec::LayerState& ls) {
  const exec::LayerShare& sh = share(op.layer);
  if (sh.tp != 1)
    throw NotSupported("layer " + std::to_string(op.layer) +
                       ": MoE layers under tp > 1 are not run by the runtime yet (issue #26)");
  block_input(op, m, ls);  // the norm, into the mlp block's activation buffer
  const bool rec = op.phase == Phase::recompute;
  const int acts = op.recompute == Recompute::full && !rec
                       ? -1
                       : buffers.of(Block::mlp, rec ? Phase::recompute : Phase::forward, op.layer,
                                    op.microbatch);
  exec::MoeState& s = ls.moe;
  s = exec::MoeState{};
  s.acts.saved = [this, acts](Shape shape) { return buffers.pool.take(acts, shape); };
  s.acts.scratch = [this](Shape shape) { return buffers.pool.scratch(shape); };
  const Tensor xn = ls.mlp.norm_out.view(full_shape(op.layer));
  const LayerWeights& w = shards.model.weights.layer(op.layer);
  moe_router_forward(backend, sh.local, w, xn, s.acts);
  const int64_t rows = sh.N * whole.moe.top_k;
  // At ep 1 the permuted rows are the experts' saved input; else they leave in the dispatch.
  s.rows = spread(w, sh.local) ? s.acts.temp(backend, Shape{rows, whole.hidden})
                               : s.acts.save(backend, Shape{rows, whole.hidden});
  moe_permute_forward(backend, xn, s.acts.routing, s.rows);
  if (!rec)  // its loss counts once per micro-batch: in forward, not again in a recompute
    current_step.loss_sum +=
        s.acts.aux_loss * aux_weight(program, sh) * double(plan.global_batch) * T;
}

void Executor::Impl::ep_collective(const Op& op, int index) {
  (void)index;  // blocking: done when the op returns (the counts decide the rows' sizes)
  exec::LayerState& ls = mb(op.microbatch).layers.at(op.layer);
  exec::MoeState& s = ls.moe;
  Communicator& ep = group_of(op);
  const bool bwd = op.phase == Phase::backward;
  // Toward the experts: forward's dispatch (Block::router), backward's of the combine's
  // gradients (Block::combine). Back home: the other two.
  const bool toward = (op.block == Block::router) != bwd;
  const int64_t C = whole.hidden;
  if (toward) {
    if (!bwd) {
      s.exchange = plan_exchange(ep, s.acts.routing.counts);
      const int64_t mean = s.acts.routing.tokens() * whole.moe.top_k;
      if (mean > 0)
        moe_busiest_load = std::max(moe_busiest_load, double(s.exchange.received()) / mean);
    }
    const ExpertExchange& x = s.exchange;
    Tensor received = s.acts.temp(backend, Shape{x.received(), C});
    exchange_rows(ep, x, s.rows, received, false);
    // Forward saves the experts' input; backward hands the output gradients on.
    s.rows = bwd ? s.acts.temp(backend, Shape{x.received(), C})
                 : s.acts.save(backend, Shape{x.received(), C});
    backend.gather_rows(s.rows, received, x.regroup);
  } else {
    const ExpertExchange& x = s.exchange;
    const int64_t home = s.acts.routing.tokens() * whole.moe.top_k;
    Tensor back = bwd ? s.acts.temp(backend, Shape{home, C}) : s.acts.save(backend, Shape{home, C});
    exchange_rows(ep, x, s.rows, back, true);
    s.rows = back;
  }
}

void Executor::Impl::moe_experts(const Op& op, exec::LayerState& ls) {
  const exec::LayerShare& sh = share(op.layer);
  exec::MoeState& s = ls.moe;
  const LayerWeights& w = shards.model.weights.layer(op.layer);
  const bool apart = spread(w, sh.local);
  const std::vector<int64_t>& counts = apart ? s.exchange.local_counts : s.acts.routing.counts;
  s.acts.expert_in = s.rows;
  // The combine's backward reads its input: at ep 1 these rows, else the rows come home.
  s.acts.expert_out =
      apart ? s.acts.temp(backend, s.rows.shape) : s.acts.save(backend, s.rows.shape);
  moe_experts_forward(backend, sh.local, w, s.acts.expert_in, counts, s.acts, s.acts.expert_out);
  if (apart) {  // back into (source, expert) order for the combine's all-to-all
    s.rows = s.acts.temp(backend, s.rows.shape);
    backend.gather_rows(s.rows, s.acts.expert_out, s.exchange.ungroup);
    s.acts.expert_out = Tensor{};
  } else {
    s.rows = s.acts.expert_out;
  }
}

void Executor::Impl::moe_combine(const Op& op, exec::Micro& m, exec::LayerState& ls) {
  const exec::LayerShare& sh = share(op.layer);
  exec::MoeState& s = ls.moe;
  s.acts.combined_in = s.rows;
  s.rows = Tensor{};
  const Shape full_s = full_shape(op.layer);
  Tensor y = buffers.pool.scratch(full_s);
  const Tensor xn = ls.mlp.norm_out.view(full_s);
  moe_combine_forward(backend, s.acts.combined_in, s.acts, y);
  moe_shared_forward(backend, sh.local, shards.model.weights.layer(op.layer), xn, s.acts, y);
  const bool rec = op.phase == Phase::recompute;
  if (!rec && op.recompute == Recompute::full) {  // forward keeps only the layer input
    ls.mlp = MlpActs{};
    ls.moe = exec::MoeState{};
  }
  exec::Flow& flow = rec ? m.rec : m.fwd;
  flow = exec::Flow{ls.x_mid, y, -1};
  drop_unsaved_block_input(op, ls);
}

void Executor::Impl::moe_combine_back(const Op& op, exec::Micro& m, exec::LayerState& ls) {
  const int l = op.layer;
  stage_gradients(l);
  if (shards.sharding.segments.count(exec::expert_segment(l)))
    stage_gradients(exec::expert_segment(l));
  fit_grad(m, l);
  exec::MoeState& s = ls.moe;
  s.acts.scratch = [this](Shape shape) { return buffers.pool.scratch(shape); };
  s.dy = m.grad.view(full_shape(l));
  s.d_weights = s.acts.temp(backend, s.acts.weights.shape);
  s.rows = s.acts.temp(backend, s.acts.combined_in.shape);
  moe_combine_backward(backend, s.dy, s.acts, s.rows, s.d_weights);
  s.acts.combined_in = Tensor{};
}

void Executor::Impl::moe_experts_back(const Op& op, exec::LayerState& ls) {
  const exec::LayerShare& sh = share(op.layer);
  exec::MoeState& s = ls.moe;
  const LayerWeights& w = shards.model.weights.layer(op.layer);
  LayerWeights& g = shards.model.grad_weights.layer(op.layer);
  const bool apart = spread(w, sh.local);
  const std::vector<int64_t>& counts = apart ? s.exchange.local_counts : s.acts.routing.counts;
  Tensor d_in = s.acts.temp(backend, s.acts.expert_in.shape);
  moe_experts_backward(backend, sh.local, w, g, s.rows, s.acts.expert_in, counts, s.acts, d_in);
  s.acts.expert_in = s.acts.expert_out = s.acts.fc1_out = s.acts.act_out = Tensor{};
  if (apart) {
    s.rows = s.acts.temp(backend, d_in.shape);
    backend.gather_rows(s.rows, d_in, s.exchange.ungroup);
  } else {
    s.rows = d_in;
  }
}

void Executor::Impl::moe_router_back(const Op& op, exec::Micro& m, exec::LayerState& ls) {
  const int l = op.layer;
  const exec::LayerShare& sh = share(l);
  exec::MoeState& s = ls.moe;
  const Shape full_s = full_shape(l);
  const Tensor xn = ls.mlp.norm_out.view(full_s);
  const LayerWeights& w = shards.model.weights.layer(l);
  LayerWeights& g = shards.model.grad_weights.layer(l);
  Tensor d_xn = buffers.pool.scratch(full_s);
  moe_permute_backward(backend, s.rows, s.acts.routing, d_xn);
  moe_router_backward(backend, sh.local, w, g, s.d_weights, xn, s.acts, aux_weight(program, sh),
                      d_xn);
  moe_shared_backward(backend, sh.local, w, g, s.dy, xn, s.acts, d_xn);
  ls.moe = exec::MoeState{};
  finish_block_backward(l, Block::mlp, m, d_xn);
}

}  // namespace stratagem
