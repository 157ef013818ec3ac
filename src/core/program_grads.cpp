// Gradient staging and the data-parallel gradient reductions of a stage.
#include <utility>

#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

GradientReductions::GradientReductions(const StageContext& stage, OpEmitter& ops)
    : stage_(stage), ops_(ops) {
  const size_t layers = stage.stage_layers().size();
  stage_buf_.assign(layers + 1, -1);
  expert_stage_buf_.assign(layers, -1);
}

void GradientReductions::stage_grads(int layer, int mb) {
  int& buf = stage_buf_[stage_slot(layer)];
  if (staged(layer) && buf < 0) {
    const int64_t params = layer >= 0 ? stage_.layer_params(layer) : stage_.embed_params();
    buf = ops_.alloc(Stream::compute, MemCategory::grads, params * stage_.element_bytes,
                     layer < 0 ? -1 : layer, mb, Phase::backward, Block::none);
  }
  if (layer >= 0) stage_expert_grads(layer, mb);
}

void GradientReductions::flush_staging_free() {
  flush_piece();
  if (const auto [buf, rs] = std::exchange(pending_expert_free_, {-1, -1}); buf >= 0)
    ops_.release(buf, Stream::dp_comm, {rs});
  if (pending_free_ < 0) return;
  ops_.release(std::exchange(pending_free_, -1), Stream::dp_comm, {pending_reduce_});
}

// Data-parallel gradient reduction of a layer (layer -1: embedding, -2: untied head), and of
// an MoE layer's experts over their expert data-parallel group. The experts' staged
// gradients go with the rest of the layer's: after the next layer's mlp backward.
void GradientReductions::reduce_grads(int layer, int mb, int after) {
  const std::pair<int, int> experts =
      layer >= 0 ? reduce_expert_grads(layer, mb, after) : std::pair{-1, -1};
  reduce_layer_grads(layer, mb, after);
  if (experts.first >= 0) pending_expert_free_ = experts;
}

void GradientReductions::reduce_layer_grads(int layer, int mb, int after) {
  const auto& s = stage_.strat(layer < 0 ? -1 : layer);
  if (s.dp_cp() == 1) return;  // cp ranks reduce too (LayerStrategy::dp_cp)
  const bool per_mb = stage_.per_microbatch(layer < 0 ? -1 : layer);
  if (!per_mb && mb != stage_.last_backward_mb[ops_.chunk()]) return;
  int64_t params = layer >= 0 ? stage_.layer_params(layer) : stage_.embed_params();
  Op op = OpEmitter::make(OpKind::collective, Stream::dp_comm, Block::none, Phase::backward,
                          layer < 0 ? -1 : layer, mb);
  op.collective = grad_sync(s).reduce;
  op.group = GroupKind::dp;
  op.purpose = Purpose::grad_reduce;
  op.bytes = params * stage_.element_bytes;
  op.chunk = static_cast<int16_t>(ops_.chunk());
  if (stage_.plan.overlap_grad_reduce || per_mb) {
    flush_staging_free();  // the previous reduction's buffers, before this one's piece
    const int rs = emit_reduction(op, {after});
    grad_reductions_.push_back(rs);
    if (staged(layer)) {
      pending_free_ = std::exchange(stage_buf_[stage_slot(layer)], -1);
      pending_reduce_ = rs;
    }
  } else {
    deferred_.push_back(op);
  }
}

// A gradient reduction on the dp stream. A reduce-scatter's received piece is a buffer of its
// own from the reduction's issue until it lands (receive_piece_bytes); the op names it. The
// free goes on the dp stream, emitted with the staged gradients' (after the next layer's mlp
// backward), as the two are live together.
int GradientReductions::emit_reduction(Op op, const std::vector<int>& deps) {
  flush_piece();
  // The experts' reduce-scatter receives its piece of the expert data-parallel group's sum.
  const LayerStrategy s = op.group == GroupKind::expert_dp ? expert_strategy(stage_.strat(op.layer))
                                                           : stage_.strat(op.layer);
  if (op.collective == Collective::reduce_scatter)
    op.buffer =
        ops_.alloc(Stream::dp_comm, MemCategory::buffers,
                   receive_piece_bytes(s, op.bytes / stage_.element_bytes, stage_.plan.dtype),
                   op.layer, op.microbatch, op.phase, Block::none, deps);
  const int rs = ops_.emit(op, deps);
  if (op.buffer >= 0) pending_piece_ = {op.buffer, rs};
  return rs;
}

void GradientReductions::flush_piece() {
  if (pending_piece_.first < 0) return;
  const auto [piece, rs] = std::exchange(pending_piece_, {-1, -1});
  ops_.release(piece, Stream::dp_comm, {rs});
}

void GradientReductions::reduce_deferred() {
  flush_staging_free();
  std::vector<int> deferred;
  for (const Op& op : deferred_) deferred.push_back(emit_reduction(op, {ops_.last_compute()}));
  flush_piece();
  // Gradients staged until a reduction deferred to here (tied embeddings split over stages,
  // without overlap) go once it has landed.
  for (int& buf : stage_buf_)
    if (buf >= 0) ops_.release(std::exchange(buf, -1), Stream::dp_comm, deferred);
}

}  // namespace stratagem::program_detail
