// The schedule walk: a stage's forward and backward passes of its chunks, in stage_schedule's
// order, with their pipeline transfers, activation offload and the tensor-parallel and reshard
// collectives around a block.
#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

StageProgram StageBuilder::build() {
  states_.setup();
  for (const auto& st : stage_.steps) {
    if (st.weight)
      passes_.weight(st.chunk, st.microbatch);
    else if (st.forward)
      passes_.forward(st.chunk, st.microbatch);
    else
      passes_.backward(st.chunk, st.microbatch);
  }
  passes_.reduce_tied_head();
  grads_.reduce_deferred();
  states_.optimizer();
  states_.teardown();
  return ops_.finish();
}

Passes::Passes(const StageContext& stage, OpEmitter& ops, WeightFetches& weights,
               GradientReductions& grads, MoeFfn& moe, CpAttention& cp)
    : stage_(stage), ops_(ops), weights_(weights), grads_(grads), moe_(moe), cp_(cp) {
  const size_t layers = stage.stage_layers().size();
  saved_.assign(layers * stage.microbatches, kNoSaved);
  offloaded_.assign(layers * stage.microbatches, -1);
  if (stage.split_backward) weight_inputs_.assign(layers * stage.microbatches, {});
}

void Passes::forward(int chunk, int mb) {
  ops_.set_chunk(chunk);
  const LayerRange r = stage_.plan.chunks[chunk];
  // A pass's first fetch is issued when the rank reaches the pass (its previous compute has
  // run), not as soon as the copy or dp stream is free: before, it would hold the next
  // micro-batch's weights through the current one's backward.
  const int started = ops_.last_compute();
  if (chunk > 0) {
    ops_.compute_waits_for(ops_.emit(
        pp_transfer(OpKind::recv, GroupKind::pp_prev, Phase::forward, r.begin - 1, mb), {}));
  } else {
    embedding_forward(mb, started);
  }
  int prev_attn = -1;
  for (int l = r.begin; l < r.end; ++l) {
    const auto& s = stage_.strat(l);
    reshard(l - 1, l, Phase::forward, mb);
    const int fetched =
        weights_.fetch_params(l, Phase::forward, mb, l == r.begin ? started : prev_attn);
    const int b = stage_.samples(l);
    const StageContext::LayerWork& w = stage_.work(l);
    // A split backward's W reads some of them (the GEMMs' inputs): they go with W, the rest
    // with B.
    const bool split = stage_.split_backward;
    int act_a = ops_.alloc(Stream::compute, MemCategory::activations,
                           w.saved_bytes[0] - (split ? w.weight_input_bytes[0] : 0), l, mb,
                           Phase::forward, Block::attention);
    if (split)
      weight_inputs_[key(l, mb)].kept[0] =
          ops_.alloc(Stream::compute, MemCategory::activations, w.weight_input_bytes[0], l, mb,
                     Phase::weight_grad, Block::attention);
    tp_before(Block::attention, Phase::forward, l, mb);
    prev_attn = cp_.attention(Phase::forward, l, mb);
    tp_after(Block::attention, Phase::forward, l, mb);

    int act_m = ops_.alloc(Stream::compute, MemCategory::activations,
                           w.saved_bytes[1] - (split ? w.weight_input_bytes[1] : 0), l, mb,
                           Phase::forward, Block::mlp);
    if (split)
      weight_inputs_[key(l, mb)].kept[1] =
          ops_.alloc(Stream::compute, MemCategory::activations, w.weight_input_bytes[1], l, mb,
                     Phase::weight_grad, Block::mlp);
    tp_before(Block::mlp, Phase::forward, l, mb);
    int c = moe_.ffn(Phase::forward, l, mb, b, w.forward[1]);
    tp_after(Block::mlp, Phase::forward, l, mb);
    ops_.release(fetched, Stream::compute);
    if (s.offload_activations) {
      Op op = OpEmitter::make(OpKind::copy_d2h, Stream::d2h, Block::none, Phase::forward, l, mb);
      op.category = MemCategory::activations;
      op.bytes = ops_.live_bytes(act_a) + ops_.live_bytes(act_m);
      int cp = ops_.emit(op, {c});
      offloaded_[key(l, mb)] = cp;
      ops_.release(act_a, Stream::d2h, {cp});
      ops_.release(act_m, Stream::d2h, {cp});
      act_a = act_m = -1;
    }
    saved_[key(l, mb)] = {act_a, act_m};
  }
  if (chunk == stage_.chunk_count - 1) {
    // The LM head works in the embedding's (tp, dp): the last layer's output reshards to it.
    reshard(r.end - 1, -1, Phase::forward, mb);
    head(mb, weights_.fetch_head(mb, prev_attn));
  } else {
    emit_send(pp_transfer(OpKind::send, GroupKind::pp_next, Phase::forward, r.end - 1, mb));
  }
}

// Layer l's offloaded activations of micro-batch mb come back into fresh buffers once they
// are down and `after` has run: returns the two buffers and the copy.
std::tuple<int, int, int> Passes::reload(int l, int mb, int after) {
  const int64_t ba = stage_.work(l).saved_bytes[0];
  const int64_t bm = stage_.work(l).saved_bytes[1];
  const int down = std::exchange(offloaded_[key(l, mb)], -1);
  if (down < 0) throw std::logic_error("program: activations reloaded that were not offloaded");
  const int act_a = ops_.alloc(Stream::h2d, MemCategory::activations, ba, l, mb, Phase::backward,
                               Block::attention, {after, down});
  const int act_m = ops_.alloc(Stream::h2d, MemCategory::activations, bm, l, mb, Phase::backward,
                               Block::mlp, {after, down});
  Op op = OpEmitter::make(OpKind::copy_h2d, Stream::h2d, Block::none, Phase::backward, l, mb);
  op.category = MemCategory::activations;
  op.bytes = ba + bm;
  return {act_a, act_m, ops_.emit(op, {after, down})};
}

// Full recompute: layer l's activations rebuilt from its saved input, communication included;
// returns the attention's and the mlp's buffers.
std::pair<int, int> Passes::rebuild(int l, int mb) {
  const int b = stage_.samples(l);
  const int re_a =
      ops_.alloc(Stream::compute, MemCategory::activations, stage_.rebuilt(l, Block::attention), l,
                 mb, Phase::recompute, Block::attention);
  tp_before(Block::attention, Phase::recompute, l, mb);
  cp_.attention(Phase::recompute, l, mb);
  tp_after(Block::attention, Phase::recompute, l, mb);
  const int re_m = ops_.alloc(Stream::compute, MemCategory::activations,
                              stage_.rebuilt(l, Block::mlp), l, mb, Phase::recompute, Block::mlp);
  tp_before(Block::mlp, Phase::recompute, l, mb);
  moe_.ffn(Phase::recompute, l, mb, b, stage_.work(l).forward[1]);
  tp_after(Block::mlp, Phase::recompute, l, mb);
  return {re_a, re_m};
}

void Passes::backward(int chunk, int mb) {
  ops_.set_chunk(chunk);
  const LayerRange r = stage_.plan.chunks[chunk];
  const int last_chunk = stage_.chunk_count - 1;
  if (chunk < last_chunk) {
    ops_.compute_waits_for(ops_.emit(
        pp_transfer(OpKind::recv, GroupKind::pp_next, Phase::backward, r.end - 1, mb), {}));
  }
  // The loss's gradient goes back from the head's (tp, dp) into the last layer's.
  if (chunk == last_chunk) reshard(-1, r.end - 1, Phase::backward, mb);
  // The chunk's backward starts with the gradient's arrival (or the loss's backward).
  const int started = chunk < last_chunk ? ops_.compute_waits().back() : ops_.last_compute();
  // Offloaded activations come back one layer ahead of their backward, as the next layer's
  // weights are prefetched.
  std::tuple<int, int, int> next_reload{-1, -1, -1};
  if (stage_.strat(r.end - 1).offload_activations) next_reload = reload(r.end - 1, mb, started);
  int prev_mlp = -1;
  // Backward prefetch (FSDP's BACKWARD_PRE): layer l-1's weights are fetched once layer l's
  // mlp backward has run, before layer l's gradient reduction takes the in-order dp stream,
  // so that the fetch is not queued behind it.
  int next_wait = -1;
  int next_fetched = weights_.fetch_params(r.end - 1, Phase::backward, mb, started, &next_wait);
  for (int l = r.end - 1; l >= r.begin; --l) {
    const auto& s = stage_.strat(l);
    const int b = stage_.samples(l);
    const StageContext::LayerWork& w = stage_.work(l);
    auto [act_a, act_m] = std::exchange(saved_[key(l, mb)], kNoSaved);
    if (act_a == kNoSaved.first)
      throw std::logic_error("program: a backward without its forward's activations");
    const int fetched = stage_.plan.backward_prefetch || l == r.end - 1
                            ? next_fetched
                            : weights_.fetch_params(l, Phase::backward, mb, prev_mlp);
    if (next_wait >= 0) ops_.compute_waits_for(next_wait), next_wait = -1;
    if (s.offload_activations) {
      std::tie(act_a, act_m, reloaded_) = next_reload;
      ops_.compute_waits_for(reloaded_);
    }
    auto [re_a, re_m] = s.recompute == Recompute::full ? rebuild(l, mb) : std::pair{-1, -1};
    grads_.stage_grads(l, mb);
    const bool split = stage_.split_backward;
    // A split backward's B leaves its W the GEMMs' output gradients (and, under sp, the
    // gathered input), written as it runs; under full recompute the rebuilt activations, which
    // hold the GEMMs' inputs, stay for W too.
    WeightInputs* for_w = split ? &weight_inputs_[key(l, mb)] : nullptr;
    if (for_w)
      for_w->stash[1] = ops_.alloc(Stream::compute, MemCategory::activations,
                                   w.weight_stash_bytes[1], l, mb, Phase::backward, Block::mlp);
    tp_before(Block::mlp, Phase::backward, l, mb);
    prev_mlp = moe_.ffn(Phase::backward, l, mb, b, split ? w.input_grad[1] : w.backward[1]);
    tp_after(Block::mlp, Phase::backward, l, mb);
    // Emitted before the mlp's buffers go, as the h2d stream runs it: it waits only for the
    // mlp's backward.
    if (l > r.begin && stage_.strat(l - 1).offload_activations)
      next_reload = reload(l - 1, mb, prev_mlp);
    grads_.flush_staging_free();
    ops_.release(act_m, Stream::compute);
    if (for_w && s.recompute == Recompute::full) for_w->rebuilt[1] = std::exchange(re_m, -1);
    ops_.release(re_m, Stream::compute);
    if (stage_.plan.backward_prefetch)
      next_fetched = l > r.begin
                         ? weights_.fetch_params(l - 1, Phase::backward, mb, prev_mlp, &next_wait)
                         : -1;
    if (s.recompute == Recompute::selective && !stage_.plan.flash_attention) {
      // The attention probabilities were not kept: rebuild them from the saved Q and K.
      const BlockWork core = selective_recompute_work(stage_.model, s, b);
      re_a =
          ops_.alloc(Stream::compute, MemCategory::activations, stage_.rebuilt(l, Block::attention),
                     l, mb, Phase::recompute, Block::attention);
      ops_.compute(Block::attention, Phase::recompute, l, mb, b, core.attention_flops,
                   core.elementwise_bytes);
    }
    if (for_w)
      for_w->stash[0] =
          ops_.alloc(Stream::compute, MemCategory::activations, w.weight_stash_bytes[0], l, mb,
                     Phase::backward, Block::attention);
    tp_before(Block::attention, Phase::backward, l, mb);
    int c = cp_.attention(Phase::backward, l, mb);
    // The layer's gradients are final once the attention's tp reduction has landed (its
    // norm's gradient is computed from the reduced input gradient).
    const int reduced = tp_after(Block::attention, Phase::backward, l, mb);
    ops_.release(act_a, Stream::compute);
    if (for_w && s.recompute == Recompute::full) for_w->rebuilt[0] = std::exchange(re_a, -1);
    ops_.release(re_a, Stream::compute);
    ops_.release(fetched, Stream::compute);
    reloaded_ = -1;
    if (!split) reduce_layer(chunk, l, mb, reduced >= 0 ? reduced : c);
    // Going back across a dp change: the gradient for a wider-dp layer is a slice, for a
    // narrower-dp (larger tp) previous layer the ranks all-gather it.
    reshard(l, l - 1, Phase::backward, mb);
  }
  if (chunk == 0) {
    embedding_backward(mb);
  } else {
    emit_send(pp_transfer(OpKind::send, GroupKind::pp_prev, Phase::backward, r.begin - 1, mb));
  }
  grads_.flush_staging_free();
}

void Passes::reduce_tied_head() {
  if (head_done_mb_ < 0) return;
  ops_.set_chunk(stage_.chunk_count - 1);
  const int after = grads_.sp_replicated_reduce(-1, grads_.tied_reduce(ops_.last_compute()));
  grads_.reduce_grads(-2, stage_.last_backward_mb[ops_.chunk()], after);
}

// A pipeline send or receive of layer `layer`'s output (forward) or input gradient
// (backward), to or from the peer stage `peer`, in the running chunk.
Op Passes::pp_transfer(OpKind kind, GroupKind peer, Phase ph, int layer, int mb) const {
  // Megatron-Core's 1F1B waits on its combined send and receive (send_forward_recv_backward):
  // one in-order stream. Its interleaved schedule overlaps them (overlap_p2p_comm), and the
  // zero-bubble ones post receives ahead (torch.distributed.pipelining, the authors' code).
  const bool posted = kind == OpKind::recv && stage_.plan.schedule != Schedule::gpipe &&
                      stage_.plan.schedule != Schedule::one_f_one_b;
  Op op =
      OpEmitter::make(kind, posted ? Stream::pp_recv : Stream::pp_comm, Block::none, ph, layer, mb);
  op.group = peer;
  op.purpose = Purpose::pipeline;
  op.bytes = stage_.boundary(layer);
  op.chunk = static_cast<int16_t>(ops_.chunk());
  return op;
}

// A send carries the block output: it waits for the compute and for the tensor-parallel
// collective that completes that output (pending for the next compute op as well).
void Passes::emit_send(Op op) {
  std::vector<int> deps = ops_.compute_waits();
  deps.push_back(ops_.last_compute());
  ops_.emit(op, deps);
}

// Tensor-parallel collectives around a block (iteration.hpp's tp_comm): the all-gathers
// before it (layer -1: the embedding or head), which the block's compute waits for.
int Passes::tp_before(Block b, Phase ph, int layer, int mb) {
  const auto& s = stage_.strat(layer);
  const TpComm t = tp_comm(s, b, ph);
  if (t.gathers == 0) return -1;
  const int64_t bytes =
      token_stream_bytes(stage_.model, stage_.samples(layer), stage_.plan.dtype, s.cp);
  int c = -1;
  for (int i = 0; i < t.gathers; ++i) {
    c = ops_.collective(Stream::tp_comm, Collective::all_gather, GroupKind::tp,
                        Purpose::activations, bytes, b, ph, layer, mb,
                        {ops_.last_compute(), reloaded_});
    ops_.compute_waits_for(c);
  }
  return c;
}

// Returns the collective (-1 when none): in backward its completion finishes the block's
// gradients (the norm's backward runs on the reduced input gradient).
int Passes::tp_after(Block b, Phase ph, int layer, int mb) {
  const auto& s = stage_.strat(layer);
  const TpComm t = tp_comm(s, b, ph);
  if (t.after == Collective::none) return -1;
  const int64_t bytes =
      token_stream_bytes(stage_.model, stage_.samples(layer), stage_.plan.dtype, s.cp);
  int c = ops_.collective(Stream::tp_comm, t.after, GroupKind::tp, Purpose::activations, bytes, b,
                          ph, layer, mb, {ops_.last_compute()});
  ops_.compute_waits_for(c);
  return c;
}

// Samples move between ranks when consecutive layers hold the stream differently
// (LayerStrategy::stream_tp: (tp, dp), sequence parallelism): when the replicas holding a
// whole stream grow, their ranks all-gather; when they shrink, each takes a slice.
void Passes::reshard(int from_layer, int to_layer, Phase ph, int mb) {
  if (reshard_gather_ranks(stage_.strat(from_layer), stage_.strat(to_layer)) == 0) return;
  const int a = stage_.strat(from_layer).stream_tp(), b = stage_.strat(to_layer).stream_tp();
  int64_t bytes = stage_.boundary(to_layer);
  Op op = ops_.collective_op(Stream::tp_comm, Collective::all_gather, GroupKind::reshard,
                             Purpose::reshard, bytes, Block::reshard, ph, to_layer, mb);
  op.reshard_from_tp = a;
  op.reshard_to_tp = b;
  const int c = ops_.emit(op, {ops_.last_compute()});
  ops_.compute_waits_for(c);
}

}  // namespace stratagem::program_detail
