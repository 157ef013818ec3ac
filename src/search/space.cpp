// The search space: pipeline degrees, micro-batch sizes, schedules and their configurations,
// the per-(pp, Bm) cost tables, and the plan a configuration's choices assemble into.
#include <set>

#include "src/search/searcher.hpp"

namespace stratagem::search_detail {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<int> chunk_sizes(int n, int v) {
  std::vector<int> out;
  for (const auto& r : even_chunks(n, v)) out.push_back(r.size());
  return out;
}

Plan assemble(const ModelSpec& m, const SearchOptions& o, int pp, Schedule sched, int v, int Bm,
              const std::vector<int>& totals, const std::vector<std::vector<LayerStrategy>>& seqs,
              const LayerStrategy& emb) {
  Plan p;
  p.pp = pp;
  p.schedule = sched;
  p.vpp = sched == Schedule::interleaved ? v : 1;
  p.global_batch = o.global_batch;
  p.dtype = o.dtype;
  p.flash_attention = o.flash_attention;
  p.overlap_grad_reduce = o.overlap_grad_reduce;
  p.embedding = emb;
  p.layers.assign(m.layers, LayerStrategy{});
  std::vector<std::vector<int>> sizes(pp);
  for (int s = 0; s < pp; ++s) sizes[s] = chunk_sizes(totals[s], v);
  std::vector<int> used(pp, 0);
  int at = 0;
  for (int c = 0; c < pp * v; ++c) {
    const int s = c % pp, i = c / pp;
    const int n = sizes[s][i];
    p.chunks.push_back({at, at + n});
    for (int k = 0; k < n; ++k) {
      LayerStrategy l = seqs[s][used[s]++];
      // The search prices an MoE model's layers as MoE layers; its dense layers have no
      // experts to spread.
      if (!m.is_moe_layer(at + k)) l.ep = l.etp = 1;
      p.layers[at + k] = l;
    }
    at += n;
  }
  int max_dp = emb.dp;
  for (const auto& l : p.layers) max_dp = std::max(max_dp, l.dp);
  p.micro_batch = Bm / max_dp;
  return p;
}

std::vector<int> pp_list(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o) {
  std::vector<int> out;
  for (int pp : divisors(c.world_size())) {
    if (pp > m.layers) continue;
    if (!o.pp_degrees.empty() && !contains(o.pp_degrees, pp)) continue;
    out.push_back(pp);
  }
  return out;
}

std::vector<int> bm_list(const SearchOptions& o) {
  std::vector<int> out;
  for (int b : divisors(o.global_batch)) {
    if (!o.micro_batches.empty() && !contains(o.micro_batches, b)) continue;
    out.push_back(b);
  }
  return out;
}

std::vector<Config> Searcher::configs() const {
  std::vector<Config> out;
  const int world = c_.world_size();
  for (int pp : pp_list(m_, c_, o_)) {
    const int D = world / pp;
    for (int Bm : bm_list(o_))
      for (int cpg = 0; cpg < int(cp_groups_.size()); ++cpg) {
        if (tp_degrees_for(m_, c_, D, Bm, filter_for(cpg)).empty()) continue;
        const int M = o_.global_batch / Bm;
        for (Schedule sch : o_.schedules) {
          std::vector<int> vs{1};
          if (sch == Schedule::gpipe && pp == 1) continue;  // 1f1b with more memory in flight
          if (splits_backward(sch)) continue;  // variants of the best plans (zero_bubble.cpp)
          if (sch == Schedule::interleaved) {
            if (pp < 2 || M < pp) continue;  // groups of micro-batches: interleaved_group
            vs.clear();
            for (int v : o_.vpp_degrees)
              if (v >= 2 && pp * v <= m_.layers) vs.push_back(v);
          }
          for (int v : vs) {
            Config cf;
            cf.pp = pp, cf.Bm = Bm, cf.M = M, cf.v = v, cf.sched = sch, cf.cpg = cpg;
            cf.order = int(out.size());
            out.push_back(cf);
          }
        }
      }
  }
  return out;
}

const PairData& Searcher::pair(int pp, int Bm, int cpg) {
  return pair_mutable(pp, Bm, cpg);
}

PairData& Searcher::pair_mutable(int pp, int Bm, int cpg) {
  // (run() makes every configuration's slot before its tasks fill them: they only look up.)
  const auto key = std::make_tuple(pp, Bm, cpg);
  auto it = pairs_.find(key);
  auto& slot = it != pairs_.end() ? it->second : pairs_[key];
  if (slot) return *slot;
  slot = std::make_unique<PairData>();
  PairData& pd = *slot;
  pd.pp = pp, pd.Bm = Bm, pd.D = c_.world_size() / pp;
  const SpaceFilter filter = filter_for(cpg);
  const int cp = filter.cp;
  pd.tps = tp_degrees_for(m_, c_, pd.D, Bm, filter);
  Geometry geo;
  geo.gpus_per_node = std::max(1, c_.node.gpus_per_node);
  geo.devices_per_stage = pd.D;
  const auto raw = layer_candidates(m_, c_, pd.D, Bm, filter);
  std::map<std::vector<int>, int> sig_index;
  for (int s = 0; s < pp; ++s) {
    auto sig = geo.signature(s, pd.tps, cp);
    auto it = sig_index.find(sig);
    if (it != sig_index.end()) {
      pd.stage_geo.push_back(it->second);
      continue;
    }
    const int gi = int(pd.geos.size());
    sig_index[sig] = gi;
    pd.stage_geo.push_back(gi);
    std::vector<LayerCost> costs;
    costs.reserve(raw.size());
    for (const auto& st : raw) {
      costs.push_back(tables_.layer(st, Bm / st.dp, geo.tp_nodes(s, st.tp), geo.dp_nodes(s, st.tp),
                                    cost_detail::moe_nodes(geo, s, st, m_.moe.enabled()),
                                    geo.cp_nodes(s, st.tp, cp)));
      // Beside a pipeline, a send and a receive of the stream in flight (as the estimator).
      if (pp > 1) costs.back().workspace = costs.back().pipelined_workspace;
    }
    pd.raw_layers += int64_t(costs.size());
    GeoData gd;
    gd.items = prune_dominated(std::move(costs));
    pd.kept_layers += int64_t(gd.items.size());
    pd.geos.push_back(std::move(gd));
  }
  {
    std::set<int64_t> bytes;
    for (const auto& gd : pd.geos)
      for (const auto& lc : gd.items) bytes.insert(lc.boundary);
    for (int64_t b : bytes)
      for (int same = 0; same < 2; ++same)
        pd.p2p_min_s[same] =
            std::min(pd.p2p_min_s[same], tables_.cost().fabric().p2p_cost(b, same == 1).time_s());
  }
  // Embedding strategies: the first stage's placement for the embedding, the last's for the head.
  std::vector<EmbeddingCost> emb;
  for (const auto& st : embedding_candidates(m_, c_, pd.D, Bm, filter))
    emb.push_back(tables_.embedding(st, Bm / st.dp, geo, pp));
  pd.emb = prune_dominated(std::move(emb));
  return pd;
}

}  // namespace stratagem::search_detail
