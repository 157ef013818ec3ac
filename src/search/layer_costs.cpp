#include "src/search/layer_costs.hpp"

#include <algorithm>
#include <cmath>

#include "stratagem/layer_cost.hpp"
#include "stratagem/workload.hpp"

namespace stratagem::search_detail {

// ---- geometry (as the estimator places groups) ----------------------------------------------

std::vector<int> Geometry::signature(int s, const std::vector<int>& tps, int cp) const {
  std::vector<int> sig;
  for (int tp : tps) {
    sig.push_back(tp_nodes(s, tp));
    sig.push_back(dp_nodes(s, tp));
    if (cp > 1) sig.push_back(cp_nodes(s, tp, cp));
  }
  return sig;
}

double LayerCost::step_s() const {
  return overlapped_time_s(interference, kernel_s, busy_s - kernel_s, dp_stream_s,
                           std::max(h2d_stream_s, d2h_stream_s));
}

// ---- cost tables ------------------------------------------------------------------------------

CostTables::CostTables(const ModelSpec& m, const ClusterSpec& c, Dtype dtype, bool flash,
                       bool overlap_grad_reduce, const FrameworkSpec& framework,
                       const std::vector<int>& cp_degrees)
    : m_(m),
      c_(c),
      dtype_(dtype),
      flash_(flash),
      overlap_(overlap_grad_reduce),
      cp_degrees_(cp_degrees),
      cost_(m, c, dtype, framework) {
  pricing_.dtype = dtype;
  pricing_.flash_attention = flash;
  pricing_.overlap_grad_reduce = overlap_grad_reduce;
  // The optimizer step is linear in the parameters it updates (roofline + one launch, and
  // PCIe copies + host work): take the rate at a billion parameters.
  const int64_t P = 1000000000;
  dev_opt_rate_ = cost_detail::optimizer_step_s(cost_, P) / double(P);
  host_opt_rate_ = cost_detail::host_optimizer_step_s(cost_, P) / double(P);
  host_resident_opt_rate_ = cost_detail::host_optimizer_step_s(cost_, P, P) / double(P);
}

LayerCost CostTables::layer(const LayerStrategy& s, int b, int tp_nodes, int dp_nodes,
                            const cost_detail::MoeNodes& moe, int cp_nodes) const {
  // The estimator's per-layer figures (src/cost/layer_cost.cpp), folded into what the stage DP
  // needs: one busy time, the side streams, a tail and four memory terms.
  const cost_detail::LayerCost x = cost_detail::layer_cost(
      cost_, pricing_, s, b, tp_nodes, dp_nodes, /*with_time=*/true, moe, cp_nodes);
  LayerCost lc;
  lc.st = s;
  lc.samples = b;
  lc.states = x.states.weights + x.states.grads + x.states.optimizer;
  lc.kept = x.kept;
  // The attention backward overlaps the fetch of the layer below, taken to be of this size.
  // The mlp backward writes the layer's staged gradients while the reduction of the layer
  // above's, taken to be of this size, is in flight (the estimator's moments).
  // The reduction in flight also holds its received piece (a Program buffer).
  // An MoE layer's gathered experts (ZeRO-3 over expert_dp) join its forward and mlp backward.
  lc.fwd_transient = x.fwd_act - x.kept + x.fwd_buf + x.expert_fetch_bytes;
  lc.transient = std::max({lc.fwd_transient,
                           x.bwd_mlp_act - x.kept + x.bwd_buf + x.expert_fetch_bytes +
                               x.piece_bytes + 2 * x.staged_bytes,
                           x.bwd_attn_act - x.kept + 2 * x.bwd_buf + x.staged_bytes});
  lc.workspace = x.workspace;
  lc.pipelined_workspace = x.pipelined_workspace;
  lc.boundary = boundary_activation_bytes(m_, s, b, dtype_);
  lc.kernel_s = x.fwd_s + x.bwd_s + x.rec_s;
  lc.busy_s =
      lc.kernel_s + x.tp_fwd_s + x.tp_bwd_s + x.tp_rec_s + x.ep_fwd_s + x.ep_bwd_s + x.ep_rec_s;
  if (s.cp > 1) lc.busy_s += x.cp_fwd_s + x.cp_bwd_s + x.cp_rec_s;
  lc.interference = cost_.compute_comm_interference();
  lc.fetch_s = x.fetch_s;
  lc.act_h2d_s = x.act_h2d_s;
  lc.dp_stream_s = (x.fetch_on_h2d ? 0 : 2 * x.fetch_s) + x.grad_rs_mb_s;
  lc.h2d_stream_s = (x.fetch_on_h2d ? 2 * x.fetch_s : 0) + x.act_h2d_s;
  lc.d2h_stream_s = x.act_d2h_s;
  lc.reduce_s = s.zero >= 2 ? x.grad_rs_mb_s : x.grad_reduce_s;
  lc.tail_s = x.gather_s + optimizer_s(x.states);
  return lc;
}

double CostTables::reshard_s(const LayerCost& a, const LayerCost& b) const {
  // As the Program: where the stream's holding changes (LayerStrategy::stream_tp).
  const cost_detail::ReshardCost r =
      cost_detail::reshard_cost(cost_, a.st, a.samples, b.st, b.samples);
  return r.fwd_s + r.bwd_s;
}

EmbeddingCost CostTables::embedding(const LayerStrategy& es, int b,
                                    const cost_detail::Geometry& geo, int pp) const {
  const int last = pp - 1;
  EmbeddingCost ec;
  ec.st = es;
  ec.samples = b;
  // The embedding with the first stage's placement, the head with the last stage's.
  auto per_microbatch = [&](int stage) {
    return cost_detail::embedding_head_cost(cost_, es, b, geo.tp_nodes(stage, es.tp),
                                            geo.dp_nodes(stage, es.tp), /*with_time=*/true);
  };
  const cost_detail::EmbeddingHeadCost x = per_microbatch(0);
  const cost_detail::EmbeddingHeadCost y = pp == 1 ? x : per_microbatch(last);
  // The lookup's fetch has nothing to hide behind (as the estimator's first fetch of a pass);
  // the head's is prefetched behind the last layer, on the side stream.
  ec.first_busy_s = x.emb_fwd_s + x.emb_bwd_s + x.emb_tp_s + x.emb_fetch.time_s;
  ec.last_busy_s = y.head_fwd_s + y.head_bwd_s + y.head_tp_s;
  ec.logits = x.logits_bytes + x.loss_transient_bytes;
  ec.emb_fetch_bytes = x.emb_fetch.bytes;
  ec.head_fetch_bytes = x.head_fetch.bytes;
  // States: first stage the embeddings, last stage the head (+ its copy of a tied wte), a
  // single stage both. On the first stage the embedding's gradient reduction is issued after
  // the last backward pass and is exposed in full (the estimator's tau = 0).
  auto states_of = [&](bool embedding, bool head, int stage, int64_t& states, double& tail,
                       double& dps, bool exposed_reduce) {
    const cost_detail::EndStates e =
        cost_detail::end_states(cost_, es, embedding, head, geo, stage, /*with_time=*/true);
    states = e.states.weights + e.states.grads + e.states.optimizer;
    tail = optimizer_s(e.states);
    dps = 0;
    if (es.dp_cp() > 1) {
      if (e.sync.per_microbatch) dps = e.sync.reduce_s;
      tail += e.sync.gather_s;
      if (exposed_reduce) tail += e.sync.reduce_s;
    }
    return e.params;
  };
  states_of(true, false, 0, ec.first_states, ec.first_tail_s, ec.first_dp_stream_s, true);
  const int64_t last_p =
      states_of(false, true, last, ec.last_states, ec.last_tail_s, ec.last_dp_stream_s, false);
  const int64_t only_p =
      states_of(true, true, 0, ec.only_states, ec.only_tail_s, ec.only_dp_stream_s, true);
  // The embedding's and head's staged gradients are held through a pass's backward (pp 1) or
  // the iteration (tied embeddings split over stages): counted as held throughout.
  const int64_t ends_params = std::max(only_p, last_p);
  ec.workspace =
      embedding_workspace_bytes(m_, es, b, dtype_) +
      staged_gradient_bytes(es, ends_params, dtype_, cost_.framework().layer_gradient_staging);
  ec.last_dp_stream_s += y.head_fetch.time_s;
  ec.only_dp_stream_s += x.head_fetch.time_s;
  // The first and last stage sum their tied copies' gradients (counted on both ends).
  const double tied_s = cost_detail::tied_embedding_reduce_s(cost_, es.tp, pp, geo);
  if (tied_s > 0) {
    ec.first_tail_s += tied_s;
    ec.last_tail_s += tied_s;
  }
  return ec;
}

// ---- candidates ---------------------------------------------------------------------------------

std::vector<int> cp_degrees_for(const ModelSpec& m, const ClusterSpec& c,
                                const std::vector<int>& requested) {
  std::vector<int> out;
  const int world = c.world_size();
  if (m.attention == AttentionKind::mla) return out;  // cp_refusal: not split
  if (!requested.empty()) {
    for (int cp : requested)
      if (cp > 1 && world % cp == 0 && m.seq_len % cp == 0) out.push_back(cp);
    return out;
  }
  // Llama 3's long-context run kept 131,072 / CP 16 = 8,192 tokens a rank: the search goes no
  // finer by default (below it the K/V exchange outweighs the attention it hides behind).
  for (int cp = 2; cp <= world; cp *= 2)
    if (world % cp == 0 && m.seq_len % cp == 0 && m.seq_len / cp >= kCpMinTokensPerRank)
      out.push_back(cp);
  return out;
}

std::vector<int> tp_degrees_for(const ModelSpec& m, const ClusterSpec& c, int D, int Bm,
                                const SpaceFilter& f) {
  std::vector<int> out;
  const int g = f.max_tp > 0 ? f.max_tp : std::max(1, c.node.gpus_per_node);
  for (int tp = 1; tp <= g && tp <= D; tp *= 2) {
    if (!f.tp_degrees.empty() &&
        std::find(f.tp_degrees.begin(), f.tp_degrees.end(), tp) == f.tp_degrees.end())
      continue;
    if (f.cp > 1 && tp != f.cp_tp) continue;
    // MLA's attention is not split over tp yet (workload_mla.cpp refuses it).
    if (m.attention == AttentionKind::mla && tp > 1) continue;
    if (D % (tp * f.cp) || m.heads % tp || m.kv_heads % tp || m.ffn_hidden % tp) continue;
    const int dp = D / (tp * f.cp);
    if (Bm % dp) continue;
    if (Bm / dp > f.max_samples_per_rank) continue;
    out.push_back(tp);
  }
  return out;
}

namespace {
// Strategies of every (tp, dp, sequence parallel, ZeRO stage) the filter allows, each with the
// given recompute choices and the offload choices below `offloads` (bits: optimizer, params,
// activations), in that nesting order.
// An MoE model's layers: (etp, ep) with ep a power of two dividing the experts, etp 1 or the
// layer's tp (Megatron-Core's default), etp x ep dividing the stage's ranks. ZeRO applies to
// the experts over their expert data-parallel group. Expert-parallel layers with offloaded
// parameters, which plans and the runtime accept, are left out of the space: with them the
// search of mixtral-8x7b on 64 H100s scores ~1.7x the plans (2.0 s of CPU against 1.2 s),
// past what issue #26's 5 s on one process leaves on a loaded machine, for plans that offload
// weights an expert-parallel layer already spreads over ep.
std::vector<std::pair<int, int>> expert_degrees(const ModelSpec& m, int D, const LayerStrategy& s) {
  std::vector<std::pair<int, int>> out;
  if (!m.moe.enabled()) return {{1, 1}};
  for (int etp : {1, s.tp}) {
    if (etp > 1 && m.moe.expert_ffn_hidden % etp) continue;
    // ep and etp x ep in int64: the loop's last test may pass int's range (D up to 2^30).
    for (int64_t ep = 1; ep <= m.moe.experts && etp * ep <= D; ep *= 2) {
      if (m.moe.experts % ep || D % (etp * ep)) continue;
      if (etp * ep > 1 && s.offload_params) continue;
      if (etp * ep == 1 && s.tp > 1) continue;  // validate_moe: experts split at tp > 1
      out.emplace_back(etp, int(ep));
    }
    if (s.tp == 1) break;
  }
  return out;
}

std::vector<LayerStrategy> strategies(const ModelSpec& m, const ClusterSpec& c, int D, int Bm,
                                      const SpaceFilter& f, const std::vector<Recompute>& recompute,
                                      int offloads, bool experts) {
  std::vector<LayerStrategy> out;
  const bool cp = f.cp > 1;
  // Under cp the kinds the model allows; one entry (ring, unread) without.
  std::vector<CpKind> kinds = cp ? f.cp_kinds : std::vector<CpKind>{CpKind::ring};
  for (int tp : tp_degrees_for(m, c, D, Bm, f)) {
    const int dp = D / (tp * f.cp);
    std::vector<bool> sps;
    // A cp plan holds one sequence parallelism throughout: on wherever tp > 1 (Megatron-Core
    // requires it with context parallelism).
    if (tp == 1 || (f.sequence_parallel_off && !cp)) sps.push_back(false);
    if (tp > 1 && (f.sequence_parallel_on || cp) && m.seq_len % tp == 0) sps.push_back(true);
    for (bool sp : sps)
      for (CpKind kind : kinds)
        for (int z : f.zero_stages) {
          // ZeRO without data parallelism changes nothing
          if (z > 0 && dp * f.cp == 1) continue;
          for (Recompute rc : recompute)
            for (int off = 0; off < offloads; ++off) {
              LayerStrategy s;
              s.tp = tp, s.dp = dp, s.sequence_parallel = sp, s.zero = z, s.recompute = rc;
              s.cp = f.cp, s.cp_kind = kind;
              s.offload_optimizer = off & 1;
              s.offload_params = off & 2;
              s.offload_activations = off & 4;
              if (cp && !cp_refusal(m, s, f.flash_attention, nullptr).empty()) continue;
              if (!experts) {
                out.push_back(s);
                continue;
              }
              for (auto [etp, ep] : expert_degrees(m, D, s)) {
                s.etp = etp, s.ep = ep;
                out.push_back(s);
              }
            }
        }
  }
  return out;
}
}  // namespace

std::vector<LayerStrategy> layer_candidates(const ModelSpec& m, const ClusterSpec& c, int D, int Bm,
                                            const SpaceFilter& f) {
  return strategies(m, c, D, Bm, f, f.recompute, f.offload ? 8 : 1, /*experts=*/true);
}

// The embedding and head keep no activations for a layer's backward: no recompute, and no
// activation offload.
std::vector<LayerStrategy> embedding_candidates(const ModelSpec& m, const ClusterSpec& c, int D,
                                                int Bm, const SpaceFilter& f) {
  return strategies(m, c, D, Bm, f, {Recompute::none}, f.offload ? 4 : 1, /*experts=*/false);
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
         a.emb_fetch_bytes <= b.emb_fetch_bytes && a.head_fetch_bytes <= b.head_fetch_bytes &&
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
  src.samples = from_samples;
  src.boundary = boundary_activation_bytes(tables.model(), from, from_samples, tables.dtype());
  std::vector<double> out(size_t(prob.num_classes), 0.0);
  std::vector<char> seen(out.size(), 0);
  for (const auto& it : prob.items) {
    if (seen[it.cls]) continue;
    seen[it.cls] = 1;
    // The class representative: the largest boundary of that tp among the costs.
    const LayerCost* rep = &costs[it.id];
    for (const auto& lc : costs)
      if (lc.st.stream_tp() == rep->st.stream_tp() && lc.boundary > rep->boundary) rep = &lc;
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
  // Reshard classes: how the stream is held (LayerStrategy::stream_tp), represented by the
  // largest boundary.
  std::vector<int> tps;
  std::vector<const LayerCost*> rep;
  std::vector<int> cls;
  for (const auto& lc : costs) {
    auto it = std::find(tps.begin(), tps.end(), lc.st.stream_tp());
    int c = int(it - tps.begin());
    if (it == tps.end()) tps.push_back(lc.st.stream_tp()), rep.push_back(&lc);
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
