// One configuration (pp, Bm, schedule, v): the stage DPs, the partition per embedding strategy,
// and the plans they yield (see searcher.hpp).
#include <cmath>
#include <cstdio>

#include "src/search/searcher.hpp"

namespace stratagem::search_detail {

void Searcher::search_config(const Config& cf) {
  const PairData& pd = pair(cf.pp, cf.Bm);
  const int pp = cf.pp, L = m_.layers, v = cf.v, M = cf.M;
  if (pd.emb.empty()) return;
  const int n_max = n_max_of(L, pp, v);
  const int64_t bucket = bucket_;
  // One DP per distinct (in-flight count, placement), built at once on the workers.
  std::map<std::pair<double, int>, int> type_index;
  std::vector<std::pair<double, int>> types;
  std::vector<int> stage_type(pp);
  for (int s = 0; s < pp; ++s) {
    auto key = std::make_pair(in_flight(cf, s), pd.stage_geo[s]);
    auto it = type_index.emplace(key, int(types.size())).first;
    if (it->second == int(types.size())) types.push_back(key);
    stage_type[s] = it->second;
  }
  std::vector<std::unique_ptr<StageDp>> dps(types.size());
  workers_->run(int(types.size()), [&](int i) {
    const auto [k, gi] = types[size_t(i)];
    // The memory axis reaches a quarter beyond the budget: room for build()'s widening.
    dps[size_t(i)] = std::make_unique<StageDp>(stage_problem(
        tables_, pd.geos[gi].items, M, k, n_max, bucket, net_budget_ + net_budget_ / 4,
        o_.max_tr_classes, o_.max_kept_levels, o_.exact_dp));
  });
  for (const auto& dp : dps) local_dp_cells_ += int64_t(dp->cells());
  // Stage cost of n layers under embedding strategy e.
  struct StageAnswer {
    StageDp::Answer a;
    double cost = kInf;
  };
  auto emb_states = [&](int s, const EmbeddingCost& e) -> int64_t {
    if (pp == 1) return e.only_states;
    if (s == 0) return e.first_states;
    if (s == pp - 1) return e.last_states;
    return 0;
  };
  auto emb_cost = [&](int s, const EmbeddingCost& e) -> double {
    if (pp == 1) return M * (e.first_busy_s + e.last_busy_s) + e.only_tail_s;
    if (s == 0) return M * e.first_busy_s + e.first_tail_s;
    if (s == pp - 1) return M * e.last_busy_s + e.last_tail_s;
    return 0;
  };
  // Stage 0's first layer reshards from the embedding (per embedding strategy, cached).
  std::map<int, std::vector<double>> entry_cache;
  auto entry = [&](int ei) -> const std::vector<double>& {
    auto it = entry_cache.find(ei);
    if (it != entry_cache.end()) return it->second;
    const EmbeddingCost& e = pd.emb[ei];
    return entry_cache[ei] = entry_costs(tables_, pd.geos[pd.stage_geo[0]].items,
                                         dps[stage_type[0]]->problem(), e.st, e.samples, M);
  };
  auto stage_answer = [&](int s, int n, int ei, int64_t shrink) {
    const EmbeddingCost& e = pd.emb[ei];
    StageAnswer r;
    const int64_t room = net_budget_ - emb_states(s, e) - shrink;
    const int64_t xtr = e.transient(s, pp);
    const int64_t xws = (s == 0 || s == pp - 1) ? e.workspace : 0;
    r.a = dps[stage_type[s]]->best(n, room, xtr, xws, s == 0 ? &entry(ei) : nullptr);
    // On the DP's grid, so that equal stage costs stay equal (stage_dp.hpp).
    if (r.a.cost < kInf) r.cost = r.a.cost + dps[stage_type[s]]->quantize(emb_cost(s, e));
    return r;
  };

  const double bubble_weight = 1.0 / (double(M) * v);
  // Layer counts a stage can hold (pp == 1: all of them).
  const int n_lo = pp == 1 ? L : v;
  // A stage's DP answers for every layer count depend on the embedding strategy only through
  // the memory caps it leaves each DP threshold (whole buckets) and, on stage 0, the entry
  // costs: strategies that agree on them share one row of answers.
  std::map<std::vector<double>, int> entry_ids;
  std::vector<int> entry_id(pd.emb.size(), -1);
  auto entry_key = [&](int ei) {
    if (entry_id[ei] < 0)
      entry_id[ei] = entry_ids.emplace(entry(ei), int(entry_ids.size())).first->second;
    return entry_id[ei];
  };
  std::map<std::pair<std::pair<int, int>, std::vector<int64_t>>, std::vector<double>> rows;
  // While `pending` is set, dp_row only lists the rows it is asked for (their answers are
  // computed on the workers afterwards, each into its own row).
  struct Pending {
    std::vector<double>* row;
    int s;
    std::vector<int64_t> caps;
    const std::vector<double>* ent;
  };
  std::vector<Pending>* pending = nullptr;
  auto dp_row = [&](int s, const std::vector<int64_t>& caps, int eid,
                    const std::vector<double>* ent) -> const std::vector<double>& {
    auto& row = rows[{{s == 0 ? -1 - stage_type[s] : stage_type[s], eid}, caps}];
    if (row.empty()) {
      row.assign(size_t(n_max) + 1, kInf);
      if (pending)
        pending->push_back({&row, s, caps, ent});
      else
        dps[stage_type[s]]->best_costs(caps, ent, n_lo, n_max, row);
    }
    return row;
  };
  // Rows of one DP under equal caps (stage 0's under embedding strategies that differ only in
  // their entry costs) are answered in one pass, and all the caps asked of one DP together (a
  // part of them per thread), so that its table is read once for them.
  auto solve_pending = [&](std::vector<Pending>& list) {
    std::map<std::pair<int, std::vector<int64_t>>, std::vector<StageDp::CostRow>> groups;
    for (const Pending& p : list) groups[{stage_type[p.s], p.caps}].push_back({p.ent, p.row});
    std::vector<std::vector<StageDp::CostQuery>> by_dp(dps.size());
    for (const auto& [key, rows_of] : groups)
      by_dp[size_t(key.first)].push_back({&key.second, rows_of});
    struct Task {
      int dp;
      std::vector<StageDp::CostQuery> queries;
    };
    std::vector<Task> tasks;
    const size_t threads = size_t(workers_->threads());
    for (size_t d = 0; d < by_dp.size(); ++d) {
      const auto& qs = by_dp[d];
      const size_t parts = std::min(qs.size(), threads);
      for (size_t p = 0; p < parts; ++p)
        tasks.push_back({int(d), std::vector<StageDp::CostQuery>(
                                     qs.begin() + long(qs.size() * p / parts),
                                     qs.begin() + long(qs.size() * (p + 1) / parts))});
    }
    workers_->run(int(tasks.size()), [&](int i) {
      const Task& task = tasks[size_t(i)];
      dps[size_t(task.dp)]->best_costs(task.queries, n_lo, n_max);
    });
  };
  // The row of stage s under embedding strategy ei (stage_answer(s, n, ei, 0).cost for all n).
  auto stage_row = [&](int s, int ei, std::vector<double>& out) {
    const EmbeddingCost& e = pd.emb[ei];
    const int64_t xws = (s == 0 || s == pp - 1) ? e.workspace : 0;
    const auto caps =
        dps[stage_type[s]]->caps(net_budget_ - emb_states(s, e), e.transient(s, pp), xws);
    const auto& row =
        s == 0 ? dp_row(s, caps, entry_key(ei), &entry(ei)) : dp_row(s, caps, -1, nullptr);
    const double c = dps[stage_type[s]]->quantize(emb_cost(s, e));
    for (int n = 0; n <= n_max; ++n) out[n] = row[n] < kInf ? row[n] + c : kInf;
  };
  // Middle stages do not depend on the embedding strategy.
  std::vector<std::vector<double>> T(pp, std::vector<double>(n_max + 1, kInf));
  // Every row the code below reads, solved at once on the workers first: the middle stages',
  // the end stages' at their least (for s0) and under each embedding strategy.
  std::vector<double> least;
  for (int ei = 0; ei < int(pd.emb.size()); ++ei) {
    const auto& x = entry(ei);
    if (least.empty()) least = x;
    for (size_t c = 0; c < x.size(); ++c) least[c] = std::min(least[c], x[c]);
  }
  const std::vector<int> ends = pp == 1 ? std::vector<int>{0} : std::vector<int>{0, pp - 1};
  {
    std::vector<Pending> list;
    pending = &list;
    std::vector<double> scratch(size_t(n_max) + 1);
    for (int s = 1; s + 1 < pp; ++s) stage_row(s, 0, scratch);
    for (int s : ends) {
      const auto caps = dps[stage_type[s]]->caps(net_budget_, 0, 0);
      s == 0 ? dp_row(s, caps, -2, &least) : dp_row(s, caps, -1, nullptr);
    }
    for (int ei = 0; ei < int(pd.emb.size()); ++ei)
      for (int s : ends) stage_row(s, ei, scratch);
    pending = nullptr;
    solve_pending(list);
  }
  for (int s = 1; s + 1 < pp; ++s) stage_row(s, 0, T[s]);
  // The partition objective of every embedding strategy has a lower bound that needs no
  // partition: with the end stages' rows at their least (the whole budget, no reserve, the
  // least entry costs), the least stage sum is S0, so the strategy's sum is at least
  // S0 + its own embedding costs, its slowest stage at least that sum / pp and at least each
  // stage's cheapest row entry, and the objective (1 - w) max + w sum (w in [0, 1]) at least
  // that of the bounds. Strategies are solved in increasing bound; once a bound exceeds the
  // best objective found (beyond rounding), no later strategy can win. Ties go to the lowest
  // index, as in index order.
  double s0 = kInf;
  {
    auto T0 = T;
    for (int s : ends) {
      const auto caps = dps[stage_type[s]]->caps(net_budget_, 0, 0);
      T0[s] = s == 0 ? dp_row(s, caps, -2, &least) : dp_row(s, caps, -1, nullptr);
    }
    s0 = min_sum_partition(T0, L, v);
  }
  std::vector<std::vector<std::vector<double>>> end_rows(pd.emb.size());
  std::vector<std::pair<double, int>> order;
  for (int ei = 0; ei < int(pd.emb.size()); ++ei) {
    auto& er = end_rows[ei];
    double c = 0, mx = 0;
    for (int s : ends) {
      er.emplace_back(size_t(n_max) + 1, kInf);
      stage_row(s, ei, er.back());
      c += emb_cost(s, pd.emb[ei]);
      mx = std::max(mx, *std::min_element(er.back().begin(), er.back().end()));
    }
    for (int s = 1; s + 1 < pp; ++s) mx = std::max(mx, *std::min_element(T[s].begin(), T[s].end()));
    double lb = kInf;
    if (s0 < kInf && mx < kInf) {
      const double sum = s0 + c;
      mx = std::max(mx, sum / pp);
      lb = mx + bubble_weight * (sum - mx);
    }
    order.push_back({lb, ei});
  }
  std::sort(order.begin(), order.end());
  int best_e = -1;
  double best_obj = kInf;
  std::vector<int> best_part;
  for (const auto& [lb, ei] : order) {
    if (lb == kInf || lb > best_obj * (1 + 1e-9)) break;
    for (size_t k = 0; k < ends.size(); ++k) T[ends[k]] = end_rows[ei][k];
    double obj = kInf;
    std::vector<int> part = solve_partition(T, L, v, bubble_weight, &obj);
    if (!part.empty() && (obj < best_obj || (obj == best_obj && ei < best_e)))
      best_obj = obj, best_e = ei, best_part = part;
  }
  if (best_e < 0) return;
  const EmbeddingCost& e = pd.emb[best_e];

  // Builds, scores and offers the plan of a partition. The DP's memory model is conservative
  // (buckets rounded up, transient peaks bounded as if every later layer's activations were
  // alive), so when the estimator finds room left in a stage, that stage's DP budget is widened
  // by the gap and the plan rebuilt; a stage over the budget is narrowed by its overshoot. The
  // best plan that fits is kept (at most six rounds).
  const double frag = 1.0 + c_.gpu.allocator_fragmentation;
  const int64_t ctx = c_.gpu.context_overhead_bytes;
  auto build = [&](const std::vector<int>& part) {
    std::vector<int64_t> shift(pp, 0);  // DP room beyond the budget (negative: less)
    std::vector<int64_t> reserved(pp, 0);
    bool probed = false;
    std::vector<std::vector<std::vector<int>>> seen;
    for (int attempt = 0; attempt < 6; ++attempt) {
      std::vector<std::vector<int>> ids(pp);
      std::vector<int64_t> model(pp, 0);
      bool ok = true;
      for (int s = 0; s < pp && ok; ++s) {
        const auto r = stage_answer(s, part[s], best_e, -shift[s]);
        if (r.cost == kInf) {
          ok = false;
          break;
        }
        ids[s] = dps[stage_type[s]]->reconstruct(part[s], r.a, &model[s]);
        reserved[s] = r.a.reserved;
        model[s] += emb_states(s, e);
        // Inside each run of one tp (first and last layer fixed: they carry the pass-end
        // costs), larger transient peaks first: a layer's peak sits on the activations of the
        // layers before it only.
        const GeoData& gd = pd.geos[pd.stage_geo[s]];
        auto& q = ids[s];
        for (size_t i = 1; i + 1 < q.size();) {
          size_t j = i;
          while (j + 1 < q.size() - 1 && gd.items[q[j + 1]].st.tp == gd.items[q[i]].st.tp) ++j;
          std::stable_sort(q.begin() + long(i), q.begin() + long(j) + 1, [&](int a, int b) {
            return gd.items[a].transient > gd.items[b].transient;
          });
          i = j + 1;
        }
      }
      if (!ok || std::find(seen.begin(), seen.end(), ids) != seen.end()) break;
      seen.push_back(ids);
      std::vector<std::vector<LayerStrategy>> seqs(pp);
      for (int s = 0; s < pp; ++s)
        for (int id : ids[s]) seqs[s].push_back(pd.geos[pd.stage_geo[s]].items[id].st);
      Plan p = assemble(m_, o_, pp, cf.sched, v, cf.Bm, part, seqs, e.st);
      Scored sc = score(m_, c_, p, o_.framework);
      ++local_scored_;
      evaluated_.record(p, sc.time, sc.tokens, sc.peak, "dp");
      // The bound holds for the plans that fit (it assumes the budget).
      if (fits(sc) && sc.time < cf.lb * (1 - 1e-9)) ++local_violations_;
      min_memory_.offer(p, sc, "dp");
      bool changed = false;
      if (fits(sc)) {
        if (full_.wants(sc.time)) full_.offer(make_candidate(p, sc, "dp"));
        for (int s = 0; s < pp; ++s) {
          const int64_t truth = int64_t(double(sc.stage_peaks[s] - ctx) / frag);
          // The model overstates a stage by at most its reserved transient peak (a layer's peak
          // may sit on far fewer activations than all of them): probe that once, then follow
          // the measured gap.
          const int64_t gap = std::max(model[s] - truth, probed ? int64_t(0) : reserved[s]);
          if (gap > shift[s] + bucket) shift[s] = gap, changed = true;
        }
        probed = true;
      } else {
        for (int s = 0; s < pp; ++s)
          if (sc.stage_peaks[s] > budget_)
            shift[s] -= int64_t(double(sc.stage_peaks[s] - budget_) / frag) + bucket,
                changed = true;
      }
      if (!changed) break;
    }
  };
  build(best_part);
  // The even partition (Megatron's), when it differs and fits the DP's model.
  std::vector<int> even(pp, 0);
  {
    const auto ch = even_chunks(L, pp * v);
    for (int c = 0; c < pp * v; ++c) even[c % pp] += ch[c].size();
  }
  if (even != best_part) {
    bool ok = true;
    for (int s = 0; s < pp && ok; ++s)
      ok = even[s] <= n_max && stage_answer(s, even[s], best_e, 0).cost < kInf;
    if (ok) build(even);
  }
}

// The least-memory plan of a configuration (only when nothing fits): every stage uses its
// least-memory layer strategy, the embedding its least-memory one, and the partition minimizes
// the largest stage.
void Searcher::min_memory_config(const Config& cf) {
  const PairData& pd = pair(cf.pp, cf.Bm);
  const int pp = cf.pp, L = m_.layers, v = cf.v;
  if (pd.emb.empty()) return;
  const int n_max = n_max_of(L, pp, v);
  const EmbeddingCost* e = nullptr;
  for (const auto& x : pd.emb) {
    auto size = [&](const EmbeddingCost& y) {
      return pp == 1 ? y.only_states + y.transient(0, 1) + y.workspace
                     : std::max(y.first_states + y.transient(0, pp) + y.workspace,
                                y.last_states + y.transient(pp - 1, pp) + y.workspace);
    };
    if (!e || size(x) < size(*e)) e = &x;
  }
  std::vector<std::vector<double>> Mem(pp, std::vector<double>(n_max + 1, kInf));
  std::vector<const LayerCost*> pick(pp, nullptr);
  for (int s = 0; s < pp; ++s) {
    const double k = in_flight(cf, s);
    auto resident = [&](const LayerCost& lc) { return double(lc.states) + k * double(lc.kept); };
    for (const auto& lc : pd.geos[pd.stage_geo[s]].items)
      if (!pick[s] || resident(lc) + double(lc.transient + lc.workspace) <
                          resident(*pick[s]) + double(pick[s]->transient + pick[s]->workspace))
        pick[s] = &lc;
    const double fixed = pp == 1  ? double(e->only_states + e->transient(0, 1) + e->workspace)
                         : s == 0 ? double(e->first_states + e->transient(0, pp) + e->workspace)
                         : s == pp - 1 ? double(e->last_states + e->transient(s, pp) + e->workspace)
                                       : 0.0;
    for (int n = v; n <= n_max; ++n)
      Mem[s][n] = fixed + n * resident(*pick[s]) + double(pick[s]->transient + pick[s]->workspace);
  }
  const auto part = solve_partition(Mem, L, v, 0.0);
  if (part.empty()) return;
  std::vector<std::vector<LayerStrategy>> seqs(pp);
  for (int s = 0; s < pp; ++s) seqs[s].assign(part[s], pick[s]->st);
  Plan p = assemble(m_, o_, pp, cf.sched, v, cf.Bm, part, seqs, e->st);
  Scored sc = score(m_, c_, p, o_.framework);
  ++local_scored_;
  min_memory_.offer(p, sc, "dp");
}

}  // namespace stratagem::search_detail
