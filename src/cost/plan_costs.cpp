#include "src/cost/plan_costs.hpp"

#include <algorithm>

namespace stratagem::cost_detail {
namespace {

// Per-rank figures of one Transformer layer for one micro-batch.
struct LayerCost {
  double fwd_s = 0, bwd_s = 0, rec_s = 0;           // kernels
  double tp_fwd_s = 0, tp_bwd_s = 0, tp_rec_s = 0;  // compute waits for these
  double fetch_s = 0;  // one fetch of the weights: ZeRO-3 all-gather (dp) or h2d copy
  bool fetch_on_h2d = false;
  double grad_rs_mb_s = 0;   // ZeRO-2/3 reduce-scatter after every micro-batch
  double grad_reduce_s = 0;  // ZeRO-0/1 all-reduce / reduce-scatter after the last one
  double gather_s = 0;       // ZeRO-1/2 all-gather after the step
  double act_d2h_s = 0, act_h2d_s = 0;
  int64_t weights = 0, grads = 0, optimizer = 0;
  int64_t device_opt_params = 0, host_opt_params = 0;
  int64_t kept = 0;                  // saved activations resident until backward
  int64_t fwd_act = 0, fwd_buf = 0;  // this layer's bytes at its forward's worst moment
  int64_t bwd_act = 0, bwd_buf = 0;  // ... and at its backward's worst moment
};

// Where a stage's ranks sit: stage s holds ranks s*D .. s*D+D-1, gpus_per_node to a node.
struct Geometry {
  int64_t g = 1, D = 1;
  int span(int64_t first, int64_t count) const {
    return int((first + count - 1) / g - first / g + 1);
  }
  // Nodes of the worst tensor group of degree tp on stage s.
  int tp_nodes(int s, int tp) const {
    const int64_t dp = D / tp;
    int worst = 1;
    for (int64_t k = 0; k < std::min<int64_t>(dp, g); ++k)
      worst = std::max(worst, span(s * D + k * tp, tp));
    return worst;
  }
  // Nodes of the worst data-parallel group (a stride tp <= gpus_per_node skips no node).
  int dp_nodes(int s, int tp) const {
    const int64_t dp = D / tp;
    int worst = 1;
    for (int64_t j : {int64_t(0), int64_t(tp - 1)}) {
      const int64_t first = s * D + j;
      worst = std::max(worst, int((first + (dp - 1) * tp) / g - first / g + 1));
    }
    return worst;
  }
  // Do the ranks of stages s and t with the same local index share nodes?
  bool same_node(int s, int t) const {
    return (s * D) / g == (t * D) / g && (s * D + D - 1) / g == (t * D + D - 1) / g;
  }
};

// Activation bytes at one moment, split by category.
struct Mem {
  int64_t act = 0, buf = 0;
  int64_t total() const { return act + buf; }
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
  std::vector<int64_t> A;     // per chunk of the stage: kept activations of one micro-batch
  std::vector<Mem> fpk, bpk;  // per chunk: own bytes at the forward's / backward's worst moment
  std::vector<double> chunk_bwd;
  std::vector<Reduce> reduces;
};

class Analyzer {
 public:
  Analyzer(const CostModel& cost, bool with_time, Scratch& scratch)
      : c_(cost),
        m_(cost.model()),
        p_(cost.plan()),
        with_time_(with_time),
        e_(dtype_bytes(p_.dtype)),
        opt_bpp_(p_.dtype == Dtype::fp32 ? 8 : 12),
        A_(scratch.A),
        fpk_(scratch.fpk),
        bpk_(scratch.bpk),
        chunk_bwd_(scratch.chunk_bwd),
        reduces_(scratch.reduces) {
    geo_.g = std::max(1, cost.cluster().node.gpus_per_node);
    geo_.D = p_.devices_per_stage();
    // Plan::max_dp() walks every layer: take it once, not once per layer.
    max_dp_ = p_.max_dp();
    M_ = p_.global_batch / (p_.micro_batch * max_dp_);
  }

  void run(std::vector<StageCost>& out) {
    const int pp = p_.pp;
    const int nchunks = int(p_.chunks.size());
    v_ = std::max(1, nchunks / pp);
    out.assign(pp, StageCost{});
    A_.assign(v_, 0);
    fpk_.assign(v_, Mem{});
    bpk_.assign(v_, Mem{});
    chunk_bwd_.assign(v_, 0.0);
    for (int s = 0; s < pp; ++s) stage(s, out[s]);
  }

 private:
  const LayerStrategy& strat(int layer) const {
    return layer < 0 ? p_.embedding : p_.layers[layer];
  }
  int samples_for(int dp) const { return p_.micro_batch * max_dp_ / dp; }
  int samples(int layer) const { return samples_for(strat(layer).dp); }
  int64_t boundary(int layer) const {
    return boundary_activation_bytes(m_, strat(layer), samples(layer), p_.dtype);
  }
  double coll(Collective k, int64_t bytes, int size, int nodes) const {
    return c_.collective_cost(k, bytes, size, nodes).time_s();
  }

  // Model states of `params` parameters under a strategy (as the Program's setup()).
  void add_states(const LayerStrategy& s, int64_t params, int64_t& w, int64_t& g, int64_t& o,
                  int64_t& dev, int64_t& host) const {
    const int64_t shard = (params + s.dp - 1) / s.dp;
    w += s.offload_params ? 0 : (s.zero == 3 ? shard : params) * e_;
    g += (s.zero >= 2 ? shard : params) * e_;
    const int64_t n = s.zero >= 1 ? shard : params;
    o += s.offload_optimizer ? 0 : n * opt_bpp_;
    (s.offload_optimizer ? host : dev) += n;
  }

  // Embedding (+ LM head) parameters of a stage, as the Program's embed_params().
  int64_t embed_params(int s) const {
    const bool first = s == 0, last = s == p_.pp - 1;
    int64_t n = 0;
    if (first) n += embedding_parameters_per_rank(m_, p_.embedding.tp);
    if (last) n += head_parameters_per_rank(m_, p_.embedding.tp);
    if (last && !first && m_.tied_embeddings) n += int64_t(m_.vocab) * m_.hidden / p_.embedding.tp;
    return n;
  }

  const LayerCost& layer_cost(const LayerStrategy& s, int tp_nodes, int dp_nodes) {
    // One-entry cache: consecutive layers, and stages with the same placement, usually share
    // a strategy, so a uniform plan costs one layer.
    if (have_ && tp_nodes == cached_tp_nodes_ && dp_nodes == cached_dp_nodes_ && s == cached_st_)
      return cached_;
    LayerCost lc;
    const int b = samples_for(s.dp);
    const bool flash = p_.flash_attention;
    const int64_t params = block_parameters_per_rank(m_, s.tp, Block::attention) +
                           block_parameters_per_rank(m_, s.tp, Block::mlp);
    add_states(s, params, lc.weights, lc.grads, lc.optimizer, lc.device_opt_params,
               lc.host_opt_params);
    // Activations, tensor by tensor as the Program allocates them.
    auto saved = [&](Block blk, Recompute rc, bool fl) {
      return saved_activation_bytes(m_, s, blk, b, rc, fl, p_.dtype);
    };
    const int64_t sa = saved(Block::attention, s.recompute, flash);
    const int64_t sm = saved(Block::mlp, s.recompute, flash);
    const bool fetches = (s.zero == 3 && s.dp > 1) || s.offload_params;
    const int64_t fetch_bytes = fetches ? params * e_ : 0;
    lc.kept = s.offload_activations ? 0 : sa + sm;
    lc.fwd_act = sa + sm;
    lc.fwd_buf = fetch_bytes;
    // Backward of the layer: the mlp backward runs with both blocks' saved tensors (and full
    // recompute's rebuilt ones); the attention backward with the attention's only.
    int64_t during_mlp = sa + sm, during_attn = sa;
    if (s.recompute == Recompute::full) {
      const int64_t re_a = saved(Block::attention, Recompute::none, flash) - sa;
      during_mlp += re_a + saved(Block::mlp, Recompute::none, flash);
      during_attn += re_a;
    } else if (s.recompute == Recompute::selective && !flash) {
      during_attn += saved(Block::attention, Recompute::none, false) - sa;  // probabilities
    }
    lc.bwd_act = std::max(during_mlp, during_attn);
    lc.bwd_buf = fetch_bytes;

    if (with_time_) {
      lc.fwd_s = c_.block_time_s(forward_work(m_, s, Block::attention, b, flash)) +
                 c_.block_time_s(forward_work(m_, s, Block::mlp, b, flash));
      lc.bwd_s = c_.block_time_s(backward_work(m_, s, Block::attention, b, flash)) +
                 c_.block_time_s(backward_work(m_, s, Block::mlp, b, flash));
      if (s.recompute == Recompute::full) {
        lc.rec_s = lc.fwd_s;
      } else if (s.recompute == Recompute::selective && !flash) {
        BlockWork core = attention_core_work(m_, s, b, false);
        core.attention_flops /= 2;  // QK^T only: AV's output is saved as the projection input
        lc.rec_s = c_.block_time_s(core);
      }
      if (s.tp > 1) {
        const int64_t msg = int64_t(e_) * b * m_.seq_len * m_.hidden;
        const double per_block = s.sequence_parallel
                                     ? coll(Collective::all_gather, msg, s.tp, tp_nodes) +
                                           coll(Collective::reduce_scatter, msg, s.tp, tp_nodes)
                                     : coll(Collective::all_reduce, msg, s.tp, tp_nodes);
        lc.tp_fwd_s = lc.tp_bwd_s = 2 * per_block;
        lc.tp_rec_s = s.recompute == Recompute::full ? 2 * per_block : 0;
      }
      const int64_t pbytes = params * e_;
      if (s.dp > 1) {
        if (s.zero == 3) lc.fetch_s = coll(Collective::all_gather, pbytes, s.dp, dp_nodes);
        // ZeRO-3 with offloaded parameters: the shard crosses PCIe before each gather.
        if (s.zero == 3 && s.offload_params)
          lc.fetch_s += c_.copy_cost((pbytes + s.dp - 1) / s.dp).time_s();
        if (s.zero >= 2) lc.grad_rs_mb_s = coll(Collective::reduce_scatter, pbytes, s.dp, dp_nodes);
        if (s.zero == 0) lc.grad_reduce_s = coll(Collective::all_reduce, pbytes, s.dp, dp_nodes);
        if (s.zero == 1)
          lc.grad_reduce_s = coll(Collective::reduce_scatter, pbytes, s.dp, dp_nodes);
        if (s.zero == 1 || s.zero == 2)
          lc.gather_s = coll(Collective::all_gather, pbytes, s.dp, dp_nodes);
      }
      if (s.offload_params && !(s.zero == 3 && s.dp > 1)) {
        lc.fetch_s = c_.copy_cost(pbytes).time_s();
        lc.fetch_on_h2d = true;
      }
      if (s.offload_activations) {
        lc.act_d2h_s = c_.copy_cost(sa + sm).time_s();
        lc.act_h2d_s = lc.act_d2h_s;
      }
    }
    have_ = true;
    cached_st_ = s;
    cached_tp_nodes_ = tp_nodes;
    cached_dp_nodes_ = dp_nodes;
    cached_ = lc;
    return cached_;
  }

  void stage(int s, StageCost& sc) {
    const int pp = p_.pp;
    geo_tp_ = 0;  // group placement depends on the stage
    const int nchunks = int(p_.chunks.size());
    int64_t w = 0, g = 0, o = 0, dev = 0, host = 0;
    int max_samples = samples(-1);
    reduces_.clear();
    double deferred = 0;  // reductions run after the last micro-batch (no overlap)
    const bool overlap = p_.overlap_grad_reduce;
    for (int i = 0; i < v_; ++i) {
      const int ch = i * pp + s;
      const LayerRange r = p_.chunks[ch];
      int64_t prefix = 0;
      Mem fp, bp;
      double bwd_below = 0;  // backward time of the chunk's layers below the current one
      for (int l = r.begin; l < r.end; ++l) {
        const LayerStrategy& st = p_.layers[l];
        if (st.tp != geo_tp_) {
          geo_tp_ = st.tp;
          tp_nodes_ = geo_.tp_nodes(s, st.tp);
          dp_nodes_ = geo_.dp_nodes(s, st.tp);
        }
        const LayerCost& lc = layer_cost(st, tp_nodes_, dp_nodes_);
        max_samples = std::max(max_samples, samples_for(st.dp));
        keep_max(fp, {prefix + lc.fwd_act, lc.fwd_buf});
        keep_max(bp, {prefix + lc.bwd_act, lc.bwd_buf});
        prefix += lc.kept;
        w += lc.weights, g += lc.grads, o += lc.optimizer;
        dev += lc.device_opt_params, host += lc.host_opt_params;
        if (!with_time_) continue;
        sc.fwd_s += lc.fwd_s;
        sc.bwd_s += lc.bwd_s;
        sc.rec_s += lc.rec_s;
        double tp = lc.tp_fwd_s + lc.tp_bwd_s + lc.tp_rec_s;
        double tp_bwd = lc.tp_bwd_s + lc.tp_rec_s;
        // Samples move between ranks where the tensor degree changes (Program::reshard).
        const LayerStrategy& prev = strat(l - 1);
        if (prev.tp < st.tp && st.tp % prev.tp == 0)
          tp += coll(Collective::all_gather, boundary(l), st.tp / prev.tp, 1);
        if (st.tp < prev.tp && prev.tp % st.tp == 0) {
          const double t = coll(Collective::all_gather, boundary(l - 1), prev.tp / st.tp, 1);
          tp += t;
          tp_bwd += t;
        }
        sc.tp_s += tp;
        sc.tp_bwd_s += tp_bwd;
        (lc.fetch_on_h2d ? sc.h2d_stream_s : sc.dp_stream_s) += 2 * lc.fetch_s;
        sc.dp_stream_s += lc.grad_rs_mb_s;
        sc.h2d_stream_s += lc.act_h2d_s;
        sc.d2h_stream_s += lc.act_d2h_s;
        // Nothing precedes the first forward fetch and the first backward fetch of a pass.
        if (l == r.begin) sc.first_fetch_s += lc.fetch_s;
        if (l == r.end - 1) sc.first_fetch_s += lc.fetch_s + lc.act_h2d_s;
        if (lc.grad_rs_mb_s > 0) reduces_.push_back({bwd_below, lc.grad_rs_mb_s, i});
        if (lc.grad_reduce_s > 0) {
          if (overlap)
            reduces_.push_back({bwd_below, lc.grad_reduce_s, i});
          else
            deferred += lc.grad_reduce_s;
        }
        sc.gather_s += lc.gather_s;
        bwd_below += lc.bwd_s + lc.rec_s + tp_bwd;
      }
      if (ch == nchunks - 1) {
        // fp32 logits live between the loss's forward and backward (Program::head).
        const double T = double(samples(-1)) * m_.seq_len;
        const int64_t logits = static_cast<int64_t>(4.0 * T * m_.vocab / p_.embedding.tp);
        keep_max(fp, {prefix + logits, 0});
      }
      A_[i] = prefix;
      fpk_[i] = fp;
      bpk_[i] = bp;
      chunk_bwd_[i] = bwd_below;
      if (with_time_) {
        // Pipeline sends: activations to the next chunk, gradients to the previous one.
        if (ch < nchunks - 1)
          sc.p2p_fwd_s +=
              c_.p2p_cost(boundary(r.end - 1), geo_.same_node(s, (s + 1) % pp)).time_s();
        if (ch > 0)
          sc.p2p_bwd_s +=
              c_.p2p_cost(boundary(r.begin - 1), geo_.same_node(s, (s + pp - 1) % pp)).time_s();
      }
    }
    const int64_t ep = embed_params(s);
    if (ep > 0) add_states(p_.embedding, ep, w, g, o, dev, host);
    if (with_time_) extras(s, ep, dev, host, deferred, sc);

    const Mem peak = schedule_peak(s);
    const int64_t ws = int64_t(2) * e_ * max_samples * m_.seq_len * m_.hidden;
    MemoryBreakdown& mb = sc.memory;
    mb.weights_bytes = w;
    mb.grads_bytes = g;
    mb.optimizer_bytes = o;
    mb.activations_bytes = peak.act;
    mb.buffers_bytes = peak.buf + ws;
    mb.context_bytes = c_.cluster().gpu.context_overhead_bytes;
    mb.fragmentation_bytes = static_cast<int64_t>(c_.cluster().gpu.allocator_fragmentation *
                                                  double(w + g + o + peak.act + peak.buf + ws));
    sc.workspace_bytes = ws;
  }

  // Embedding/head work, the end-of-iteration reductions and the optimizer step of stage s.
  void extras(int s, int64_t ep, int64_t dev, int64_t host, double deferred, StageCost& sc) {
    const int pp = p_.pp;
    const LayerStrategy& es = p_.embedding;
    const int b = samples(-1);
    const int64_t act = int64_t(e_) * b * m_.seq_len * m_.hidden;
    const int tpn = geo_.tp_nodes(s, es.tp), dpn = geo_.dp_nodes(s, es.tp);
    const double launch = c_.cluster().gpu.kernel_launch_s;
    double emb_bwd = 0;
    if (s == 0) {
      sc.fwd_s += c_.elementwise_time_s(2.0 * act) + launch;
      emb_bwd = c_.elementwise_time_s(2.0 * act) + 2 * launch;
      sc.bwd_s += emb_bwd;
      if (es.tp > 1)
        sc.tp_s += coll(es.sequence_parallel ? Collective::reduce_scatter : Collective::all_reduce,
                        act, es.tp, tpn);
    }
    if (s == pp - 1) {
      const double T = double(b) * m_.seq_len;
      const int64_t logits = static_cast<int64_t>(4.0 * T * m_.vocab / es.tp);
      const double ew = 2.0 * logits + 2.0 * e_ * T * m_.hidden;
      sc.fwd_s += c_.block_time_s(c_.head_work(Phase::forward, b, ew));
      sc.bwd_s += c_.block_time_s(c_.head_work(Phase::backward, b, ew));
      if (es.tp > 1) {
        if (es.sequence_parallel) sc.tp_s += coll(Collective::all_gather, act, es.tp, tpn);
        // Vocabulary-parallel cross entropy: max, sum-exp and target logit per token.
        sc.tp_s += coll(Collective::all_reduce, static_cast<int64_t>(12 * T), es.tp, tpn);
        const double t =
            coll(es.sequence_parallel ? Collective::reduce_scatter : Collective::all_reduce, act,
                 es.tp, tpn);
        sc.tp_s += t;
        sc.tp_bwd_s += t;
      }
    }
    // Embedding gradients: reduced after the embedding backward (stage 0, the very end) or
    // after the loss backward (last stage, before its final backward passes).
    double total_bwd = 0;
    for (int i = 0; i < v_; ++i) total_bwd += chunk_bwd_[i];
    if (ep > 0 && es.dp > 1) {
      const int64_t bytes = ep * e_;
      const double tau = s == 0 ? 0.0 : total_bwd;
      if (es.zero >= 2) {
        const double rs = coll(Collective::reduce_scatter, bytes, es.dp, dpn);
        sc.dp_stream_s += rs;
        reduces_.push_back({tau, rs, -1});
      } else {
        const double red = coll(es.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter,
                                bytes, es.dp, dpn);
        if (p_.overlap_grad_reduce)
          reduces_.push_back({tau, red, -1});
        else
          deferred += red;
      }
      if (es.zero == 1 || es.zero == 2)
        sc.gather_s += coll(Collective::all_gather, bytes, es.dp, dpn);
    }
    // Chunk i's last backward pass is followed by i*pp passes of the stage's lower chunks
    // (interleaved cool-down); chunk 0 on stage 0 is followed by the embedding backward.
    const double pass = total_bwd / v_;
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
    if (pp > 1 && m_.tied_embeddings && (s == 0 || s == pp - 1)) {
      // Tied word embedding: the first and last stage sum their copies' gradients.
      const int64_t bytes = int64_t(m_.vocab) * m_.hidden / es.tp * e_;
      t += coll(Collective::all_reduce, bytes, 2, geo_.same_node(0, pp - 1) ? 1 : 2);
    }
    sc.reduce_exposed_s = std::max(0.0, t);
    // AdamW step, as the Program's optimizer(): device part and offloaded (host) part.
    if (dev > 0) {
      Op op;
      op.kind = OpKind::compute;
      op.block = Block::optimizer;
      op.flops = 12.0 * dev;
      op.bytes = static_cast<int64_t>(double(dev) * (2 * opt_bpp_ + 2 * e_));
      sc.optimizer_s = c_.compute_time_s(op);
    }
    if (host > 0) {
      sc.host_s = 2 * c_.copy_cost(host * e_).time_s() +
                  c_.host_compute_time_s(12.0 * host, double(host) * (2 * opt_bpp_ + 2 * e_));
    }
  }

  // Peak of activations + buffers over the stage's schedule: the in-flight micro-batches'
  // kept activations plus the running pass's own bytes.
  Mem schedule_peak(int s) const {
    const int pp = p_.pp;
    const int M = M_;
    if (v_ == 1) {
      // 1F1B keeps min(pp - s, M) micro-batches in flight on stage s, GPipe all M.
      const int k = p_.schedule == Schedule::gpipe ? M : std::min(pp - s, M);
      Mem best = fpk_[0];
      keep_max(best, bpk_[0]);
      best.act += int64_t(std::max(0, k - 1)) * A_[0];
      return best;
    }
    // Interleaved: Megatron's warm-up keeps min(W + 1, M*v) chunk passes in flight.
    const int total = M * v_, period = pp * v_;
    const int W = std::min((pp - s - 1) * 2 + (v_ - 1) * pp, total);
    bool same = true;
    for (int i = 1; i < v_; ++i)
      same = same && A_[i] == A_[0] && fpk_[i].act == fpk_[0].act && fpk_[i].buf == fpk_[0].buf &&
             bpk_[i].act == bpk_[0].act && bpk_[i].buf == bpk_[0].buf;
    if (same) {
      Mem best = fpk_[0];
      keep_max(best, bpk_[0]);
      best.act += int64_t(std::min(W + 1, total) - 1) * A_[0];
      return best;
    }
    // Chunks of different sizes: step through the warm-up and one period (pp*v pairs) of the
    // steady state, which then repeats; the cool-down only frees.
    int64_t alive = 0;
    Mem best;
    auto fwd = [&](int k) {
      const int c = (k % period) / pp;
      keep_max(best, {alive + fpk_[c].act, fpk_[c].buf});
      alive += A_[c];
    };
    auto bwd = [&](int k) {
      const int c = v_ - 1 - (k % period) / pp;
      keep_max(best, {alive - A_[c] + bpk_[c].act, bpk_[c].buf});
      alive -= A_[c];
    };
    int f = 0, b = 0;
    for (; f < W; ++f) fwd(f);
    const int steady = total - W;
    for (int i = 0; i < std::min(steady, period + 1); ++i) fwd(f++), bwd(b++);
    if (steady == 0)
      for (int i = 0; i < std::min(total, period); ++i) bwd(b++);
    return best;
  }

  const CostModel& c_;
  const ModelSpec& m_;
  const Plan& p_;
  const bool with_time_;
  const int e_;
  const int64_t opt_bpp_;  // fp32 master + Adam moments (fp32 training keeps no master copy)
  Geometry geo_;
  int max_dp_ = 1, M_ = 1, v_ = 1;
  int geo_tp_ = 0, tp_nodes_ = 1, dp_nodes_ = 1;
  std::vector<int64_t>& A_;
  std::vector<Mem>& fpk_;
  std::vector<Mem>& bpk_;
  std::vector<double>& chunk_bwd_;
  std::vector<Reduce>& reduces_;

  bool have_ = false;
  LayerStrategy cached_st_;
  int cached_tp_nodes_ = 0, cached_dp_nodes_ = 0;
  LayerCost cached_;
};

}  // namespace

void analyze(const CostModel& cost, bool with_time, std::vector<StageCost>& out) {
  thread_local Scratch scratch;
  Analyzer(cost, with_time, scratch).run(out);
}

}  // namespace stratagem::cost_detail
