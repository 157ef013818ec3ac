// An MoE layer's FFN inside its mlp op (moe_block.hpp), on a rank that holds every expert of
// the layer: ep = etp = 1 and tp = 1, where the expert data-parallel group is the dense dp
// group, so the experts' gradients take the dense layers' reductions and ZeRO. The saved
// tensors live in the op's activation buffer, the transients in the executor's scratch, so
// the memory measured holds them. The load-balancing loss joins the step's loss with the
// weight of one micro-batch, as the cross-entropy's tokens do.
#include "src/runtime/exec/impl.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

namespace {
// The aux loss's weight in the step's loss: the mean over the global batch's micro-batches.
double aux_weight(const Program& program, const exec::LayerShare& sh) {
  return 1.0 / (double(program.num_microbatches) * sh.dp);
}
}  // namespace

void Executor::Impl::moe_block_forward(const Op& op, exec::LayerState& ls, const Tensor& xn,
                                       Tensor& y) {
  const exec::LayerShare& sh = share(op.layer);
  if (sh.tp != 1 ||
      int(shards.model.weights.layer(op.layer).expert_fc1_w.size()) != whole.moe.experts)
    throw NotSupported("layer " + std::to_string(op.layer) +
                       ": the runtime runs an MoE layer on ranks that hold all of its experts "
                       "(tp = ep = etp = 1) so far");
  const bool rec = op.phase == Phase::recompute;
  const int acts = op.recompute == Recompute::full && !rec
                       ? -1
                       : buffers.of(Block::mlp, rec ? Phase::recompute : Phase::forward, op.layer,
                                    op.microbatch);
  MoeActs& a = ls.moe;
  a = MoeActs{};
  a.saved = [this, acts](Shape s) { return buffers.pool.take(acts, s); };
  a.scratch = [this](Shape s) { return buffers.pool.scratch(s); };
  moe_forward(backend, sh.local, shards.model.weights.layer(op.layer), xn, y, a);
  // Its loss counts once per micro-batch: in forward, not again in a recompute.
  if (!rec)
    current_step.loss_sum += a.aux_loss * aux_weight(program, sh) * double(plan.global_batch) * T;
}

void Executor::Impl::moe_block_backward(const Op& op, exec::LayerState& ls, const Tensor& dy,
                                        const Tensor& xn, Tensor& d_xn) {
  const exec::LayerShare& sh = share(op.layer);
  MoeActs& a = ls.moe;
  a.scratch = [this](Shape s) { return buffers.pool.scratch(s); };
  moe_backward(backend, sh.local, shards.model.weights.layer(op.layer),
               shards.model.grad_weights.layer(op.layer), dy, xn, a, aux_weight(program, sh), d_xn);
  ls.moe = MoeActs{};
}

}  // namespace stratagem
