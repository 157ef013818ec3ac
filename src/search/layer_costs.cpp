#include "src/search/layer_costs.hpp"

#include <algorithm>
#include <cmath>

#include "stratagem/workload.hpp"

namespace stratagem::search_detail {

// ---- geometry (as the estimator places groups) ----------------------------------------------

namespace {
int span(int64_t g, int64_t first, int64_t count) {
  return int((first + count - 1) / g - first / g + 1);
}
int log2_of(int x) {
  int l = 0;
  while ((1 << l) < x) ++l;
  return l;
}
}  // namespace

int Geometry::tp_nodes(int s, int tp) const {
  const int64_t dp = D / tp;
  int worst = 1;
  for (int64_t k = 0; k < std::min<int64_t>(dp, g); ++k)
    worst = std::max(worst, span(g, s * D + k * tp, tp));
  return worst;
}

int Geometry::dp_nodes(int s, int tp) const {
  const int64_t dp = D / tp;
  int worst = 1;
  for (int64_t j : {int64_t(0), int64_t(tp - 1)}) {
    const int64_t first = s * D + j;
    worst = std::max(worst, int((first + (dp - 1) * tp) / g - first / g + 1));
  }
  return worst;
}

std::vector<int> Geometry::signature(int s, const std::vector<int>& tps) const {
  std::vector<int> sig;
  for (int tp : tps) {
    sig.push_back(tp_nodes(s, tp));
    sig.push_back(dp_nodes(s, tp));
  }
  return sig;
}

double LayerCost::step_s() const {
  return std::max({busy_s, dp_stream_s, h2d_stream_s, d2h_stream_s});
}

// ---- cost tables ------------------------------------------------------------------------------

CostTables::CostTables(const ModelSpec& m, const ClusterSpec& c, Dtype dtype, bool flash,
                       bool overlap_grad_reduce)
    : m_(m),
      c_(c),
      dtype_(dtype),
      flash_(flash),
      overlap_(overlap_grad_reduce),
      e_(dtype_bytes(dtype)),
      opt_bpp_(dtype == Dtype::fp32 ? 8 : 12) {
  const int g = std::max(1, c.node.gpus_per_node);
  for (int tp = 1; tp <= std::max(1, g); tp *= 2) {
    auto p = std::make_unique<Plan>();
    p->dtype = dtype;
    p->flash_attention = flash;
    p->overlap_grad_reduce = overlap_grad_reduce;
    p->embedding.tp = tp;
    costs_.push_back(std::make_unique<CostModel>(m_, c_, *p));
    plans_.push_back(std::move(p));
  }
  // The optimizer step is linear in the parameters it updates (roofline + one launch, and
  // PCIe copies + host work): take the rate at a billion parameters.
  const double P = 1e9;
  Op op;
  op.kind = OpKind::compute;
  op.block = Block::optimizer;
  op.flops = 12.0 * P;
  op.bytes = static_cast<int64_t>(P * double(2 * opt_bpp_ + 2 * e_));
  const CostModel& c0 = *costs_.front();
  dev_opt_rate_ = c0.compute_time_s(op) / P;
  host_opt_rate_ = (2 * c0.copy_cost(static_cast<int64_t>(P * e_)).time_s() +
                    c0.host_compute_time_s(12.0 * P, P * double(2 * opt_bpp_ + 2 * e_))) /
                   P;
}

const CostModel& CostTables::cost(int tp) const {
  const int i = log2_of(tp);
  return *costs_.at(std::min<size_t>(i, costs_.size() - 1));
}

LayerCost CostTables::layer(const LayerStrategy& s, int b, int tp_nodes, int dp_nodes) const {
  const CostModel& cm = *costs_.front();
  LayerCost lc;
  lc.st = s;
  lc.samples = b;
  const bool flash = flash_;
  const int64_t params = block_parameters_per_rank(m_, s.tp, Block::attention) +
                         block_parameters_per_rank(m_, s.tp, Block::mlp);
  // Model states, as the Program's setup() and the estimator's add_states().
  const int64_t shard = (params + s.dp - 1) / s.dp;
  const int64_t w = s.offload_params ? 0 : (s.zero == 3 ? shard : params) * e_;
  const int64_t gr = (s.zero >= 2 ? shard : params) * e_;
  const int64_t nopt = s.zero >= 1 ? shard : params;
  const int64_t o = s.offload_optimizer ? 0 : nopt * opt_bpp_;
  lc.states = w + gr + o;
  // Activations, tensor by tensor as the Program allocates them.
  auto saved = [&](Block blk, Recompute rc, bool fl) {
    return saved_activation_bytes(m_, s, blk, b, rc, fl, dtype_);
  };
  const int64_t sa = saved(Block::attention, s.recompute, flash);
  const int64_t sm = saved(Block::mlp, s.recompute, flash);
  const bool fetches = (s.zero == 3 && s.dp > 1) || s.offload_params;
  const int64_t fetch_bytes = fetches ? params * e_ : 0;
  lc.kept = s.offload_activations ? 0 : sa + sm;
  const int64_t fwd_act = sa + sm;
  int64_t during_mlp = sa + sm, during_attn = sa;
  if (s.recompute == Recompute::full) {
    const int64_t re_a = saved(Block::attention, Recompute::none, flash) - sa;
    during_mlp += re_a + saved(Block::mlp, Recompute::none, flash);
    during_attn += re_a;
  } else if (s.recompute == Recompute::selective && !flash) {
    during_attn += saved(Block::attention, Recompute::none, false) - sa;
  }
  const int64_t bwd_act = std::max(during_mlp, during_attn);
  lc.transient = std::max(fwd_act - lc.kept + fetch_bytes, bwd_act - lc.kept + fetch_bytes);
  lc.workspace = int64_t(2) * e_ * b * m_.seq_len * m_.hidden;
  lc.boundary = boundary_activation_bytes(m_, s, b, dtype_);

  // Time per micro-batch.
  const double fwd = cm.block_time_s(forward_work(m_, s, Block::attention, b, flash)) +
                     cm.block_time_s(forward_work(m_, s, Block::mlp, b, flash));
  const double bwd = cm.block_time_s(backward_work(m_, s, Block::attention, b, flash)) +
                     cm.block_time_s(backward_work(m_, s, Block::mlp, b, flash));
  double rec = 0;
  if (s.recompute == Recompute::full) {
    rec = fwd;
  } else if (s.recompute == Recompute::selective && !flash) {
    BlockWork core = attention_core_work(m_, s, b, false);
    core.attention_flops /= 2;
    rec = cm.block_time_s(core);
  }
  auto coll = [&](Collective k, int64_t bytes, int size, int nodes) {
    return cm.collective_cost(k, bytes, size, nodes).time_s();
  };
  double tp_time = 0;
  if (s.tp > 1) {
    const int64_t msg = int64_t(e_) * b * m_.seq_len * m_.hidden;
    const double per_block = s.sequence_parallel
                                 ? coll(Collective::all_gather, msg, s.tp, tp_nodes) +
                                       coll(Collective::reduce_scatter, msg, s.tp, tp_nodes)
                                 : coll(Collective::all_reduce, msg, s.tp, tp_nodes);
    tp_time = 2 * per_block + 2 * per_block + (s.recompute == Recompute::full ? 2 * per_block : 0);
  }
  lc.busy_s = fwd + bwd + rec + tp_time;
  const int64_t pbytes = params * e_;
  double fetch = 0, grad_rs_mb = 0, gather = 0;
  bool fetch_on_h2d = false;
  if (s.dp > 1) {
    if (s.zero == 3) fetch = coll(Collective::all_gather, pbytes, s.dp, dp_nodes);
    // ZeRO-3 with offloaded parameters: the shard crosses PCIe before each gather.
    if (s.zero == 3 && s.offload_params) fetch += cm.copy_cost((pbytes + s.dp - 1) / s.dp).time_s();
    if (s.zero >= 2) grad_rs_mb = coll(Collective::reduce_scatter, pbytes, s.dp, dp_nodes);
    lc.reduce_s = s.zero >= 2
                      ? grad_rs_mb
                      : coll(s.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter,
                             pbytes, s.dp, dp_nodes);
    if (s.zero == 1 || s.zero == 2) gather = coll(Collective::all_gather, pbytes, s.dp, dp_nodes);
  }
  if (s.offload_params && !(s.zero == 3 && s.dp > 1)) {
    fetch = cm.copy_cost(pbytes).time_s();
    fetch_on_h2d = true;
  }
  double act_copy = 0;
  if (s.offload_activations) act_copy = cm.copy_cost(sa + sm).time_s();
  lc.fetch_s = fetch;
  lc.act_h2d_s = act_copy;
  lc.dp_stream_s = (fetch_on_h2d ? 0 : 2 * fetch) + grad_rs_mb;
  lc.h2d_stream_s = (fetch_on_h2d ? 2 * fetch : 0) + act_copy;
  lc.d2h_stream_s = act_copy;
  lc.tail_s = gather + double(s.offload_optimizer ? 0 : nopt) * dev_opt_rate_ +
              double(s.offload_optimizer ? nopt : 0) * host_opt_rate_;
  return lc;
}

double CostTables::reshard_s(const LayerCost& a, const LayerCost& b) const {
  const CostModel& cm = *costs_.front();
  if (a.st.tp < b.st.tp && b.st.tp % a.st.tp == 0)
    return cm.collective_cost(Collective::all_gather, b.boundary, b.st.tp / a.st.tp, 1).time_s();
  if (b.st.tp < a.st.tp && a.st.tp % b.st.tp == 0)
    return cm.collective_cost(Collective::all_gather, a.boundary, a.st.tp / b.st.tp, 1).time_s();
  return 0;
}

EmbeddingCost CostTables::embedding(const LayerStrategy& es, int b, int tpn, int dpn,
                                    bool pp_one) const {
  const CostModel& cm = cost(es.tp);
  EmbeddingCost ec;
  ec.st = es;
  ec.samples = b;
  auto coll = [&](Collective k, int64_t bytes, int size, int nodes) {
    return cm.collective_cost(k, bytes, size, nodes).time_s();
  };
  const int64_t act = int64_t(e_) * b * m_.seq_len * m_.hidden;
  const double launch = c_.gpu.kernel_launch_s;
  // First stage: lookup forward, scatter-add backward, vocabulary-parallel sum.
  ec.first_busy_s =
      cm.elementwise_time_s(2.0 * act) + launch + cm.elementwise_time_s(2.0 * act) + 2 * launch;
  if (es.tp > 1)
    ec.first_busy_s +=
        coll(es.sequence_parallel ? Collective::reduce_scatter : Collective::all_reduce, act, es.tp,
             tpn);
  // Last stage: logits GEMM and the loss, forward and backward.
  const double T = double(b) * m_.seq_len;
  ec.logits = static_cast<int64_t>(4.0 * T * m_.vocab / es.tp);
  const double ew = 2.0 * ec.logits + 2.0 * e_ * T * m_.hidden;
  ec.last_busy_s = cm.block_time_s(cm.head_work(Phase::forward, b, ew)) +
                   cm.block_time_s(cm.head_work(Phase::backward, b, ew));
  if (es.tp > 1) {
    if (es.sequence_parallel) ec.last_busy_s += coll(Collective::all_gather, act, es.tp, tpn);
    ec.last_busy_s += coll(Collective::all_reduce, static_cast<int64_t>(12 * T), es.tp, tpn);
    ec.last_busy_s +=
        coll(es.sequence_parallel ? Collective::reduce_scatter : Collective::all_reduce, act, es.tp,
             tpn);
  }
  ec.workspace = int64_t(2) * e_ * b * m_.seq_len * m_.hidden;
  // Parameters: first stage the embeddings, last stage the head (+ its copy of a tied wte).
  const int64_t first_p = embedding_parameters_per_rank(m_, es.tp);
  int64_t last_p = head_parameters_per_rank(m_, es.tp);
  const int64_t tied_copy = m_.tied_embeddings ? int64_t(m_.vocab) * m_.hidden / es.tp : 0;
  // On the first stage the embedding's gradient reduction is issued after the last backward
  // pass and is exposed in full (the estimator's tau = 0).
  auto states_of = [&](int64_t params, int64_t& states, double& tail, double& dps,
                       bool exposed_reduce) {
    const int64_t shard = (params + es.dp - 1) / es.dp;
    const int64_t w = es.offload_params ? 0 : (es.zero == 3 ? shard : params) * e_;
    const int64_t gr = (es.zero >= 2 ? shard : params) * e_;
    const int64_t nopt = es.zero >= 1 ? shard : params;
    const int64_t o = es.offload_optimizer ? 0 : nopt * opt_bpp_;
    states = w + gr + o;
    tail = double(es.offload_optimizer ? 0 : nopt) * dev_opt_rate_ +
           double(es.offload_optimizer ? nopt : 0) * host_opt_rate_;
    dps = 0;
    if (es.dp > 1) {
      const int64_t bytes = params * e_;
      if (es.zero >= 2) dps = coll(Collective::reduce_scatter, bytes, es.dp, dpn);
      if (es.zero == 1 || es.zero == 2) tail += coll(Collective::all_gather, bytes, es.dp, dpn);
      if (exposed_reduce)
        tail += coll(es.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter, bytes,
                     es.dp, dpn);
    }
  };
  states_of(first_p, ec.first_states, ec.first_tail_s, ec.first_dp_stream_s, true);
  states_of(last_p + tied_copy, ec.last_states, ec.last_tail_s, ec.last_dp_stream_s, false);
  states_of(first_p + last_p, ec.only_states, ec.only_tail_s, ec.only_dp_stream_s, true);
  if (!pp_one && m_.tied_embeddings) {
    // The first and last stage sum their copies' gradients (counted on both ends).
    const int64_t bytes = int64_t(m_.vocab) * m_.hidden / es.tp * e_;
    const double t = cm.collective_cost(Collective::all_reduce, bytes, 2, 1).time_s();
    ec.first_tail_s += t;
    ec.last_tail_s += t;
  }
  return ec;
}

// ---- candidates ---------------------------------------------------------------------------------

std::vector<int> tp_degrees_for(const ModelSpec& m, const ClusterSpec& c, int D, int Bm,
                                const SpaceFilter& f) {
  std::vector<int> out;
  const int g = std::max(1, c.node.gpus_per_node);
  for (int tp = 1; tp <= g && tp <= D; tp *= 2) {
    if (!f.tp_degrees.empty() &&
        std::find(f.tp_degrees.begin(), f.tp_degrees.end(), tp) == f.tp_degrees.end())
      continue;
    if (D % tp || m.heads % tp || m.kv_heads % tp || m.ffn_hidden % tp) continue;
    const int dp = D / tp;
    if (Bm % dp) continue;
    if (Bm / dp > f.max_samples_per_rank) continue;
    out.push_back(tp);
  }
  return out;
}

std::vector<LayerStrategy> layer_candidates(const ModelSpec& m, const ClusterSpec& c, int D, int Bm,
                                            const SpaceFilter& f) {
  std::vector<LayerStrategy> out;
  for (int tp : tp_degrees_for(m, c, D, Bm, f)) {
    const int dp = D / tp;
    std::vector<bool> sps;
    if (tp == 1 || f.sequence_parallel_off) sps.push_back(false);
    if (tp > 1 && f.sequence_parallel_on && m.seq_len % tp == 0) sps.push_back(true);
    for (bool sp : sps)
      for (int z : f.zero_stages) {
        if (z > 0 && dp == 1) continue;  // ZeRO without data parallelism changes nothing
        for (Recompute rc : f.recompute)
          for (int off = 0; off < (f.offload ? 8 : 1); ++off) {
            LayerStrategy s;
            s.tp = tp, s.dp = dp, s.sequence_parallel = sp, s.zero = z, s.recompute = rc;
            s.offload_optimizer = off & 1;
            s.offload_params = off & 2;
            s.offload_activations = off & 4;
            out.push_back(s);
          }
      }
  }
  return out;
}

std::vector<LayerStrategy> embedding_candidates(const ModelSpec& m, const ClusterSpec& c, int D,
                                                int Bm, const SpaceFilter& f) {
  std::vector<LayerStrategy> out;
  for (int tp : tp_degrees_for(m, c, D, Bm, f)) {
    const int dp = D / tp;
    std::vector<bool> sps;
    if (tp == 1 || f.sequence_parallel_off) sps.push_back(false);
    if (tp > 1 && f.sequence_parallel_on && m.seq_len % tp == 0) sps.push_back(true);
    for (bool sp : sps)
      for (int z : f.zero_stages) {
        if (z > 0 && dp == 1) continue;
        for (int off = 0; off < (f.offload ? 4 : 1); ++off) {
          LayerStrategy s;
          s.tp = tp, s.dp = dp, s.sequence_parallel = sp, s.zero = z;
          s.offload_optimizer = off & 1;
          s.offload_params = off & 2;
          out.push_back(s);
        }
      }
  }
  return out;
}

// ---- pruning ----------------------------------------------------------------------------------

namespace {
bool le(double a, double b) {
  return a <= b;
}
bool dominates(const LayerCost& a, const LayerCost& b) {
  return le(a.busy_s, b.busy_s) && le(a.dp_stream_s, b.dp_stream_s) &&
         le(a.h2d_stream_s, b.h2d_stream_s) && le(a.d2h_stream_s, b.d2h_stream_s) &&
         le(a.fetch_s, b.fetch_s) && le(a.act_h2d_s, b.act_h2d_s) && le(a.tail_s, b.tail_s) &&
         le(a.reduce_s, b.reduce_s) && a.states <= b.states && a.kept <= b.kept &&
         a.transient <= b.transient;
}
bool dominates(const EmbeddingCost& a, const EmbeddingCost& b) {
  return le(a.first_busy_s, b.first_busy_s) && le(a.last_busy_s, b.last_busy_s) &&
         le(a.first_dp_stream_s, b.first_dp_stream_s) &&
         le(a.last_dp_stream_s, b.last_dp_stream_s) && le(a.only_dp_stream_s, b.only_dp_stream_s) &&
         le(a.first_tail_s, b.first_tail_s) && le(a.last_tail_s, b.last_tail_s) &&
         le(a.only_tail_s, b.only_tail_s) && a.first_states <= b.first_states &&
         a.last_states <= b.last_states && a.only_states <= b.only_states && a.logits <= b.logits &&
         a.workspace <= b.workspace;
}
template <class T>
bool same_class(const T& a, const T& b) {
  return a.st.tp == b.st.tp && a.st.sequence_parallel == b.st.sequence_parallel;
}
template <class T>
std::vector<T> prune(std::vector<T> in) {
  std::vector<T> out;
  std::vector<char> dead(in.size(), 0);
  for (size_t i = 0; i < in.size(); ++i) {
    for (size_t j = 0; j < in.size() && !dead[i]; ++j) {
      if (i == j || dead[j] || !same_class(in[i], in[j])) continue;
      // j beats i; among exact equals the earlier one survives.
      if (dominates(in[j], in[i]) && (j < i || !dominates(in[i], in[j]))) dead[i] = 1;
    }
  }
  for (size_t i = 0; i < in.size(); ++i)
    if (!dead[i]) out.push_back(std::move(in[i]));
  return out;
}
}  // namespace

std::vector<LayerCost> prune_dominated(std::vector<LayerCost> in) {
  return prune(std::move(in));
}
std::vector<EmbeddingCost> prune_dominated(std::vector<EmbeddingCost> in) {
  return prune(std::move(in));
}

std::vector<double> entry_costs(const CostTables& tables, const std::vector<LayerCost>& costs,
                                const StageDpProblem& prob, const LayerStrategy& from,
                                int from_samples, double M) {
  LayerCost src;
  src.st = from;
  src.boundary = boundary_activation_bytes(tables.model(), from, from_samples, tables.dtype());
  std::vector<double> out(size_t(prob.num_classes), 0.0);
  std::vector<char> seen(out.size(), 0);
  for (const auto& it : prob.items) {
    if (seen[it.cls]) continue;
    seen[it.cls] = 1;
    // The class representative: the largest boundary of that tp among the costs.
    const LayerCost* rep = &costs[it.id];
    for (const auto& lc : costs)
      if (lc.st.tp == rep->st.tp && lc.boundary > rep->boundary) rep = &lc;
    out[it.cls] = M * tables.reshard_s(src, *rep);
  }
  return out;
}

StageDpProblem stage_problem(const CostTables& tables, const std::vector<LayerCost>& costs,
                             double M, double k, int n_max, int64_t bucket, int64_t max_budget,
                             int max_tr_classes, int max_kept_levels, bool exact) {
  StageDpProblem prob;
  prob.n_max = n_max;
  prob.bucket_bytes = bucket;
  prob.max_budget_bytes = std::max<int64_t>(0, max_budget);
  prob.max_tr_classes = max_tr_classes;
  prob.max_kept_levels = max_kept_levels;
  prob.exact = exact;
  // Reshard classes: the tp degree, represented by its largest boundary.
  std::vector<int> tps;
  std::vector<const LayerCost*> rep;
  std::vector<int> cls;
  for (const auto& lc : costs) {
    auto it = std::find(tps.begin(), tps.end(), lc.st.tp);
    int c = int(it - tps.begin());
    if (it == tps.end()) tps.push_back(lc.st.tp), rep.push_back(&lc);
    if (lc.boundary > rep[c]->boundary) rep[c] = &lc;
    cls.push_back(c);
  }
  const int C = int(tps.size());
  prob.num_classes = std::max(1, C);
  prob.reshard.assign(size_t(prob.num_classes) * prob.num_classes, 0.0);
  for (int a = 0; a < C; ++a)
    for (int b = 0; b < C; ++b)
      prob.reshard[size_t(a) * C + b] = M * tables.reshard_s(*rep[a], *rep[b]);
  for (int i = 0; i < int(costs.size()); ++i) {
    const LayerCost& lc = costs[i];
    DpItem d;
    d.id = i;
    d.cls = cls[i];
    d.cost = M * lc.step_s() + lc.tail_s;
    // The estimator's non-prefetchable transfers at a pass's ends: the first layer's weight
    // fetch (forward), the last layer's fetch and activation copy-back (backward); and the first
    // layer's gradient reduction, which nothing follows to hide it.
    d.first = M * lc.fetch_s + lc.reduce_s;
    d.last = M * (lc.fetch_s + lc.act_h2d_s);
    const double resident = double(lc.states) + k * double(lc.kept);
    d.w = int64_t(std::ceil(resident / double(bucket)));
    d.tr = lc.transient;
    d.kept = lc.kept;
    d.ws = lc.workspace;
    auto beats = [](const DpItem& x, const DpItem& y) {
      return x.cls == y.cls && x.cost <= y.cost && x.first <= y.first && x.last <= y.last &&
             x.w <= y.w && x.tr <= y.tr && x.ws <= y.ws && x.kept >= y.kept;
    };
    bool dead = false;
    for (const auto& x : prob.items)
      if (beats(x, d)) {
        dead = true;
        break;
      }
    if (dead) continue;
    std::erase_if(prob.items, [&](const DpItem& x) { return beats(d, x); });
    prob.items.push_back(d);
  }
  return prob;
}

}  // namespace stratagem::search_detail
