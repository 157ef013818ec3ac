// The schedule walk: a stage's forward and backward passes of its chunks, in stage_schedule's
// order, with their pipeline transfers and activation offload.
#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "src/core/stage_builder.hpp"
#include "stratagem/schedule.hpp"

namespace stratagem::program_detail {

StageProgram StageBuilder::build() {
  // The micro-batch whose backward comes last on each chunk: gradients are final after it.
  auto steps = stage_schedule(p_, out_.stage, M_);
  for (const auto& st : steps)
    if (!st.forward) last_bwd_mb_[st.chunk] = st.microbatch;
  setup();
  for (const auto& st : steps)
    st.forward ? forward(st.chunk, st.microbatch) : backward(st.chunk, st.microbatch);
  if (head_done_mb_ >= 0) {
    chunk_ = nchunks_ - 1;
    const int after = sp_replicated_reduce(-1, tied_reduce(last_compute_));
    reduce_grads(-2, last_bwd_mb_[chunk_], after);
  }
  flush_staging_free();
  std::vector<int> deferred;
  for (const Op& op : deferred_) deferred.push_back(emit_reduction(op, {last_compute_}));
  flush_piece();
  // Gradients staged until a reduction deferred to here (tied embeddings split over stages,
  // without overlap) go once it has landed.
  for (int& buf : stage_buf_)
    if (buf >= 0) release(std::exchange(buf, -1), Stream::dp_comm, deferred);
  optimizer();
  teardown();
  return std::move(out_);
}

void StageBuilder::forward(int chunk, int mb) {
  chunk_ = chunk;
  const LayerRange r = p_.chunks[chunk];
  // A pass's first fetch is issued when the rank reaches the pass (its previous compute has
  // run), not as soon as the copy or dp stream is free: before, it would hold the next
  // micro-batch's weights through the current one's backward.
  const int started = last_compute_;
  if (chunk > 0) {
    compute_waits_.push_back(
        emit(pp_transfer(OpKind::recv, GroupKind::pp_prev, Phase::forward, r.begin - 1, mb), {}));
  } else {
    embedding_forward(mb, started);
  }
  int prev_attn = -1;
  for (int l = r.begin; l < r.end; ++l) {
    const auto& s = strat(l);
    reshard(l - 1, l, Phase::forward, mb);
    const int fetched = fetch_params(l, Phase::forward, mb, l == r.begin ? started : prev_attn);
    const int b = samples(l);
    const LayerWork& w = work(l);
    int act_a = alloc(Stream::compute, MemCategory::activations, w.saved_bytes[0], l, mb,
                      Phase::forward, Block::attention);
    tp_before(Block::attention, Phase::forward, l, mb);
    prev_attn = attention(Phase::forward, l, mb);
    tp_after(Block::attention, Phase::forward, l, mb);

    int act_m = alloc(Stream::compute, MemCategory::activations, w.saved_bytes[1], l, mb,
                      Phase::forward, Block::mlp);
    tp_before(Block::mlp, Phase::forward, l, mb);
    int c = ffn(Phase::forward, l, mb, b, w.forward[1]);
    tp_after(Block::mlp, Phase::forward, l, mb);
    release(fetched, Stream::compute);
    if (s.offload_activations) {
      Op op = make(OpKind::copy_d2h, Stream::d2h, Block::none, Phase::forward, l, mb);
      op.category = MemCategory::activations;
      op.bytes = live_bytes(act_a) + live_bytes(act_m);
      int cp = emit(op, {c});
      offloaded_[key(l, mb)] = cp;
      release(act_a, Stream::d2h, {cp});
      release(act_m, Stream::d2h, {cp});
      act_a = act_m = -1;
    }
    saved_[key(l, mb)] = {act_a, act_m};
  }
  if (chunk == nchunks_ - 1) {
    // The LM head works in the embedding's (tp, dp): the last layer's output reshards to it.
    reshard(r.end - 1, -1, Phase::forward, mb);
    head(mb, fetch_head(mb, prev_attn));
  } else {
    emit_send(pp_transfer(OpKind::send, GroupKind::pp_next, Phase::forward, r.end - 1, mb));
  }
}

// Layer l's offloaded activations of micro-batch mb come back into fresh buffers once they
// are down and `after` has run: returns the two buffers and the copy.
std::tuple<int, int, int> StageBuilder::reload(int l, int mb, int after) {
  const int64_t ba = work(l).saved_bytes[0];
  const int64_t bm = work(l).saved_bytes[1];
  const int down = std::exchange(offloaded_[key(l, mb)], -1);
  if (down < 0) throw std::logic_error("program: activations reloaded that were not offloaded");
  const int act_a = alloc(Stream::h2d, MemCategory::activations, ba, l, mb, Phase::backward,
                          Block::attention, {after, down});
  const int act_m = alloc(Stream::h2d, MemCategory::activations, bm, l, mb, Phase::backward,
                          Block::mlp, {after, down});
  Op op = make(OpKind::copy_h2d, Stream::h2d, Block::none, Phase::backward, l, mb);
  op.category = MemCategory::activations;
  op.bytes = ba + bm;
  return {act_a, act_m, emit(op, {after, down})};
}

void StageBuilder::backward(int chunk, int mb) {
  chunk_ = chunk;
  const LayerRange r = p_.chunks[chunk];
  if (chunk < nchunks_ - 1) {
    compute_waits_.push_back(
        emit(pp_transfer(OpKind::recv, GroupKind::pp_next, Phase::backward, r.end - 1, mb), {}));
  }
  // The loss's gradient goes back from the head's (tp, dp) into the last layer's.
  if (chunk == nchunks_ - 1) reshard(-1, r.end - 1, Phase::backward, mb);
  // The chunk's backward starts with the gradient's arrival (or the loss's backward).
  const int started = chunk < nchunks_ - 1 ? compute_waits_.back() : last_compute_;
  // Offloaded activations come back one layer ahead of their backward, as the next layer's
  // weights are prefetched.
  std::tuple<int, int, int> next_reload{-1, -1, -1};
  if (strat(r.end - 1).offload_activations) next_reload = reload(r.end - 1, mb, started);
  int prev_mlp = -1;
  // Backward prefetch (FSDP's BACKWARD_PRE): layer l-1's weights are fetched once layer l's
  // mlp backward has run, before layer l's gradient reduction takes the in-order dp stream,
  // so that the fetch is not queued behind it.
  int next_wait = -1;
  int next_fetched = fetch_params(r.end - 1, Phase::backward, mb, started, &next_wait);
  for (int l = r.end - 1; l >= r.begin; --l) {
    const auto& s = strat(l);
    const int b = samples(l);
    const LayerWork& w = work(l);
    auto [act_a, act_m] = std::exchange(saved_[key(l, mb)], kNoSaved);
    if (act_a == kNoSaved.first)
      throw std::logic_error("program: a backward without its forward's activations");
    const int fetched = p_.backward_prefetch || l == r.end - 1
                            ? next_fetched
                            : fetch_params(l, Phase::backward, mb, prev_mlp);
    if (next_wait >= 0) compute_waits_.push_back(next_wait), next_wait = -1;
    if (s.offload_activations) {
      std::tie(act_a, act_m, reloaded_) = next_reload;
      compute_waits_.push_back(reloaded_);
    }
    int re_a = -1, re_m = -1;
    if (s.recompute == Recompute::full) {
      // Rebuild the layer's activations from its saved input, communication included.
      re_a = alloc(Stream::compute, MemCategory::activations, rebuilt(l, Block::attention), l, mb,
                   Phase::recompute, Block::attention);
      tp_before(Block::attention, Phase::recompute, l, mb);
      attention(Phase::recompute, l, mb);
      tp_after(Block::attention, Phase::recompute, l, mb);
      re_m = alloc(Stream::compute, MemCategory::activations, rebuilt(l, Block::mlp), l, mb,
                   Phase::recompute, Block::mlp);
      tp_before(Block::mlp, Phase::recompute, l, mb);
      ffn(Phase::recompute, l, mb, b, w.forward[1]);
      tp_after(Block::mlp, Phase::recompute, l, mb);
    }
    stage_grads(l, mb);
    tp_before(Block::mlp, Phase::backward, l, mb);
    prev_mlp = ffn(Phase::backward, l, mb, b, w.backward[1]);
    tp_after(Block::mlp, Phase::backward, l, mb);
    // Emitted before the mlp's buffers go, as the h2d stream runs it: it waits only for the
    // mlp's backward.
    if (l > r.begin && strat(l - 1).offload_activations) next_reload = reload(l - 1, mb, prev_mlp);
    flush_staging_free();
    release(act_m, Stream::compute);
    release(re_m, Stream::compute);
    if (p_.backward_prefetch)
      next_fetched =
          l > r.begin ? fetch_params(l - 1, Phase::backward, mb, prev_mlp, &next_wait) : -1;
    if (s.recompute == Recompute::selective && !p_.flash_attention) {
      // The attention probabilities were not kept: rebuild them from the saved Q and K.
      const BlockWork core = selective_recompute_work(m_, s, b);
      re_a = alloc(Stream::compute, MemCategory::activations, rebuilt(l, Block::attention), l, mb,
                   Phase::recompute, Block::attention);
      compute(Block::attention, Phase::recompute, l, mb, b, core.attention_flops,
              core.elementwise_bytes);
    }
    tp_before(Block::attention, Phase::backward, l, mb);
    int c = attention(Phase::backward, l, mb);
    // The layer's gradients are final once the attention's tp reduction has landed (its
    // norm's gradient is computed from the reduced input gradient).
    const int reduced = tp_after(Block::attention, Phase::backward, l, mb);
    release(act_a, Stream::compute);
    release(re_a, Stream::compute);
    release(fetched, Stream::compute);
    reloaded_ = -1;
    int ready = reduced >= 0 ? reduced : c;
    if (mb == last_bwd_mb_[chunk_] || per_microbatch(l))
      ready = moe_router_grads_reduce(l, sp_replicated_reduce(l, ready));
    reduce_grads(l, mb, ready);
    // Going back across a dp change: the gradient for a wider-dp layer is a slice, for a
    // narrower-dp (larger tp) previous layer the ranks all-gather it.
    reshard(l, l - 1, Phase::backward, mb);
  }
  if (chunk == 0) {
    embedding_backward(mb);
  } else {
    emit_send(pp_transfer(OpKind::send, GroupKind::pp_prev, Phase::backward, r.begin - 1, mb));
  }
  flush_staging_free();
}

// A pipeline send or receive of layer `layer`'s output (forward) or input gradient
// (backward), to or from the peer stage `peer`, in the running chunk.
Op StageBuilder::pp_transfer(OpKind kind, GroupKind peer, Phase ph, int layer, int mb) const {
  Op op = make(kind, Stream::pp_comm, Block::none, ph, layer, mb);
  op.group = peer;
  op.purpose = Purpose::pipeline;
  op.bytes = boundary(layer);
  op.chunk = static_cast<int16_t>(chunk_);
  return op;
}

// A send carries the block output: it waits for the compute and for the tensor-parallel
// collective that completes that output (pending for the next compute op as well).
void StageBuilder::emit_send(Op op) {
  std::vector<int> deps = compute_waits_;
  deps.push_back(last_compute_);
  emit(op, deps);
}

}  // namespace stratagem::program_detail
