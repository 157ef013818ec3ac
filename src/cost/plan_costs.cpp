#include "src/cost/plan_costs.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "src/cost/layer_cost.hpp"
#include "src/cost/process_memory.hpp"
#include "stratagem/schedule.hpp"
#include "stratagem/workload_moe.hpp"

namespace stratagem::cost_detail {
namespace {

// Bytes at one moment beside the resident states, split by category (grad: staged ZeRO-2/3
// gradients).
struct Mem {
  int64_t act = 0, buf = 0, grad = 0;
  int64_t total() const { return act + buf + grad; }
};
void keep_max(Mem& best, Mem cand) {
  if (cand.total() > best.total()) best = cand;
}

// A gradient reduction of the last micro-batch: issued `tau` seconds of compute before the
// stage's last compute ends.
struct Reduce {
  double tau, cost;
  int chunk;
};

// Buffers reused from call to call, so that an estimate allocates nothing in steady use.
struct Scratch {
  // Per chunk of the stage: the kept activations of one micro-batch, its own bytes at the
  // forward's and the backward's worst moment, and its layers' backward time.
  std::vector<int64_t> chunk_kept_bytes;
  std::vector<int64_t> chunk_weight_held_bytes;  // split backward: held from B to W
  std::vector<Mem> chunk_fwd_peak, chunk_bwd_peak;
  std::vector<double> chunk_bwd_s;
  std::vector<Reduce> reduces;
  // Per layer: does it hold the strategy of the layer below it? (One comparison a layer, asked
  // by the cost cache and the memory walk.)
  std::vector<uint8_t> same_as_below;
};

class Analyzer {
 public:
  Analyzer(const CostModel& cost, const Plan& plan, bool with_time, bool reuse_stages,
           Scratch& scratch)
      : cost_(cost),
        model_(cost.model()),
        plan_(plan),
        with_time_(with_time),
        reuse_stages_(reuse_stages),
        staging_(cost.framework().layer_gradient_staging),
        chunk_kept_bytes_(scratch.chunk_kept_bytes),
        chunk_weight_held_bytes_(scratch.chunk_weight_held_bytes),
        chunk_fwd_peak_(scratch.chunk_fwd_peak),
        chunk_bwd_peak_(scratch.chunk_bwd_peak),
        chunk_bwd_s_(scratch.chunk_bwd_s),
        reduces_(scratch.reduces),
        same_as_below_(scratch.same_as_below) {
    geo_.gpus_per_node = std::max(1, cost.cluster().node.gpus_per_node);
    geo_.devices_per_stage = plan_.devices_per_stage();
    // Plan::max_dp() walks every layer: take it once, not once per layer.
    max_dp_ = plan_.max_dp();
    microbatch_count_ = plan_.global_batch / (plan_.micro_batch * max_dp_);
  }

  void run(std::vector<StageCost>& out) {
    const int pp = plan_.pp;
    const int nchunks = int(plan_.chunks.size());
    chunks_per_stage_ = std::max(1, nchunks / pp);
    shape_ = ScheduleShape::of(plan_, microbatch_count_);
    out.assign(pp, StageCost{});
    chunk_kept_bytes_.assign(chunks_per_stage_, 0);
    chunk_weight_held_bytes_.assign(chunks_per_stage_, 0);
    chunk_fwd_peak_.assign(chunks_per_stage_, Mem{});
    chunk_bwd_peak_.assign(chunks_per_stage_, Mem{});
    chunk_bwd_s_.assign(chunks_per_stage_, 0.0);
    const int nlayers = int(plan_.layers.size());
    same_as_below_.assign(nlayers, 0);
    for (int l = 1; l < nlayers; ++l) same_as_below_[l] = plan_.layers[l] == plan_.layers[l - 1];
    for (int s = 0; s < pp; ++s) {
      if (reuse_stages_ && repeats_stage_before(s)) {
        // Every figure but the schedule's in-flight activations is the stage before's.
        out[s] = out[s - 1];
        memory(s, last_walk_, out[s]);
        continue;
      }
      stage(s, out[s]);
    }
  }

 private:
  const LayerStrategy& strat(int layer) const {
    return layer < 0 ? plan_.embedding : plan_.layers[layer];
  }
  int samples_for(int dp) const { return plan_.micro_batch * max_dp_ / dp; }
  int samples(int layer) const { return samples_for(strat(layer).dp); }
  int64_t boundary(int layer) const {
    return boundary_activation_bytes(model_, strat(layer), samples(layer), plan_.dtype);
  }
  // A pipeline transfer's time (a one-entry cache: a plan's stages mostly send the same).
  double p2p_s(int64_t bytes, bool same_node) {
    if (bytes != p2p_bytes_ || same_node != p2p_same_node_) {
      p2p_bytes_ = bytes, p2p_same_node_ = same_node;
      p2p_time_s_ = cost_.fabric().p2p_cost(bytes, same_node).time_s();
    }
    return p2p_time_s_;
  }

  // One layer's parameters on a rank of tensor degree tp (a one-entry cache: asked where a
  // layer's neighbour has another strategy than its own, whose bytes its LayerCost holds).
  int64_t layer_params(int tp) {
    if (tp != params_tp_) {
      params_tp_ = tp;
      params_ = layer_parameters_per_rank(model_, tp);
    }
    return params_;
  }

  // Layer l's cost, of strategy s.
  const LayerCost& layer_cost(int l, const LayerStrategy& s, int tp_nodes, int dp_nodes,
                              const MoeNodes& moe, int cp_nodes = 1) {
    // One-entry cache: consecutive layers, and stages with the same placement, usually share
    // a strategy, so a uniform plan costs one layer. The layer above the cached one holds its
    // strategy where same_as_below says so, without comparing them again.
    const bool above_cached = l > 0 && cached_layer_ == l - 1 && same_as_below_[l];
    cached_layer_ = l;
    if (have_ && tp_nodes == cached_tp_nodes_ && dp_nodes == cached_dp_nodes_ &&
        cp_nodes == cached_cp_nodes_ && moe == cached_moe_ && (above_cached || s == cached_st_))
      return cached_;
    cached_ = cost_detail::layer_cost(cost_, plan_, s, samples_for(s.dp), tp_nodes, dp_nodes,
                                      with_time_, moe, cp_nodes);
    have_ = true;
    cached_cp_nodes_ = cp_nodes;
    cached_st_ = s;
    cached_tp_nodes_ = tp_nodes;
    cached_dp_nodes_ = dp_nodes;
    cached_moe_ = moe;
    return cached_;
  }

  // What a stage's walk carries from chunk to chunk, and its embedding and head.
  struct StageWalk {
    ModelStates states;
    int64_t workspace_bytes = 0;  // the runtime's scratch beside the Program's buffers
    double deferred = 0;          // reductions run after the last micro-batch (no overlap)
    EmbeddingHeadCost emb_head;
    EndStates end;
    int64_t ends_staged = 0;    // the embedding's and head's staged gradients
    int64_t always_staged = 0;  // ... held across the iteration (tied embeddings, pp > 1)
    // The piece the head's ZeRO-2/3 reduce-scatter receives, in flight beside the last layer's
    // mlp backward (a last stage that is not the first, untied). (A ZeRO-1 one, issued in the
    // last micro-batch only, lands within the head's own moment.)
    int64_t head_piece = 0;
    bool tied_split = false;
    StageCommunicators comms;  // the groups its ranks are members of (the NCCL ledger's)
  };
  // One chunk's walk over its layers, bottom up.
  struct ChunkWalk {
    int stage_chunk = 0, chunk = 0;  // the stage's chunk index and the global one
    LayerRange layers;
    int64_t prefix = 0;        // kept activations of the layers below
    int64_t below_fetch = 0;   // the layer below's weights, prefetched in this one's backward
    int64_t below_reload = 0;  // the layer below's offloaded activations coming back
    Mem fwd_peak, bwd_peak;    // the forward's and the backward's worst moments
    // A split backward: what the layers below hold from their B to their W, and the
    // backward's moments less what all the chunk's layers hold so (added at the chunk's end:
    // in a layer's B, the layers above it have run theirs).
    int64_t weight_held = 0;
    Mem bwd_less_held;
    double bwd_below = 0;  // backward time of the chunk's layers below the current one
  };

  void stage(int s, StageCost& sc) {
    // Group placement depends on where the stage starts within a node: stages that start at
    // the same offset (every stage, when a stage fills whole nodes) share it.
    const int64_t phase = (s * geo_.devices_per_stage) % geo_.gpus_per_node;
    if (phase != geo_phase_) geo_phase_ = phase, geo_tp_ = 0;
    reduces_.clear();
    StageWalk w = stage_ends(s);
    for (int i = 0; i < chunks_per_stage_; ++i) chunk(s, i, w, sc);
    if (w.comms.last) w.comms.hold(plan_.embedding, &plan_.layers.back());
    w.states += w.end.states;
    if (w.end.params > 0)
      w.workspace_bytes =
          std::max(w.workspace_bytes,
                   embedding_workspace_bytes(model_, plan_.embedding, samples(-1), plan_.dtype));
    if (with_time_) extras(s, w.emb_head, w.end, w.states, w.deferred, sc);
    last_walk_ = {w.states, w.workspace_bytes, w.comms};
    memory(s, last_walk_, sc);
  }

  // Does stage s repeat the stage before it? Both middle stages (no embedding, no head), the
  // same placement against node borders and pipeline neighbours on the same nodes or not, and
  // chunk by chunk the same layers (strategy and MoE or not), with the same layer below each
  // chunk (what it receives and reshards from). Then its walk would do the same arithmetic in
  // the same order: a uniform plan walks its layers on three stages, not pp.
  bool repeats_stage_before(int s) const {
    const int pp = plan_.pp;
    if (s < 2 || s > pp - 2) return false;
    const int64_t D = geo_.devices_per_stage, g = geo_.gpus_per_node;
    if ((s * D) % g != ((s - 1) * D) % g) return false;
    if (geo_.same_node(s, s + 1) != geo_.same_node(s - 1, s) ||
        geo_.same_node(s, s - 1) != geo_.same_node(s - 1, s - 2))
      return false;
    for (int i = 0; i < chunks_per_stage_; ++i) {
      const LayerRange a = plan_.chunks[i * pp + s - 1], b = plan_.chunks[i * pp + s];
      if (a.end - a.begin != b.end - b.begin) return false;
      for (int j = -1; j < b.end - b.begin; ++j) {
        const int la = a.begin + j, lb = b.begin + j;
        if (!(plan_.layers[la] == plan_.layers[lb]) ||
            model_.is_moe_layer(la) != model_.is_moe_layer(lb))
          return false;
      }
    }
    return true;
  }

  // The embedding and head of stage s. Staged gradients (Program::stage_grads): a layer's from
  // its backward until its reduce-scatter lands, when the layer below's is written (so two at a
  // time); the stage's embedding and head's likewise, but until the embedding's reduction at the
  // end of the pass when one stage holds both, and across the iteration when tied embeddings
  // are split over stages (their copies are summed once).
  StageWalk stage_ends(int s) const {
    const int pp = plan_.pp;
    const LayerStrategy& es = plan_.embedding;
    StageWalk w;
    w.comms.first = s == 0;
    w.comms.last = s == pp - 1;
    if (w.comms.first) w.comms.hold(es, nullptr);
    // Only the first and the last stage hold the embedding and the head.
    if (s == 0 || s == pp - 1)
      w.emb_head = embedding_head_cost(cost_, es, samples(-1), geo_.tp_nodes(s, es.tp),
                                       geo_.dp_nodes(s, es.tp), with_time_);
    w.end = end_states(cost_, es, s == 0, s == pp - 1, geo_, s, with_time_);
    w.ends_staged = staged_gradient_bytes(es, w.end.params, plan_.dtype, staging_);
    w.tied_split = model_.tied_embeddings && pp > 1;
    w.always_staged = w.tied_split ? w.ends_staged : 0;
    if (s == pp - 1 && s > 0 && !w.tied_split && grad_sync(es).per_microbatch)
      w.head_piece = receive_piece_bytes(es, w.end.params, plan_.dtype);
    return w;
  }
  // (An MoE layer's: the rest of the layer's over dp and its experts' over expert_dp.)
  int64_t staged(int l) {
    const LayerStrategy& st = plan_.layers[l];
    if (!model_.is_moe_layer(l))
      return staged_gradient_bytes(st, layer_params(st.tp), plan_.dtype, staging_);
    return staged_gradient_bytes(st, dp_parameters_per_rank(model_, st, l), plan_.dtype, staging_) +
           staged_gradient_bytes(expert_strategy(st), expert_dp_parameters_per_rank(model_, st, l),
                                 plan_.dtype, staging_);
  }
  // A reduce-scatter's received piece (a Program buffer while the reduction is in flight): of
  // the layer's last reduction (an MoE layer's experts' is issued first).
  int64_t piece(int l) {
    const LayerStrategy& st = plan_.layers[l];
    const int64_t params =
        model_.is_moe_layer(l) ? dp_parameters_per_rank(model_, st, l) : layer_params(st.tp);
    return receive_piece_bytes(st, params, plan_.dtype);
  }

  // Chunk i of stage s: its layers' memory moments and, with time, their costs.
  void chunk(int s, int i, StageWalk& w, StageCost& sc) {
    const int pp = plan_.pp, nchunks = int(plan_.chunks.size());
    ChunkWalk c;
    c.stage_chunk = i, c.chunk = i * pp + s, c.layers = plan_.chunks[c.chunk];
    const LayerRange r = c.layers;
    // The lookup's fetched weights, before any of the micro-batch's own activations.
    if (c.chunk == 0) keep_max(c.fwd_peak, {0, w.emb_head.emb_fetch.bytes, w.always_staged});
    // The embedding's backward: its gradients staged beside the first layer's in flight, and
    // that reduction's received piece.
    if (c.chunk == 0 && w.ends_staged > 0 && r.end > r.begin)
      keep_max(c.bwd_peak, {0, piece(r.begin), w.ends_staged + staged(r.begin)});
    for (int l = r.begin; l < r.end; ++l) {
      const LayerStrategy& st = plan_.layers[l];
      if (l == r.begin || !same_as_below_[l])
        w.comms.hold(st, l == 0 ? &plan_.embedding : &plan_.layers[l - 1]);
      if (st.tp != geo_tp_) {
        geo_tp_ = st.tp;
        tp_nodes_ = geo_.tp_nodes(s, st.tp);
        dp_nodes_ = geo_.dp_nodes(s, st.tp);
        cp_nodes_ = geo_.cp_nodes(s, st.tp, st.cp);  // one cp per plan (validate)
      }
      const LayerCost& lc = layer_cost(l, st, tp_nodes_, dp_nodes_,
                                       moe_nodes(geo_, s, st, model_.is_moe_layer(l)), cp_nodes_);
      layer_memory(l, lc, w, c);
      if (with_time_) layer_time(l, lc, w, c, sc);
    }
    // The last layer's output reshards to the LM head's (tp, dp) in forward, the loss's
    // gradient back in backward (Program::reshard), as between layers.
    if (with_time_ && c.chunk == nchunks - 1 && r.end > r.begin) {
      const ReshardCost rs = reshard_cost(cost_, plan_.layers[r.end - 1], samples(r.end - 1),
                                          plan_.embedding, samples(-1));
      sc.tp_s += rs.fwd_s;
      sc.tp_s += rs.bwd_s;
      sc.tp_bwd_s += rs.bwd_s;
    }
    // fp32 logits live between the loss's forward and backward (Program::head), beside
    // the head's fetched weights.
    // The head's backward stages its gradients before the logits go.
    if (c.chunk == nchunks - 1)
      keep_max(c.fwd_peak, {c.prefix + w.emb_head.logits_bytes + w.emb_head.loss_transient_bytes,
                            w.emb_head.head_fetch.bytes, w.ends_staged});
    if (shape_.split() && r.end > r.begin) {
      c.bwd_less_held.act += c.weight_held;
      keep_max(c.bwd_peak, c.bwd_less_held);
    }
    chunk_kept_bytes_[i] = c.prefix;
    chunk_weight_held_bytes_[i] = c.weight_held;
    chunk_fwd_peak_[i] = c.fwd_peak;
    chunk_bwd_peak_[i] = c.bwd_peak;
    chunk_bwd_s_[i] = c.bwd_below;
    if (with_time_) {
      // Pipeline sends: activations to the next chunk, gradients to the previous one.
      if (c.chunk < nchunks - 1)
        sc.p2p_fwd_s += p2p_s(boundary(r.end - 1), geo_.same_node(s, (s + 1) % pp));
      if (c.chunk > 0)
        sc.p2p_bwd_s += p2p_s(boundary(r.begin - 1), geo_.same_node(s, (s + pp - 1) % pp));
    }
  }

  // Layer l's bytes at its forward's and backward's worst moments, and what it keeps.
  void layer_memory(int l, const LayerCost& lc, StageWalk& w, ChunkWalk& c) {
    const int pp = plan_.pp, nchunks = int(plan_.chunks.size());
    const LayerStrategy& st = plan_.layers[l];
    const LayerRange r = c.layers;
    // Beside a pipeline, a send and a receive of the stream in flight.
    w.workspace_bytes = std::max(w.workspace_bytes, pp > 1 ? lc.pipelined_workspace : lc.workspace);
    keep_max(c.fwd_peak,
             {c.prefix + lc.fwd_act, lc.fwd_buf + lc.expert_fetch_bytes, w.always_staged});
    // Staged in this layer's backward: its own, the stage's embedding and head's while they
    // are held (through the pass when one stage holds both), and during its mlp backward
    // the reduction in flight before it: the layer above's, or atop the last chunk of a
    // later stage the head's.
    const int64_t held = c.chunk == nchunks - 1 && pp == 1 ? w.ends_staged : w.always_staged;
    // (Runs of layers share a strategy: the layer above's bytes are this one's then.)
    const bool above_same = l + 1 < r.end && same_as_below_[l + 1];
    const int64_t above = above_same                                          ? lc.staged_bytes
                          : l + 1 < r.end                                     ? staged(l + 1)
                          : c.chunk == nchunks - 1 && pp > 1 && !w.tied_split ? w.ends_staged
                                                                              : 0;
    // ... and the piece that reduction receives (atop the last chunk, the head's).
    const int64_t above_piece = above_same               ? lc.piece_bytes
                                : l + 1 < r.end          ? piece(l + 1)
                                : c.chunk == nchunks - 1 ? w.head_piece
                                                         : 0;
    // The layer below (same chunk) is prefetched during this layer's attention backward;
    // its offloaded activations come back as soon as this layer's mlp backward has run.
    const bool split = shape_.split();
    Mem& bwd = split ? c.bwd_less_held : c.bwd_peak;
    c.weight_held += lc.weight_held_bytes;
    const int64_t prefix = c.prefix - (split ? c.weight_held : 0);
    keep_max(bwd,
             {prefix + lc.bwd_mlp_act + c.below_reload,
              lc.bwd_buf + lc.expert_fetch_bytes + above_piece, lc.staged_bytes + held + above});
    keep_max(bwd, {prefix + lc.bwd_attn_act + c.below_reload, lc.bwd_buf + c.below_fetch,
                   lc.staged_bytes + held});
    // An MoE layer's experts' reduce-scatter is issued once the layer's activations are gone,
    // with the piece it receives.
    if (lc.expert_piece_bytes > 0)
      keep_max(bwd, {prefix + c.below_reload, c.below_fetch + lc.expert_piece_bytes,
                     lc.staged_bytes + held});
    if (plan_.backward_prefetch) c.below_fetch = lc.fwd_buf;
    c.below_reload = st.offload_activations ? lc.fwd_act : 0;
    c.prefix += lc.kept;
    w.states += lc.states;
  }

  // Layer l's time per micro-batch on each stream, and its gradient reductions.
  void layer_time(int l, const LayerCost& lc, StageWalk& w, ChunkWalk& c, StageCost& sc) {
    const LayerStrategy& st = plan_.layers[l];
    const LayerRange r = c.layers;
    sc.fwd_s += lc.fwd_s;
    sc.bwd_s += lc.bwd_s;
    sc.weight_grad_s += lc.weight_grad_s;
    sc.rec_s += lc.rec_s;
    sc.host_issue_s += cost_.host_issue_layer_s(st);
    double tp = lc.tp_fwd_s + lc.tp_bwd_s + lc.tp_rec_s;
    double tp_bwd = lc.tp_bwd_s + lc.tp_rec_s;
    // Samples move between ranks where the stream's holding changes (Program::reshard).
    if (strat(l - 1).stream_tp() != st.stream_tp()) {
      const ReshardCost rs = reshard_cost(cost_, strat(l - 1), samples(l - 1), st, samples(l));
      tp += rs.fwd_s;
      tp += rs.bwd_s;
      tp_bwd += rs.bwd_s;
    }
    sc.tp_s += tp;
    sc.tp_bwd_s += tp_bwd;
    const double ep_bwd = lc.ep_bwd_s + lc.ep_rec_s;
    sc.ep_s += lc.ep_fwd_s + ep_bwd;
    sc.ep_bwd_s += ep_bwd;
    if (st.cp > 1) {
      sc.cp_s += lc.cp_fwd_s + lc.cp_bwd_s + lc.cp_rec_s;
      sc.cp_bwd_s += lc.cp_bwd_s + lc.cp_rec_s;
    }
    (lc.fetch_on_h2d ? sc.h2d_stream_s : sc.dp_stream_s) += 2 * lc.fetch_s;
    sc.dp_stream_s += lc.grad_rs_mb_s;
    sc.h2d_stream_s += lc.act_h2d_s;
    sc.d2h_stream_s += lc.act_d2h_s;
    // Nothing precedes the first forward fetch and the first backward fetch of a pass.
    if (l == r.begin) sc.first_fetch_s += lc.fetch_s;
    if (l == r.end - 1) sc.first_fetch_s += lc.fetch_s + lc.act_h2d_s;
    // Without backward prefetch a layer's fetch waits on the in-order dp stream behind the
    // reduce-scatter of the layer above, and compute waits for both.
    else if (!plan_.backward_prefetch && lc.fetch_s > 0 && !lc.fetch_on_h2d)
      sc.first_fetch_s += lc.fetch_s + lc.grad_rs_mb_s;
    if (lc.grad_rs_mb_s > 0) reduces_.push_back({c.bwd_below, lc.grad_rs_mb_s, c.stage_chunk});
    if (lc.grad_reduce_s > 0) {
      if (plan_.overlap_grad_reduce)
        reduces_.push_back({c.bwd_below, lc.grad_reduce_s, c.stage_chunk});
      else
        w.deferred += lc.grad_reduce_s;
    }
    sc.gather_s += lc.gather_s;
    c.bwd_below += lc.bwd_s + lc.rec_s + tp_bwd + ep_bwd;
  }

  // What memory() reads of a stage's walk.
  struct WalkTotals {
    ModelStates states;
    int64_t workspace_bytes = 0;
    StageCommunicators comms;
  };
  // The stage's memory breakdown: its model states and its schedule's peak.
  void memory(int s, const WalkTotals& w, StageCost& sc) {
    const Mem peak = schedule_peak(s);
    MemoryBreakdown& mb = sc.memory;
    const int64_t ws = w.workspace_bytes;
    const int64_t wb = w.states.weights, g = w.states.grads, o = w.states.optimizer;
    mb.weights_bytes = wb;
    mb.grads_bytes = g + peak.grad;
    mb.optimizer_bytes = o;
    mb.activations_bytes = peak.act;
    mb.buffers_bytes = peak.buf + ws;
    mb.set_process(stage_process(s, w.comms), cost_.cluster().gpu.allocator_fragmentation);
    sc.workspace_bytes = ws;
  }

  // Embedding/head work, the end-of-iteration reductions and the optimizer step of stage s.
  void extras(int s, const EmbeddingHeadCost& x, const EndStates& end, const ModelStates& states,
              double deferred, StageCost& sc) {
    const int pp = plan_.pp;
    const LayerStrategy& es = plan_.embedding;
    auto fetch = [&](const FetchCost& f, bool first_of_pass) {
      (f.on_h2d ? sc.h2d_stream_s : sc.dp_stream_s) += f.time_s;
      if (first_of_pass) sc.first_fetch_s += f.time_s;
    };
    double emb_bwd = 0;
    if (s == 0) {
      sc.fwd_s += x.emb_fwd_s;
      emb_bwd = x.emb_bwd_s;
      sc.bwd_s += emb_bwd;
      sc.tp_s += x.emb_tp_s;
      fetch(x.emb_fetch, true);  // nothing precedes the lookup in a pass
    }
    if (s == pp - 1) {
      sc.fwd_s += x.head_fwd_s;
      sc.bwd_s += x.head_bwd_s;
      sc.tp_s += x.head_tp_s;
      sc.tp_bwd_s += x.head_tp_bwd_s;
      fetch(x.head_fetch, false);  // prefetched behind the last layer
    }
    // Embedding gradients: reduced after the embedding backward (stage 0, the very end) or
    // after the loss backward (last stage, before its final backward passes).
    double total_bwd = 0;
    for (int i = 0; i < chunks_per_stage_; ++i) total_bwd += chunk_bwd_s_[i];
    if (end.params > 0 && es.dp_cp() > 1) {
      const GradSyncCost& sync = end.sync;
      const double tau = s == 0 ? 0.0 : total_bwd;
      if (sync.per_microbatch) {
        sc.dp_stream_s += sync.reduce_s;
        reduces_.push_back({tau, sync.reduce_s, -1});
      } else if (plan_.overlap_grad_reduce) {
        reduces_.push_back({tau, sync.reduce_s, -1});
      } else {
        deferred += sync.reduce_s;
      }
      sc.gather_s += sync.gather_s;
    }
    // Chunk i's last backward pass is followed by i*pp passes of the stage's lower chunks
    // (interleaved cool-down); chunk 0 on stage 0 is followed by the embedding backward.
    const double pass = total_bwd / chunks_per_stage_;
    for (Reduce& r : reduces_) {
      if (r.chunk < 0) continue;
      r.tau += r.chunk * pp * pass + (s == 0 ? emb_bwd : 0);
    }
    // The dp stream runs the reductions one after another in issue order (largest tau
    // first). They were recorded in nearly ascending order.
    auto later = [](const Reduce& a, const Reduce& b) { return a.tau > b.tau; };
    std::reverse(reduces_.begin(), reduces_.end());
    if (!std::is_sorted(reduces_.begin(), reduces_.end(), later))
      std::sort(reduces_.begin(), reduces_.end(), later);
    double t = -1e300;
    for (const Reduce& r : reduces_) t = std::max(t, -r.tau) + r.cost;
    t = std::max(t, 0.0) + deferred;
    if (s == 0 || s == pp - 1) t += tied_embedding_reduce_s(cost_, es.tp, pp, geo_);
    sc.reduce_exposed_s = std::max(0.0, t);
    // AdamW step, as the Program's optimizer(): device part and offloaded (host) part. The
    // device op runs even with every optimizer state offloaded: it takes the gradient norm, clips
    // and hands the step to the host (the runtime's optimizer_step), one launch at least.
    sc.optimizer_s = optimizer_step_s(cost_, states.device_opt_params);
    if (states.host_opt_params > 0)
      sc.host_s = host_optimizer_step_s(cost_, states.host_opt_params, states.host_resident_params);
  }

  // The GPU process ledger of stage s: the previous stage's where both hold the same
  // communicators on the same node placement (a one-entry cache: a uniform plan's middle stages
  // are alike).
  const ProcessMemory& stage_process(int s, const StageCommunicators& comms) {
    const bool aligned = geo_.devices_per_stage % geo_.gpus_per_node == 0;
    if (!(have_process_ && aligned && comms == process_comms_))
      process_ = cost_detail::process_memory(model_, cost_.cluster(), plan_, comms, s);
    process_comms_ = comms;
    have_process_ = true;
    return process_;
  }

  // Peak of activations + buffers over the stage's schedule: the in-flight micro-batches'
  // kept activations plus the running pass's own bytes.
  Mem schedule_peak(int s) const {
    if (shape_.split()) return split_schedule_peak(s);
    const int in_flight = shape_.passes_in_flight(s);
    bool same = true;
    for (int i = 1; i < chunks_per_stage_; ++i)
      same = same && chunk_kept_bytes_[i] == chunk_kept_bytes_[0] &&
             chunk_fwd_peak_[i].act == chunk_fwd_peak_[0].act &&
             chunk_fwd_peak_[i].buf == chunk_fwd_peak_[0].buf &&
             chunk_fwd_peak_[i].grad == chunk_fwd_peak_[0].grad &&
             chunk_bwd_peak_[i].act == chunk_bwd_peak_[0].act &&
             chunk_bwd_peak_[i].buf == chunk_bwd_peak_[0].buf &&
             chunk_bwd_peak_[i].grad == chunk_bwd_peak_[0].grad;
    if (same) {
      Mem best = chunk_fwd_peak_[0];
      keep_max(best, chunk_bwd_peak_[0]);
      best.act += int64_t(std::max(0, in_flight - 1)) * chunk_kept_bytes_[0];
      return best;
    }
    // Chunks of different sizes: step through the warm-up and one period (group x v pairs) of
    // the steady state, which then repeats (all of it where the last group is partial); the
    // cool-down only frees.
    const int total = shape_.chunk_passes(), period = shape_.period();
    const int W = shape_.warmup_forwards(s);
    int64_t alive = 0;
    Mem best;
    auto fwd = [&](int k) {
      const int c = shape_.forward_chunk(k);
      keep_max(best,
               {alive + chunk_fwd_peak_[c].act, chunk_fwd_peak_[c].buf, chunk_fwd_peak_[c].grad});
      alive += chunk_kept_bytes_[c];
    };
    auto bwd = [&](int k) {
      const int c = shape_.backward_chunk(k);
      keep_max(best, {alive - chunk_kept_bytes_[c] + chunk_bwd_peak_[c].act, chunk_bwd_peak_[c].buf,
                      chunk_bwd_peak_[c].grad});
      alive -= chunk_kept_bytes_[c];
    };
    int f = 0, b = 0;
    for (; f < W; ++f) fwd(f);
    const int steady = total - W;
    const bool repeats = shape_.whole_groups();
    for (int i = 0; i < (repeats ? std::min(steady, period + 1) : steady); ++i) fwd(f++), bwd(b++);
    if (steady == 0)
      for (int i = 0; i < (repeats ? std::min(total, period) : total); ++i) bwd(b++);
    return best;
  }

  // The zero-bubble schedules (one chunk a stage): before forward k the stage holds the kept
  // activations of the forwards whose B has not run, min(k, w0) of them (w0: its warm-up), and
  // what the deferred W read, one set per B whose W has not run, min(k - w0, held); before
  // backward b, min(w0, m - 1 - b) and min(b, held). Each count is concave in its pass index,
  // so their sum peaks where one of them bends.
  Mem split_schedule_peak(int s) const {
    const int m = shape_.chunk_passes(), held = shape_.deferred_weights(s);
    const int w0 = std::min(shape_.warmup_forwards(s), m - 1);
    const int64_t kept = chunk_kept_bytes_[0], weights = chunk_weight_held_bytes_[0];
    Mem best = chunk_fwd_peak_[0];
    best.act += w0 * kept + std::clamp(m - 1 - w0, 0, held) * weights;
    for (int b : {0, held, m - 1 - w0, m - 1}) {
      b = std::clamp(b, 0, m - 1);
      Mem at = chunk_bwd_peak_[0];
      at.act += std::min(w0, m - 1 - b) * kept + std::min(b, held) * weights;
      keep_max(best, at);
    }
    return best;
  }

  const CostModel& cost_;
  const ModelSpec& model_;
  const Plan& plan_;
  const bool with_time_;
  const bool reuse_stages_;
  const bool staging_;  // FrameworkSpec::layer_gradient_staging
  Geometry geo_;
  int max_dp_ = 1, microbatch_count_ = 1, chunks_per_stage_ = 1;
  ScheduleShape shape_;
  int geo_tp_ = 0, tp_nodes_ = 1, dp_nodes_ = 1, cp_nodes_ = 1;
  int64_t geo_phase_ = -1;
  int64_t p2p_bytes_ = -1;
  bool p2p_same_node_ = false;
  double p2p_time_s_ = 0;
  std::vector<int64_t>& chunk_kept_bytes_;
  std::vector<int64_t>& chunk_weight_held_bytes_;
  std::vector<Mem>& chunk_fwd_peak_;
  std::vector<Mem>& chunk_bwd_peak_;
  std::vector<double>& chunk_bwd_s_;
  std::vector<Reduce>& reduces_;
  std::vector<uint8_t>& same_as_below_;

  bool have_ = false;
  int params_tp_ = 0;
  int64_t params_ = 0;
  LayerStrategy cached_st_;
  int cached_layer_ = -1;
  int cached_tp_nodes_ = 0, cached_dp_nodes_ = 0, cached_cp_nodes_ = 0;
  MoeNodes cached_moe_;
  LayerCost cached_;

  WalkTotals last_walk_;  // the last stage walked's, for the stages that repeat it
  bool have_process_ = false;
  StageCommunicators process_comms_;
  ProcessMemory process_;
};

}  // namespace

void analyze(const CostModel& cost, const Plan& plan, bool with_time, std::vector<StageCost>& out,
             bool reuse_stages) {
  // The closed form prices the plan's tensors in the cost model's precision.
  if (plan.dtype != cost.dtype())
    throw std::logic_error(std::string("analyze: a plan in ") + to_string(plan.dtype) +
                           " priced by a cost model in " + to_string(cost.dtype()));
  thread_local Scratch scratch;
  Analyzer(cost, plan, with_time, reuse_stages, scratch).run(out);
}

}  // namespace stratagem::cost_detail
