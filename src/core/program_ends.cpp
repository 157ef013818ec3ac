// The embedding, the LM head with its loss, and the reductions their gradients need (tied
// embeddings, sequence-parallel norms).
#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "src/core/stage_builder.hpp"
#include "stratagem/schedule.hpp"

namespace stratagem::program_detail {

// `after`: the compute before this pass, which the lookup's fetch follows.
void StageBuilder::embedding_forward(int mb, int after) {
  const auto& s = p_.embedding;
  // The lookup reads the word (and position) embeddings; their backward, a scatter-add of
  // the output gradient, does not, so only the forward fetches them.
  int fetched = fetch(s, embedding_parameters_per_rank(m_, s.tp), -1, Phase::forward, mb, after);
  compute(embedding_op(m_, samples(-1), Phase::forward, p_.dtype, p_.embedding.cp), -1, mb);
  release(fetched, Stream::compute);
  // Vocabulary-parallel lookup: partial rows are summed across the tp group.
  tp_after(Block::embedding, Phase::forward, -1, mb);
}

void StageBuilder::embedding_backward(int mb) {
  stage_grads(-1, mb);
  // Under sequence parallelism the scatter-add needs the whole sequence's gradient.
  tp_before(Block::embedding, Phase::backward, -1, mb);
  int c =
      compute(embedding_op(m_, samples(-1), Phase::backward, p_.dtype, p_.embedding.cp), -1, mb);
  flush_staging_free();
  if (mb == last_bwd_mb_[chunk_]) c = tied_reduce(c);
  if (mb == last_bwd_mb_[chunk_] || per_microbatch(-1)) c = sp_replicated_reduce(-1, c);
  reduce_grads(-1, mb, c);
}

// Tied word embeddings with pp > 1: the first and last stage sum their copies' gradients
// once both are final, before the data-parallel reduction (which may shard them) and on the
// dp stream, which no pipeline transfer waits for. Returns the op later reductions follow.
int StageBuilder::tied_reduce(int after) {
  if (p_.pp == 1 || !m_.tied_embeddings) return after;
  const int64_t bytes = tied_embedding_reduce_bytes(m_, p_.embedding.tp, p_.dtype);
  const int16_t chunk = static_cast<int16_t>(chunk_);
  int c =
      collective(Stream::dp_comm, Collective::all_reduce, GroupKind::tied_embedding,
                 Purpose::tied_grads, bytes, Block::embedding, Phase::backward, -1, -1, {after});
  out_.ops[c].chunk = chunk;
  return c;
}

// Norm parameters, replicated across a sequence-parallel tp group, saw one token shard each:
// their gradients are summed over the group once final (Megatron-LM).
int StageBuilder::sp_replicated_reduce(int layer, int after) {
  const auto& s = strat(layer);
  if (s.tp == 1 || !s.sequence_parallel) return after;
  const int64_t n = layer >= 0 ? replicated_block_parameters(m_, Block::attention) +
                                     replicated_block_parameters(m_, Block::mlp)
                    : has_head() ? replicated_head_parameters(m_)
                                 : 0;
  if (n == 0) return after;
  return collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp,
                    Purpose::replicated_grads, n * e_, Block::none, Phase::backward, layer, -1,
                    {after});
}

// The head's weights, fetched after `after` (the last layer's attention, as a layer
// prefetches its successor's).
int StageBuilder::fetch_head(int mb, int after) {
  const auto& s = p_.embedding;
  return fetch(s, head_compute_parameters_per_rank(m_, s.tp), -1, Phase::forward, mb, after);
}

// `fetched`: the buffer of the head's fetched weights (-1 when resident).
void StageBuilder::head(int mb, int fetched) {
  const auto& s = p_.embedding;
  const HeadOps h = head_ops(m_, s.tp, samples(-1), p_.dtype, s.cp);
  // fp32 logits live from the forward to the backward of the loss.
  int buf = alloc(Stream::compute, MemCategory::activations, h.logits_bytes, -1, mb, Phase::forward,
                  Block::head);
  tp_before(Block::head, Phase::forward, -1, mb);
  compute(h.forward, -1, mb);
  if (s.tp > 1) {
    // Vocabulary-parallel cross entropy (Megatron-LM): the row maximum of the logits, then
    // the sum of exponentials and the target logit, per token.
    int c = collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp, Purpose::loss_stats,
                       h.loss_max_bytes, Block::head, Phase::forward, -1, mb, {last_compute_});
    c = collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp, Purpose::loss_stats,
                   h.loss_sum_bytes, Block::head, Phase::forward, -1, mb, {c});
    compute_waits_.push_back(c);
  }
  stage_grads(-1, mb);
  compute(h.backward, -1, mb);
  release(buf, Stream::compute);
  // The final norm's backward runs on the reduced input gradient: its weight (fetched under
  // ZeRO-3) is held until then.
  const int reduced = tp_after(Block::head, Phase::backward, -1, mb);
  release(fetched, Stream::compute);
  if (has_head() && !has_embedding()) {
    const int ready = reduced >= 0 ? reduced : last_compute_;
    if (m_.tied_embeddings && p_.pp > 1)
      head_done_mb_ = mb;  // reduced after this stage's last backward (see build)
    else
      reduce_grads(-2, mb,
                   mb == last_bwd_mb_[chunk_] || per_microbatch(-1)
                       ? sp_replicated_reduce(-1, ready)
                       : ready);
  }
}

}  // namespace stratagem::program_detail
