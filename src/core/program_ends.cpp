// The embedding, the LM head with its loss, and the reductions their gradients need (tied
// embeddings, sequence-parallel norms).
#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

// `after`: the compute before this pass, which the lookup's fetch follows.
void Passes::embedding_forward(int mb, int after) {
  const auto& s = stage_.plan.embedding;
  // The lookup reads the word (and position) embeddings; their backward, a scatter-add of
  // the output gradient, does not, so only the forward fetches them.
  int fetched = weights_.fetch(s, embedding_parameters_per_rank(stage_.model, s.tp), -1,
                               Phase::forward, mb, after);
  ops_.compute(embedding_op(stage_.model, stage_.samples(-1), Phase::forward, stage_.plan.dtype,
                            stage_.plan.embedding.cp),
               -1, mb);
  ops_.release(fetched, Stream::compute);
  // Vocabulary-parallel lookup: partial rows are summed across the tp group.
  tp_after(Block::embedding, Phase::forward, -1, mb);
}

void Passes::embedding_backward(int mb) {
  grads_.stage_grads(-1, mb);
  // Under sequence parallelism the scatter-add needs the whole sequence's gradient.
  tp_before(Block::embedding, Phase::backward, -1, mb);
  int c = ops_.compute(embedding_op(stage_.model, stage_.samples(-1), Phase::backward,
                                    stage_.plan.dtype, stage_.plan.embedding.cp),
                       -1, mb);
  grads_.flush_staging_free();
  const bool last = mb == stage_.last_backward_mb[ops_.chunk()];
  if (last) c = grads_.tied_reduce(c);
  if (last || stage_.per_microbatch(-1)) c = grads_.sp_replicated_reduce(-1, c);
  grads_.reduce_grads(-1, mb, c);
}

// Tied word embeddings with pp > 1: the first and last stage sum their copies' gradients
// once both are final, before the data-parallel reduction (which may shard them) and on the
// dp stream, which no pipeline transfer waits for. Returns the op later reductions follow.
int GradientReductions::tied_reduce(int after) {
  if (stage_.plan.pp == 1 || !stage_.model.tied_embeddings) return after;
  const int64_t bytes =
      tied_embedding_reduce_bytes(stage_.model, stage_.plan.embedding.tp, stage_.plan.dtype);
  const int16_t chunk = static_cast<int16_t>(ops_.chunk());
  int c = ops_.collective(Stream::dp_comm, Collective::all_reduce, GroupKind::tied_embedding,
                          Purpose::tied_grads, bytes, Block::embedding, Phase::backward, -1, -1,
                          {after});
  ops_.op(c).chunk = chunk;
  return c;
}

// Norm parameters, replicated across a sequence-parallel tp group, saw one token shard each:
// their gradients are summed over the group once final (Megatron-LM).
int GradientReductions::sp_replicated_reduce(int layer, int after) {
  const auto& s = stage_.strat(layer);
  if (s.tp == 1 || !s.sequence_parallel) return after;
  const int64_t n = layer >= 0 ? replicated_block_parameters(stage_.model, Block::attention) +
                                     replicated_block_parameters(stage_.model, Block::mlp)
                    : stage_.has_head() ? replicated_head_parameters(stage_.model)
                                        : 0;
  if (n == 0) return after;
  return ops_.collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp,
                         Purpose::replicated_grads, n * stage_.element_bytes, Block::none,
                         Phase::backward, layer, -1, {after});
}

// `fetched`: the buffer of the head's fetched weights (-1 when resident).
void Passes::head(int mb, int fetched) {
  const auto& s = stage_.plan.embedding;
  const HeadOps h = head_ops(stage_.model, s.tp, stage_.samples(-1), stage_.plan.dtype, s.cp);
  // fp32 logits live from the forward to the backward of the loss.
  int buf = ops_.alloc(Stream::compute, MemCategory::activations, h.logits_bytes, -1, mb,
                       Phase::forward, Block::head);
  tp_before(Block::head, Phase::forward, -1, mb);
  // What the framework's loss holds beside them while its forward runs.
  const int64_t transient = stage_.framework.loss_transient_bytes(h.logits_bytes);
  const int held = transient > 0 ? ops_.alloc(Stream::compute, MemCategory::activations, transient,
                                              -1, mb, Phase::forward, Block::head)
                                 : -1;
  ops_.compute(h.forward, -1, mb);
  ops_.release(held, Stream::compute);
  if (s.tp > 1) {
    // Vocabulary-parallel cross entropy (Megatron-LM): the row maximum of the logits, then
    // the sum of exponentials and the target logit, per token.
    int c = ops_.collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp,
                            Purpose::loss_stats, h.loss_max_bytes, Block::head, Phase::forward, -1,
                            mb, {ops_.last_compute()});
    c = ops_.collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp, Purpose::loss_stats,
                        h.loss_sum_bytes, Block::head, Phase::forward, -1, mb, {c});
    ops_.compute_waits_for(c);
  }
  grads_.stage_grads(-1, mb);
  ops_.compute(h.backward, -1, mb);
  ops_.release(buf, Stream::compute);
  // The final norm's backward runs on the reduced input gradient: its weight (fetched under
  // ZeRO-3) is held until then.
  const int reduced = tp_after(Block::head, Phase::backward, -1, mb);
  ops_.release(fetched, Stream::compute);
  if (stage_.has_head() && !stage_.has_embedding()) {
    const int ready = reduced >= 0 ? reduced : ops_.last_compute();
    if (stage_.tied_split())
      head_done_mb_ = mb;  // reduced after this stage's last backward (see reduce_tied_head)
    else
      grads_.reduce_grads(-2, mb,
                          mb == stage_.last_backward_mb[ops_.chunk()] || stage_.per_microbatch(-1)
                              ? grads_.sp_replicated_reduce(-1, ready)
                              : ready);
  }
}

}  // namespace stratagem::program_detail
