// The one schedule generator: turns (model, plan) into each pipeline stage's op stream.
#include "stratagem/program.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "src/core/schedule.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

const char* to_string(OpKind k) {
  static const char* n[] = {"compute",  "collective",   "send",  "recv", "copy_d2h",
                            "copy_h2d", "host_compute", "alloc", "free"};
  return n[static_cast<int>(k)];
}
const char* to_string(Stream s) {
  static const char* n[] = {"compute", "tp_comm", "dp_comm", "pp_comm", "h2d", "d2h"};
  return n[static_cast<int>(s)];
}
const char* to_string(Block b) {
  static const char* n[] = {"none", "embedding", "attention", "mlp",
                            "head", "optimizer", "reshard"};
  return n[static_cast<int>(b)];
}
const char* to_string(Phase p) {
  static const char* n[] = {"forward", "backward", "recompute", "optimizer", "setup"};
  return n[static_cast<int>(p)];
}
const char* to_string(Collective c) {
  static const char* n[] = {"none", "all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  return n[static_cast<int>(c)];
}
const char* to_string(MemCategory c) {
  static const char* n[] = {"weights", "grads", "optimizer", "activations", "buffers"};
  return n[static_cast<int>(c)];
}

std::string op_name(const Op& op) {
  std::string s;
  if (op.layer >= 0) s = "L" + std::to_string(op.layer) + ".";
  s += to_string(op.block);
  static const char* ph[] = {"fwd", "bwd", "recompute", "opt", "setup"};
  s += ".";
  s += ph[static_cast<int>(op.phase)];
  s += ".";
  switch (op.kind) {
    case OpKind::compute:
      s += "compute";
      break;
    case OpKind::collective:
      s += to_string(op.collective);
      break;
    default:
      s += to_string(op.kind);
      break;
  }
  if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
    s += ".";
    s += to_string(op.category);
  }
  if (op.microbatch >= 0) s += " mb" + std::to_string(op.microbatch);
  return s;
}

int resolve_group(const Layout& layout, int rank, const Op& op) {
  if (op.kind != OpKind::collective) return -1;
  switch (op.group) {
    case GroupKind::tp:
      return layout.tp_group(rank, op.tp);
    case GroupKind::dp:
      return layout.dp_group(rank, op.tp);
    case GroupKind::reshard:
      return layout.reshard_group(rank, op.tp, op.tp_big);
    case GroupKind::tied_embedding:
      return layout.tied_embedding_group(rank);
    default:
      return -1;
  }
}

int resolve_peer(const Layout& layout, int rank, const Op& op) {
  // The interleaved schedule wraps around: chunk v*pp on stage 0 follows chunk v*pp-1 on the
  // last stage.
  const auto c = layout.coords(rank);
  const int pp = layout.pp();
  if (op.group == GroupKind::pp_next) return layout.rank_of((c.stage + 1) % pp, c.local);
  if (op.group == GroupKind::pp_prev) return layout.rank_of((c.stage + pp - 1) % pp, c.local);
  return -1;
}

namespace {

class StageBuilder {
 public:
  StageBuilder(const ModelSpec& m, const Plan& p, int stage, int M, bool staging)
      : m_(m),
        p_(p),
        M_(M),
        staging_(staging),
        e_(dtype_bytes(p.dtype)),
        nchunks_(static_cast<int>(p.chunks.size())),
        stage_samples_(p.micro_batch * p.max_dp()) {
    out_.stage = stage;
    last_bwd_mb_.assign(nchunks_, -1);
    local_of_.assign(p.layers.size(), -1);
    work_.resize(p.layers.size());
    const std::vector<int> ls = stage_layers();
    for (size_t i = 0; i < ls.size(); ++i) local_of_[ls[i]] = static_cast<int>(i);
    saved_.assign(ls.size() * M, kNoSaved);
    stage_buf_.assign(ls.size() + 1, -1);
    offloaded_.assign(ls.size() * M, -1);
  }

  // Room for about this many ops and dependencies, so that the vectors are written once
  // instead of copied as they grow (millions of ops at pp 16).
  void reserve(size_t ops, size_t deps) {
    out_.ops.reserve(ops);
    out_.deps.reserve(deps);
  }
  size_t stage_layer_count() const { return stage_layers().size(); }

  StageProgram build() {
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

 private:
  // ---- emission ------------------------------------------------------------------------
  // Dependencies are read in place (no vector per op: a pp 16 Program has millions of ops).
  int emit(Op op, std::initializer_list<int> deps) { return emit(op, deps.begin(), deps.size()); }
  int emit(Op op, const std::vector<int>& deps) { return emit(op, deps.data(), deps.size()); }
  int emit(Op op, const int* deps, size_t ndeps) {
    if (op.layer >= 0) op.recompute = strat(op.layer).recompute;
    op.dep_begin = static_cast<uint32_t>(out_.deps.size());
    for (size_t k = 0; k < ndeps; ++k)
      if (deps[k] >= 0) out_.deps.push_back(static_cast<uint32_t>(deps[k]));
    if (op.stream == Stream::compute) {
      for (int d : compute_waits_) out_.deps.push_back(static_cast<uint32_t>(d));
      compute_waits_.clear();
    }
    op.dep_count = static_cast<uint32_t>(out_.deps.size()) - op.dep_begin;
    out_.ops.push_back(op);
    int idx = static_cast<int>(out_.ops.size()) - 1;
    if (op.stream == Stream::compute && op.kind == OpKind::compute) last_compute_ = idx;
    return idx;
  }
  static Op make(OpKind k, Stream s, Block b, Phase ph, int layer, int mb) {
    Op op;
    op.kind = k;
    op.stream = s;
    op.block = b;
    op.phase = ph;
    op.layer = layer;
    op.microbatch = mb;
    return op;
  }
  int alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph, Block b,
            std::initializer_list<int> deps = {}) {
    return alloc(s, cat, bytes, layer, mb, ph, b, std::vector<int>(deps));
  }
  int alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph, Block b,
            const std::vector<int>& deps) {
    if (bytes <= 0) return -1;
    Op op = make(OpKind::alloc, s, b, ph, layer, mb);
    op.category = cat;
    op.bytes = bytes;
    op.buffer = next_buffer_++;
    live_.push_back(emit(op, deps));  // buffer ids are dense: live_[id] is id's alloc op
    ++live_count_;
    return op.buffer;
  }
  void release(int buffer, Stream s, std::initializer_list<int> deps = {}) {
    release(buffer, s, std::vector<int>(deps));
  }
  void release(int buffer, Stream s, const std::vector<int>& deps) {
    if (buffer < 0) return;
    const int a = std::exchange(live_.at(buffer), -1);
    if (a < 0) throw std::logic_error("program: a buffer freed twice");
    --live_count_;
    Op op = out_.ops[a];  // emit sets the free's own dependencies
    op.kind = OpKind::free;
    op.stream = s;
    emit(op, deps);
  }
  int compute(Block b, Phase ph, int layer, int mb, int samples, double flops, double bytes) {
    Op op = make(OpKind::compute, Stream::compute, b, ph, layer, mb);
    op.samples = samples;
    op.flops = flops;
    op.bytes = static_cast<int64_t>(bytes);
    op.chunk = static_cast<int16_t>(chunk_);
    return emit(op, {});
  }
  // A compute op of a template (iteration.hpp) at its place: layer, micro-batch, chunk.
  int compute(Op op, int layer, int mb) {
    op.layer = layer;
    op.microbatch = mb;
    op.chunk = static_cast<int16_t>(chunk_);
    return emit(op, {});
  }
  int collective(Stream s, Collective c, GroupKind g, int tp, int64_t bytes, Block b, Phase ph,
                 int layer, int mb, std::initializer_list<int> deps, int tp_big = 1) {
    Op op = make(OpKind::collective, s, b, ph, layer, mb);
    op.collective = c;
    op.group = g;
    op.tp = static_cast<uint8_t>(tp);
    op.tp_big = static_cast<uint8_t>(tp_big);
    op.bytes = bytes;
    op.chunk = static_cast<int16_t>(chunk_);
    return emit(op, deps);
  }

  // ---- shapes --------------------------------------------------------------------------
  const LayerStrategy& strat(int layer) const {
    return layer < 0 ? p_.embedding : p_.layers[layer];
  }
  // Plan::samples_per_rank, with the plan's largest dp taken once (it walks every layer).
  int samples(int layer) const { return stage_samples_ / strat(layer).dp; }
  int64_t boundary(int layer) const {
    return boundary_activation_bytes(m_, strat(layer), samples(layer), p_.dtype);
  }
  // A layer's block work and saved activations, the same for each of its micro-batches:
  // computed on first use, not per op.
  struct BlockCost {
    double flops = 0, bytes = 0;
  };
  struct LayerWork {
    bool ready = false;
    int64_t saved_bytes[2] = {0, 0};  // attention, mlp under the layer's recompute
    BlockCost forward[2], backward[2];
  };
  const LayerWork& work(int layer) {
    LayerWork& w = work_[layer];
    if (w.ready) return w;
    const auto& s = strat(layer);
    const int b = samples(layer);
    const Block blocks[2] = {Block::attention, Block::mlp};
    for (int i = 0; i < 2; ++i) {
      w.saved_bytes[i] =
          kept_activation_bytes(m_, s, blocks[i], b, s.recompute, p_.flash_attention, p_.dtype);
      const BlockWork f = forward_work(m_, s, blocks[i], b, p_.flash_attention);
      w.forward[i] = {f.flops(), f.elementwise_bytes};
      const BlockWork g = backward_work(m_, s, blocks[i], b, p_.flash_attention);
      w.backward[i] = {g.flops(), g.elementwise_bytes};
    }
    w.ready = true;
    return w;
  }
  int64_t layer_params(int layer) const { return layer_parameters_per_rank(m_, strat(layer).tp); }
  // Bytes of block b's activations layer l's recompute rebuilds.
  int64_t rebuilt(int l, Block b) const {
    return recomputed_activation_bytes(m_, strat(l), b, samples(l), p_.flash_attention, p_.dtype);
  }
  bool has_embedding() const { return out_.stage == 0; }
  bool has_head() const { return out_.stage == p_.pp - 1; }
  int64_t embed_params() const {
    return end_parameters_per_rank(m_, p_.embedding.tp, has_embedding(), has_head());
  }
  std::vector<int> stage_layers() const {
    std::vector<int> ls;
    for (int c = out_.stage; c < nchunks_; c += p_.pp)
      for (int l = p_.chunks[c].begin; l < p_.chunks[c].end; ++l) ls.push_back(l);
    return ls;
  }

  // Tensor-parallel collectives around a block (iteration.hpp's tp_comm): the all-gathers
  // before it (layer -1: the embedding or head), which the block's compute waits for.
  int tp_before(Block b, Phase ph, int layer, int mb) {
    const auto& s = strat(layer);
    const TpComm t = tp_comm(s, b, ph);
    if (t.gathers == 0) return -1;
    const int64_t bytes = token_stream_bytes(m_, samples(layer), p_.dtype);
    int c = -1;
    for (int i = 0; i < t.gathers; ++i) {
      c = collective(Stream::tp_comm, Collective::all_gather, GroupKind::tp, s.tp, bytes, b, ph,
                     layer, mb, {last_compute_, reloaded_});
      compute_waits_.push_back(c);
    }
    return c;
  }
  // Returns the collective (-1 when none): in backward its completion finishes the block's
  // gradients (the norm's backward runs on the reduced input gradient).
  int tp_after(Block b, Phase ph, int layer, int mb) {
    const auto& s = strat(layer);
    const TpComm t = tp_comm(s, b, ph);
    if (t.after == Collective::none) return -1;
    const int64_t bytes = token_stream_bytes(m_, samples(layer), p_.dtype);
    int c = collective(Stream::tp_comm, t.after, GroupKind::tp, s.tp, bytes, b, ph, layer, mb,
                       {last_compute_});
    compute_waits_.push_back(c);
    return c;
  }

  // Samples move between ranks when consecutive layers hold the stream differently
  // (LayerStrategy::stream_tp: (tp, dp), sequence parallelism): when the replicas holding a
  // whole stream grow, their ranks all-gather; when they shrink, each takes a slice.
  void reshard(int from_layer, int to_layer, Phase ph, int mb) {
    if (reshard_gather_ranks(strat(from_layer), strat(to_layer)) == 0) return;
    const int a = strat(from_layer).stream_tp(), b = strat(to_layer).stream_tp();
    int64_t bytes = boundary(to_layer);
    int c = collective(Stream::tp_comm, Collective::all_gather, GroupKind::reshard, a, bytes,
                       Block::reshard, ph, to_layer, mb, {last_compute_}, b);
    compute_waits_.push_back(c);
  }

  // Parameters that are not resident (ZeRO-3 shards or host-offloaded) are fetched before use.
  // The next compute op waits for the fetch, or, with `wait_out`, whoever the caller hands the
  // returned op id to (a prefetch for a later layer).
  int fetch_params(int layer, Phase ph, int mb, int after, int* wait_out = nullptr) {
    return fetch(strat(layer), layer_params(layer), layer, ph, mb, after, wait_out);
  }
  // `params` parameters of strategy s (layer -1: embedding or LM head): returns their buffer,
  // or -1 when resident.
  int fetch(const LayerStrategy& s, int64_t params, int layer, Phase ph, int mb, int after,
            int* wait_out = nullptr) {
    const WeightFetch f = weight_fetch(s, params, p_.dtype);
    auto wait_for = [&](int op) {
      if (wait_out)
        *wait_out = op;
      else
        compute_waits_.push_back(op);
    };
    if (f.bytes == 0) return -1;
    // ZeRO-Infinity: the rank's shard lives in host memory; it crosses PCIe into its place in
    // the gather buffer before the (in-place) all-gather can start.
    const int buf = alloc(s.offload_params ? Stream::h2d : Stream::dp_comm, MemCategory::buffers,
                          f.bytes, layer, mb, ph, Block::none, {after});
    if (f.h2d_bytes > 0) {
      Op op = make(OpKind::copy_h2d, Stream::h2d, Block::none, ph, layer, mb);
      op.category = MemCategory::weights;
      op.bytes = f.h2d_bytes;
      after = emit(op, {after});
    }
    wait_for(f.gathers ? collective(Stream::dp_comm, Collective::all_gather, GroupKind::dp, s.tp,
                                    f.bytes, Block::none, ph, layer, mb, {after})
                       : after);
    return buf;
  }

  // ---- passes --------------------------------------------------------------------------
  void forward(int chunk, int mb) {
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
      prev_attn = compute(Block::attention, Phase::forward, l, mb, b, w.forward[0].flops,
                          w.forward[0].bytes);
      tp_after(Block::attention, Phase::forward, l, mb);

      int act_m = alloc(Stream::compute, MemCategory::activations, w.saved_bytes[1], l, mb,
                        Phase::forward, Block::mlp);
      tp_before(Block::mlp, Phase::forward, l, mb);
      int c = compute(Block::mlp, Phase::forward, l, mb, b, w.forward[1].flops, w.forward[1].bytes);
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
  std::tuple<int, int, int> reload(int l, int mb, int after) {
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

  void backward(int chunk, int mb) {
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
        compute(Block::attention, Phase::recompute, l, mb, b, w.forward[0].flops,
                w.forward[0].bytes);
        tp_after(Block::attention, Phase::recompute, l, mb);
        re_m = alloc(Stream::compute, MemCategory::activations, rebuilt(l, Block::mlp), l, mb,
                     Phase::recompute, Block::mlp);
        tp_before(Block::mlp, Phase::recompute, l, mb);
        compute(Block::mlp, Phase::recompute, l, mb, b, w.forward[1].flops, w.forward[1].bytes);
        tp_after(Block::mlp, Phase::recompute, l, mb);
      }
      stage_grads(l, mb);
      tp_before(Block::mlp, Phase::backward, l, mb);
      prev_mlp =
          compute(Block::mlp, Phase::backward, l, mb, b, w.backward[1].flops, w.backward[1].bytes);
      tp_after(Block::mlp, Phase::backward, l, mb);
      // Emitted before the mlp's buffers go, as the h2d stream runs it: it waits only for the
      // mlp's backward.
      if (l > r.begin && strat(l - 1).offload_activations)
        next_reload = reload(l - 1, mb, prev_mlp);
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
      int c = compute(Block::attention, Phase::backward, l, mb, b, w.backward[0].flops,
                      w.backward[0].bytes);
      // The layer's gradients are final once the attention's tp reduction has landed (its
      // norm's gradient is computed from the reduced input gradient).
      const int reduced = tp_after(Block::attention, Phase::backward, l, mb);
      release(act_a, Stream::compute);
      release(re_a, Stream::compute);
      release(fetched, Stream::compute);
      reloaded_ = -1;
      int ready = reduced >= 0 ? reduced : c;
      if (mb == last_bwd_mb_[chunk_] || per_microbatch(l)) ready = sp_replicated_reduce(l, ready);
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
  Op pp_transfer(OpKind kind, GroupKind peer, Phase ph, int layer, int mb) const {
    Op op = make(kind, Stream::pp_comm, Block::none, ph, layer, mb);
    op.group = peer;
    op.bytes = boundary(layer);
    op.chunk = static_cast<int16_t>(chunk_);
    return op;
  }

  // A send carries the block output: it waits for the compute and for the tensor-parallel
  // collective that completes that output (pending for the next compute op as well).
  void emit_send(Op op) {
    std::vector<int> deps = compute_waits_;
    deps.push_back(last_compute_);
    emit(op, deps);
  }

  // `after`: the compute before this pass, which the lookup's fetch follows.
  void embedding_forward(int mb, int after) {
    const auto& s = p_.embedding;
    // The lookup reads the word (and position) embeddings; their backward, a scatter-add of
    // the output gradient, does not, so only the forward fetches them.
    int fetched = fetch(s, embedding_parameters_per_rank(m_, s.tp), -1, Phase::forward, mb, after);
    compute(embedding_op(m_, samples(-1), Phase::forward, p_.dtype), -1, mb);
    release(fetched, Stream::compute);
    // Vocabulary-parallel lookup: partial rows are summed across the tp group.
    tp_after(Block::embedding, Phase::forward, -1, mb);
  }

  void embedding_backward(int mb) {
    stage_grads(-1, mb);
    // Under sequence parallelism the scatter-add needs the whole sequence's gradient.
    tp_before(Block::embedding, Phase::backward, -1, mb);
    int c = compute(embedding_op(m_, samples(-1), Phase::backward, p_.dtype), -1, mb);
    flush_staging_free();
    if (mb == last_bwd_mb_[chunk_]) c = tied_reduce(c);
    if (mb == last_bwd_mb_[chunk_] || per_microbatch(-1)) c = sp_replicated_reduce(-1, c);
    reduce_grads(-1, mb, c);
  }

  // ZeRO-2/3 reduce-scatter a layer's gradients every micro-batch: the sequence-parallel norms'
  // sum, which must precede that reduction, then runs every micro-batch too. (Not the tied
  // embeddings' sum: per micro-batch it would hold the last stage's in-order dp stream, and
  // the ZeRO-3 fetches queued behind it, until the first stage's backward of that micro-batch.)
  // Not the embedding's and head's under tied embeddings split over pipeline stages: their
  // gradients reach the shard only after the two stages' copies are summed, once per
  // iteration, so both stages stage them whole until then.
  bool per_microbatch(int layer) const {
    return grad_sync(strat(layer)).per_microbatch && !(layer < 0 && tied_split());
  }
  bool tied_split() const { return m_.tied_embeddings && p_.pp > 1; }

  // Tied word embeddings with pp > 1: the first and last stage sum their copies' gradients
  // once both are final, before the data-parallel reduction (which may shard them) and on the
  // dp stream, which no pipeline transfer waits for. Returns the op later reductions follow.
  int tied_reduce(int after) {
    if (p_.pp == 1 || !m_.tied_embeddings) return after;
    const int64_t bytes = tied_embedding_reduce_bytes(m_, p_.embedding.tp, p_.dtype);
    const int16_t chunk = static_cast<int16_t>(chunk_);
    int c = collective(Stream::dp_comm, Collective::all_reduce, GroupKind::tied_embedding, 1, bytes,
                       Block::embedding, Phase::backward, -1, -1, {after});
    out_.ops[c].chunk = chunk;
    return c;
  }

  // Norm parameters, replicated across a sequence-parallel tp group, saw one token shard each:
  // their gradients are summed over the group once final (Megatron-LM).
  int sp_replicated_reduce(int layer, int after) {
    const auto& s = strat(layer);
    if (s.tp == 1 || !s.sequence_parallel) return after;
    const int64_t n = layer >= 0 ? replicated_block_parameters(m_, Block::attention) +
                                       replicated_block_parameters(m_, Block::mlp)
                      : has_head() ? replicated_head_parameters(m_)
                                   : 0;
    if (n == 0) return after;
    return collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp, s.tp, n * e_,
                      Block::none, Phase::backward, layer, -1, {after});
  }

  // The head's weights, fetched after `after` (the last layer's attention, as a layer
  // prefetches its successor's).
  int fetch_head(int mb, int after) {
    const auto& s = p_.embedding;
    return fetch(s, head_compute_parameters_per_rank(m_, s.tp), -1, Phase::forward, mb, after);
  }

  // `fetched`: the buffer of the head's fetched weights (-1 when resident).
  void head(int mb, int fetched) {
    const auto& s = p_.embedding;
    const HeadOps h = head_ops(m_, s.tp, samples(-1), p_.dtype);
    // fp32 logits live from the forward to the backward of the loss.
    int buf = alloc(Stream::compute, MemCategory::activations, h.logits_bytes, -1, mb,
                    Phase::forward, Block::head);
    tp_before(Block::head, Phase::forward, -1, mb);
    compute(h.forward, -1, mb);
    if (s.tp > 1) {
      // Vocabulary-parallel cross entropy (Megatron-LM): the row maximum of the logits, then
      // the sum of exponentials and the target logit, per token.
      int c = collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp, s.tp,
                         h.loss_max_bytes, Block::head, Phase::forward, -1, mb, {last_compute_});
      c = collective(Stream::tp_comm, Collective::all_reduce, GroupKind::tp, s.tp, h.loss_sum_bytes,
                     Block::head, Phase::forward, -1, mb, {c});
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

  // Layer gradient staging (FrameworkSpec::layer_gradient_staging): under ZeRO-2/3 the
  // backward writes a layer's whole gradients (layer -1: the stage's embedding and head's)
  // into a buffer of their own, which the reduce-scatter reads into the shard. The buffer is
  // allocated at the layer's first backward op and goes on the dp stream once that reduction
  // has landed. The free is emitted after the next layer's mlp backward: the reduction of the
  // layer above runs beside it, so the two are live together while it runs.
  bool staged(int layer) const {
    return staged_gradient_bytes(strat(layer < 0 ? -1 : layer), 1, p_.dtype, staging_) > 0;
  }
  size_t stage_slot(int layer) const { return layer < 0 ? 0 : size_t(local_of_[layer]) + 1; }
  void stage_grads(int layer, int mb) {
    if (!staged(layer)) return;
    int& buf = stage_buf_[stage_slot(layer)];
    if (buf < 0) {
      const int64_t params = layer >= 0 ? layer_params(layer) : embed_params();
      buf = alloc(Stream::compute, MemCategory::grads, params * e_, layer < 0 ? -1 : layer, mb,
                  Phase::backward, Block::none);
    }
  }
  void flush_staging_free() {
    flush_piece();
    if (pending_free_ < 0) return;
    release(std::exchange(pending_free_, -1), Stream::dp_comm, {pending_reduce_});
  }

  // Data-parallel gradient reduction of a layer (layer -1: embedding, -2: untied head).
  void reduce_grads(int layer, int mb, int after) {
    const auto& s = strat(layer < 0 ? -1 : layer);
    if (s.dp == 1) return;
    const bool per_mb = per_microbatch(layer < 0 ? -1 : layer);
    if (!per_mb && mb != last_bwd_mb_[chunk_]) return;
    int64_t params = layer >= 0 ? layer_params(layer) : embed_params();
    Op op = make(OpKind::collective, Stream::dp_comm, Block::none, Phase::backward,
                 layer < 0 ? -1 : layer, mb);
    op.collective = grad_sync(s).reduce;
    op.group = GroupKind::dp;
    op.tp = static_cast<uint8_t>(s.tp);
    op.bytes = params * e_;
    op.chunk = static_cast<int16_t>(chunk_);
    if (p_.overlap_grad_reduce || per_mb) {
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
  int emit_reduction(Op op, const std::vector<int>& deps) {
    flush_piece();
    if (op.collective == Collective::reduce_scatter)
      op.buffer = alloc(Stream::dp_comm, MemCategory::buffers,
                        receive_piece_bytes(strat(op.layer), op.bytes / e_, p_.dtype), op.layer,
                        op.microbatch, op.phase, Block::none, deps);
    const int rs = emit(op, deps);
    if (op.buffer >= 0) pending_piece_ = {op.buffer, rs};
    return rs;
  }
  void flush_piece() {
    if (pending_piece_.first < 0) return;
    const auto [piece, rs] = std::exchange(pending_piece_, {-1, -1});
    release(piece, Stream::dp_comm, {rs});
  }

  // ---- whole-iteration parts -------------------------------------------------------------
  // Resident model states: weights, gradients and optimizer states, after ZeRO and offload.
  void setup() {
    for (int l : stage_layers()) states_.add(strat(l), layer_params(l), p_.dtype);
    if (embed_params() > 0) states_.add(p_.embedding, embed_params(), p_.dtype);
    static_bufs_[0] = alloc(Stream::compute, MemCategory::weights, states_.weights, -1, -1,
                            Phase::setup, Block::none);
    static_bufs_[1] = alloc(Stream::compute, MemCategory::grads, states_.grads, -1, -1,
                            Phase::setup, Block::none);
    static_bufs_[2] = alloc(Stream::compute, MemCategory::optimizer, states_.optimizer, -1, -1,
                            Phase::setup, Block::none);
  }

  void optimizer() {
    chunk_ = -1;
    std::vector<int> waits = grad_reductions_;
    waits.push_back(last_compute_);
    for (int w : waits) compute_waits_.push_back(w);
    // host_resident: updated in place where they live (offloaded parameters), nothing to copy
    // back to the device.
    const int64_t host_params = states_.host_opt_params;
    const int64_t host_resident = states_.host_resident_params;
    Op step = adamw_op(states_.device_opt_params, p_.dtype);
    step.chunk = static_cast<int16_t>(chunk_);
    int opt = emit(step, {});
    // The gathers of updated weights wait for the device update and for the host's, copied
    // back.
    int updated = opt;
    if (host_params > 0) {
      Op d2h = make(OpKind::copy_d2h, Stream::d2h, Block::optimizer, Phase::optimizer, -1, -1);
      d2h.category = MemCategory::grads;
      d2h.bytes = host_params * e_;
      int a = emit(d2h, waits);
      int b = emit(adamw_host_op(host_params, p_.dtype), {a});
      if (host_params > host_resident) {
        Op h2d = make(OpKind::copy_h2d, Stream::h2d, Block::optimizer, Phase::optimizer, -1, -1);
        h2d.category = MemCategory::weights;
        h2d.bytes = (host_params - host_resident) * e_;
        updated = emit(h2d, {b});
      } else {
        updated = b;
      }
      compute_waits_.push_back(updated);
    }
    // ZeRO-1/2: every rank updated a shard; gather the new weights.
    for (int l : stage_layers()) {
      const auto& s = strat(l);
      if (grad_sync(s).gather_after_step)
        compute_waits_.push_back(collective(Stream::dp_comm, Collective::all_gather, GroupKind::dp,
                                            s.tp, layer_params(l) * e_, Block::optimizer,
                                            Phase::optimizer, l, -1, {opt, updated}));
    }
    const auto& s = p_.embedding;
    if (embed_params() > 0 && grad_sync(s).gather_after_step)
      compute_waits_.push_back(collective(Stream::dp_comm, Collective::all_gather, GroupKind::dp,
                                          s.tp, embed_params() * e_, Block::optimizer,
                                          Phase::optimizer, -1, -1, {opt, updated}));
  }

  void teardown() {
    for (int b : static_bufs_) release(b, Stream::compute);
    if (live_count_ != 0) throw std::logic_error("program: buffers left allocated");
  }

  int64_t live_bytes(int buffer) const { return buffer < 0 ? 0 : out_.ops[live_.at(buffer)].bytes; }
  // Slot of (layer of this stage, micro-batch) in saved_ and offloaded_.
  size_t key(int layer, int mb) const { return size_t(local_of_[layer]) * M_ + mb; }

  const ModelSpec& m_;
  const Plan& p_;
  const int M_;
  const bool staging_;  // FrameworkSpec::layer_gradient_staging
  const int e_;
  const int nchunks_;
  const int stage_samples_;  // micro_batch * the plan's largest dp
  StageProgram out_;
  int chunk_ = -1;
  int last_compute_ = -1;
  int next_buffer_ = 0;
  int static_bufs_[3] = {-1, -1, -1};
  ModelStates states_;  // of the stage's layers, embedding and head (setup)
  int head_done_mb_ = -1;
  std::pair<int, int> pending_piece_{-1, -1};  // a reduce-scatter's piece and the reduction
  std::vector<int> compute_waits_;
  std::vector<int> grad_reductions_;
  std::vector<int> last_bwd_mb_;
  std::vector<Op> deferred_;
  // Flat tables in place of maps: ids and (layer, mb) slots are dense and known up front.
  std::vector<int> live_;  // [buffer id] its alloc op's index (-1 once released)
  int live_count_ = 0;
  std::vector<int> local_of_;    // [layer] its index among this stage's layers
  std::vector<LayerWork> work_;  // [layer]
  static constexpr std::pair<int, int> kNoSaved{-2, -2};
  std::vector<std::pair<int, int>> saved_;  // [key] the layer's saved activation buffers
  std::vector<int> offloaded_;              // [key] its activations' d2h copy (-1: none)
  // The copy that brought back the activations of the layer in backward: the sequence-parallel
  // gathers read them too, not only its compute.
  int reloaded_ = -1;
  // [stage_slot] the live staging buffer of a layer (slot 0: embedding and head), -1: none.
  std::vector<int> stage_buf_;
  // The staging buffer whose reduction was issued last, freed on the dp stream once it lands.
  int pending_free_ = -1, pending_reduce_ = -1;
};

}  // namespace

Program build_program(const ModelSpec& model, const Plan& plan, const FrameworkSpec& framework) {
  Program prog;
  prog.num_microbatches = plan.num_microbatches();
  prog.stages.reserve(plan.pp);
  size_t prev_layers = 0;
  for (int s = 0; s < plan.pp; ++s) {
    StageBuilder b(model, plan, s, prog.num_microbatches, framework.layer_gradient_staging);
    // Each stage reserves what the one before it took, scaled by its layer count, and a
    // sixteenth more (pipeline stages are much alike): a capacity only, the ops are the same.
    const size_t layers = b.stage_layer_count();
    if (s > 0 && prev_layers > 0) {
      const StageProgram& prev = prog.stages.back();
      auto scaled = [&](size_t n) {
        const size_t x = n / prev_layers * std::max<size_t>(layers, 1);
        return x + x / 16 + 64;
      };
      b.reserve(scaled(prev.ops.size()), scaled(prev.deps.size()));
    }
    prog.stages.push_back(b.build());
    prev_layers = layers;
  }
  return prog;
}

}  // namespace stratagem
