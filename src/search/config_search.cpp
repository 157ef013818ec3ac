// One configuration (pp, Bm, schedule, v): the stage DPs, the partition per embedding strategy,
// and the plans they yield (see searcher.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>

#include "src/search/searcher.hpp"

namespace stratagem::search_detail {

// One configuration's search, in the order run() takes it: the stage DPs (build_dps), every row
// of DP answers the partition needs solved at once on the workers (solve_rows), the embedding
// strategies in increasing bound (strategy_order), the partition of the best one
// (best_partition), and the plans of that partition and of the even one (build).
class ConfigSearch {
 public:
  ConfigSearch(const ConfigSearchContext& context, const Config& cf, const PairData& pd)
      : context_(context),
        cf_(cf),
        pair_data_(pd),
        pp_(cf.pp),
        layer_count_(context.m.layers),
        v_(cf.v),
        microbatch_count_(cf.M),
        n_max_(n_max_of(layer_count_, pp_, v_)),
        n_lo_(pp_ == 1 ? layer_count_ : v_),
        bubble_weight_(1.0 / (double(microbatch_count_) * v_)),
        ends_(pp_ == 1 ? std::vector<int>{0} : std::vector<int>{0, pp_ - 1}) {}

  void run() {
    if (pair_data_.emb.empty()) return;
    build_dps();
    solve_rows();
    int best_e = -1;
    std::vector<int> best_part;
    if (!best_partition(&best_e, &best_part)) return;
    build(best_part, best_e);
    // The even partition (Megatron's), when it differs and fits the DP's model.
    std::vector<int> even(pp_, 0);
    const auto ch = even_chunks(layer_count_, pp_ * v_);
    for (int c = 0; c < pp_ * v_; ++c) even[c % pp_] += ch[c].size();
    if (even == best_part) return;
    for (int s = 0; s < pp_; ++s)
      if (even[s] > n_max_ || stage_answer(s, even[s], best_e, 0).cost == kInf) return;
    build(even, best_e);
  }

 private:
  // Stage cost of n layers under embedding strategy e.
  struct StageAnswer {
    StageDp::Answer a;
    double cost = kInf;
  };
  // A row dp_row was asked for while rows are being listed: solved on the workers afterwards.
  struct Pending {
    std::vector<double>* row;
    int s;
    std::vector<int64_t> caps;
    const std::vector<double>* ent;
  };

  // One DP per distinct (in-flight count, placement), built at once on the workers.
  void build_dps() {
    std::map<std::pair<double, int>, int> type_index;
    std::vector<std::pair<double, int>> types;
    stage_type_.assign(pp_, 0);
    for (int s = 0; s < pp_; ++s) {
      auto key = std::make_pair(in_flight(cf_, s), pair_data_.stage_geo[s]);
      auto it = type_index.emplace(key, int(types.size())).first;
      if (it->second == int(types.size())) types.push_back(key);
      stage_type_[s] = it->second;
    }
    dps_.resize(types.size());
    context_.workers.run(int(types.size()), [&](int i) {
      const auto [k, gi] = types[size_t(i)];
      // The memory axis reaches a quarter beyond the budget: room for build()'s widening.
      dps_[size_t(i)] = std::make_unique<StageDp>(stage_problem(
          context_.tables, pair_data_.geos[gi].items, microbatch_count_, k, n_max_, context_.bucket,
          context_.net_budget + context_.net_budget / 4, context_.o.max_tr_classes,
          context_.o.max_kept_levels, context_.o.exact_dp));
    });
    for (const auto& dp : dps_) context_.dp_cells += int64_t(dp->cells());
  }
  StageDp& dp_of(int s) const { return *dps_[size_t(stage_type_[s])]; }

  int64_t emb_states(int s, const EmbeddingCost& e) const {
    if (pp_ == 1) return e.only_states;
    if (s == 0) return e.first_states;
    if (s == pp_ - 1) return e.last_states;
    return 0;
  }
  double emb_cost(int s, const EmbeddingCost& e) const {
    if (pp_ == 1) return microbatch_count_ * (e.first_busy_s + e.last_busy_s) + e.only_tail_s;
    if (s == 0) return microbatch_count_ * e.first_busy_s + e.first_tail_s;
    if (s == pp_ - 1) return microbatch_count_ * e.last_busy_s + e.last_tail_s;
    return 0;
  }
  int64_t emb_workspace(int s, const EmbeddingCost& e) const {
    return (s == 0 || s == pp_ - 1) ? e.workspace : 0;
  }

  // Stage 0's first layer reshards from the embedding (per embedding strategy, cached).
  const std::vector<double>& entry(int ei) {
    auto it = entry_cache_.find(ei);
    if (it != entry_cache_.end()) return it->second;
    const EmbeddingCost& e = pair_data_.emb[ei];
    return entry_cache_[ei] =
               entry_costs(context_.tables, pair_data_.geos[pair_data_.stage_geo[0]].items,
                           dp_of(0).problem(), e.st, e.samples, microbatch_count_);
  }
  // A stage's DP answers for every layer count depend on the embedding strategy only through
  // the memory caps it leaves each DP threshold (whole buckets) and, on stage 0, the entry
  // costs: strategies that agree on them share one row of answers.
  int entry_key(int ei) {
    if (entry_id_.empty()) entry_id_.assign(pair_data_.emb.size(), -1);
    if (entry_id_[ei] < 0)
      entry_id_[ei] = entry_ids_.emplace(entry(ei), int(entry_ids_.size())).first->second;
    return entry_id_[ei];
  }

  StageAnswer stage_answer(int s, int n, int ei, int64_t shrink) {
    const EmbeddingCost& e = pair_data_.emb[ei];
    StageAnswer r;
    const int64_t room = context_.net_budget - emb_states(s, e) - shrink;
    r.a = dp_of(s).best(n, room, e.transient(s, pp_), emb_workspace(s, e),
                        s == 0 ? &entry(ei) : nullptr);
    // On the DP's grid, so that equal stage costs stay equal (stage_dp.hpp).
    if (r.a.cost < kInf) r.cost = r.a.cost + dp_of(s).quantize(emb_cost(s, e));
    return r;
  }

  // While pending_ is set, dp_row only lists the rows it is asked for (their answers are
  // computed on the workers afterwards, each into its own row).
  const std::vector<double>& dp_row(int s, const std::vector<int64_t>& caps, int eid,
                                    const std::vector<double>* ent) {
    auto& row = rows_[{{s == 0 ? -1 - stage_type_[s] : stage_type_[s], eid}, caps}];
    if (row.empty()) {
      row.assign(size_t(n_max_) + 1, kInf);
      if (pending_)
        pending_->push_back({&row, s, caps, ent});
      else
        dp_of(s).best_costs(caps, ent, n_lo_, n_max_, row);
    }
    return row;
  }
  // An end stage's row with the whole budget, no reserve and (stage 0) the least entry costs.
  const std::vector<double>& least_row(int s) {
    const auto caps = dp_of(s).caps(context_.net_budget, 0, 0);
    return s == 0 ? dp_row(s, caps, -2, &least_entry_) : dp_row(s, caps, -1, nullptr);
  }

  // Rows of one DP under equal caps (stage 0's under embedding strategies that differ only in
  // their entry costs) are answered in one pass, and all the caps asked of one DP together (a
  // part of them per thread), so that its table is read once for them.
  void solve_pending(std::vector<Pending>& list) {
    std::map<std::pair<int, std::vector<int64_t>>, std::vector<StageDp::CostRow>> groups;
    for (const Pending& p : list) groups[{stage_type_[p.s], p.caps}].push_back({p.ent, p.row});
    std::vector<std::vector<StageDp::CostQuery>> by_dp(dps_.size());
    for (const auto& [key, rows_of] : groups)
      by_dp[size_t(key.first)].push_back({&key.second, rows_of});
    struct Task {
      int dp;
      std::vector<StageDp::CostQuery> queries;
    };
    std::vector<Task> tasks;
    const size_t threads = size_t(context_.workers.threads());
    for (size_t d = 0; d < by_dp.size(); ++d) {
      const auto& qs = by_dp[d];
      const size_t parts = std::min(qs.size(), threads);
      for (size_t p = 0; p < parts; ++p)
        tasks.push_back({int(d), std::vector<StageDp::CostQuery>(
                                     qs.begin() + long(qs.size() * p / parts),
                                     qs.begin() + long(qs.size() * (p + 1) / parts))});
    }
    context_.workers.run(int(tasks.size()), [&](int i) {
      const Task& task = tasks[size_t(i)];
      dps_[size_t(task.dp)]->best_costs(task.queries, n_lo_, n_max_);
    });
  }

  // The row of stage s under embedding strategy ei (stage_answer(s, n, ei, 0).cost for all n).
  void stage_row(int s, int ei, std::vector<double>& out) {
    const EmbeddingCost& e = pair_data_.emb[ei];
    const auto caps = dp_of(s).caps(context_.net_budget - emb_states(s, e), e.transient(s, pp_),
                                    emb_workspace(s, e));
    const auto& row =
        s == 0 ? dp_row(s, caps, entry_key(ei), &entry(ei)) : dp_row(s, caps, -1, nullptr);
    const double c = dp_of(s).quantize(emb_cost(s, e));
    for (int n = 0; n <= n_max_; ++n) out[n] = row[n] < kInf ? row[n] + c : kInf;
  }

  // Every row the partition reads, solved at once on the workers: the middle stages' (which do
  // not depend on the embedding strategy), the end stages' at their least and under each
  // embedding strategy.
  void solve_rows() {
    for (int ei = 0; ei < int(pair_data_.emb.size()); ++ei) {
      const auto& x = entry(ei);
      if (least_entry_.empty()) least_entry_ = x;
      for (size_t c = 0; c < x.size(); ++c) least_entry_[c] = std::min(least_entry_[c], x[c]);
    }
    std::vector<Pending> list;
    pending_ = &list;
    std::vector<double> scratch(size_t(n_max_) + 1);
    for (int s = 1; s + 1 < pp_; ++s) stage_row(s, 0, scratch);
    for (int s : ends_) least_row(s);
    for (int ei = 0; ei < int(pair_data_.emb.size()); ++ei)
      for (int s : ends_) stage_row(s, ei, scratch);
    pending_ = nullptr;
    solve_pending(list);
    stage_costs_.assign(pp_, std::vector<double>(n_max_ + 1, kInf));
    for (int s = 1; s + 1 < pp_; ++s) stage_row(s, 0, stage_costs_[s]);
  }

  // The partition objective of every embedding strategy has a lower bound that needs no
  // partition: with the end stages' rows at their least (least_row), the least stage sum is
  // S0, so the strategy's sum is at least S0 + its own embedding costs, its slowest stage at
  // least that sum / pp and at least each stage's cheapest row entry, and the objective
  // (1 - w) max + w sum (w in [0, 1]) at least that of the bounds. Returns (bound, strategy)
  // in increasing bound; fills end_rows_.
  std::vector<std::pair<double, int>> strategy_order() {
    double s0 = kInf;
    {
      auto least_end_costs = stage_costs_;
      for (int s : ends_) least_end_costs[s] = least_row(s);
      s0 = min_sum_partition(least_end_costs, layer_count_, v_);
    }
    end_rows_.assign(pair_data_.emb.size(), {});
    std::vector<std::pair<double, int>> order;
    for (int ei = 0; ei < int(pair_data_.emb.size()); ++ei) {
      auto& er = end_rows_[ei];
      double c = 0, mx = 0;
      for (int s : ends_) {
        er.emplace_back(size_t(n_max_) + 1, kInf);
        stage_row(s, ei, er.back());
        c += emb_cost(s, pair_data_.emb[ei]);
        mx = std::max(mx, *std::min_element(er.back().begin(), er.back().end()));
      }
      for (int s = 1; s + 1 < pp_; ++s)
        mx = std::max(mx, *std::min_element(stage_costs_[s].begin(), stage_costs_[s].end()));
      double lb = kInf;
      if (s0 < kInf && mx < kInf) {
        const double sum = s0 + c;
        mx = std::max(mx, sum / pp_);
        lb = mx + bubble_weight_ * (sum - mx);
      }
      order.push_back({lb, ei});
    }
    std::sort(order.begin(), order.end());
    return order;
  }

  // Strategies are solved in increasing bound; once a bound exceeds the best objective found
  // (beyond rounding), no later strategy can win. Ties go to the lowest index, as in index
  // order.
  bool best_partition(int* best_e, std::vector<int>* best_part) {
    double best_obj = kInf;
    for (const auto& [lb, ei] : strategy_order()) {
      if (lb == kInf || lb > best_obj * (1 + 1e-9)) break;
      for (size_t k = 0; k < ends_.size(); ++k) stage_costs_[ends_[k]] = end_rows_[ei][k];
      double obj = kInf;
      std::vector<int> part = solve_partition(stage_costs_, layer_count_, v_, bubble_weight_, &obj);
      if (!part.empty() && (obj < best_obj || (obj == best_obj && ei < *best_e)))
        best_obj = obj, *best_e = ei, *best_part = part;
    }
    return *best_e >= 0;
  }

  // Each stage's layer strategies (ids into its geometry's items) under the partition, its DP
  // budget moved by shift[s]: model[s] the memory the DP counts, reserved[s] its reserved
  // transient peak. False when a stage has no answer.
  bool stage_choices(const std::vector<int>& part, int ei, const std::vector<int64_t>& shift,
                     std::vector<std::vector<int>>& ids, std::vector<int64_t>& model,
                     std::vector<int64_t>& reserved) {
    for (int s = 0; s < pp_; ++s) {
      const auto r = stage_answer(s, part[s], ei, -shift[s]);
      if (r.cost == kInf) return false;
      ids[s] = dp_of(s).reconstruct(part[s], r.a, &model[s]);
      reserved[s] = r.a.reserved;
      model[s] += emb_states(s, pair_data_.emb[ei]);
      // Inside each run of one tp (first and last layer fixed: they carry the pass-end
      // costs), larger transient peaks first: a layer's peak sits on the activations of the
      // layers before it only.
      const GeoData& gd = pair_data_.geos[pair_data_.stage_geo[s]];
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
    return true;
  }

  // Builds, scores and offers the plan of a partition. The DP's memory model is conservative
  // (buckets rounded up, transient peaks bounded as if every later layer's activations were
  // alive), so when the estimator finds room left in a stage, that stage's DP budget is widened
  // by the gap and the plan rebuilt; a stage over the budget is narrowed by its overshoot. The
  // best plan that fits is kept (at most six rounds).
  void build(const std::vector<int>& part, int ei) {
    std::vector<int64_t> shift(pp_, 0);  // DP room beyond the budget (negative: less)
    std::vector<int64_t> reserved(pp_, 0);
    bool probed = false;
    std::vector<std::vector<std::vector<int>>> seen;
    for (int attempt = 0; attempt < 6; ++attempt) {
      std::vector<std::vector<int>> ids(pp_);
      std::vector<int64_t> model(pp_, 0);
      if (!stage_choices(part, ei, shift, ids, model, reserved)) break;
      if (std::find(seen.begin(), seen.end(), ids) != seen.end()) break;
      seen.push_back(ids);
      if (!offer(part, ei, ids, model, reserved, shift, probed)) break;
    }
  }

  // Scores the plan of these choices and offers it; moves each stage's DP budget by what the
  // estimator found. Returns whether any budget moved.
  bool offer(const std::vector<int>& part, int ei, const std::vector<std::vector<int>>& ids,
             const std::vector<int64_t>& model, const std::vector<int64_t>& reserved,
             std::vector<int64_t>& shift, bool& probed) {
    const int64_t bucket = context_.bucket;
    const double frag = 1.0 + context_.c.gpu.allocator_fragmentation;
    std::vector<std::vector<LayerStrategy>> seqs(pp_);
    for (int s = 0; s < pp_; ++s)
      for (int id : ids[s])
        seqs[s].push_back(pair_data_.geos[pair_data_.stage_geo[s]].items[id].st);
    Plan p = assemble(context_.m, context_.o, pp_, cf_.sched, v_, cf_.Bm, part, seqs,
                      pair_data_.emb[ei].st);
    Scored sc = score(context_.m, context_.c, p, context_.o.framework);
    ++context_.scored;
    context_.evaluated.record(p, sc.time, sc.tokens, sc.peak, "dp");
    // The bound holds for the plans that fit (it assumes the budget).
    if (context_.fits(sc) && sc.time < cf_.lb * (1 - 1e-9)) ++context_.violations;
    context_.min_memory.offer(p, sc, "dp");
    bool changed = false;
    if (context_.fits(sc)) {
      if (context_.full.wants(sc.time)) context_.full.offer(make_candidate(p, sc, "dp"));
      for (int s = 0; s < pp_; ++s) {
        const int64_t truth = sc.stage_net_bytes[s] - int64_t(double(context_.nccl_floor) / frag);
        // The model overstates a stage by at most its reserved transient peak (a layer's peak
        // may sit on far fewer activations than all of them): probe that once, then follow
        // the measured gap.
        const int64_t gap = std::max(model[s] - truth, probed ? int64_t(0) : reserved[s]);
        if (gap > shift[s] + bucket) shift[s] = gap, changed = true;
      }
      probed = true;
    } else {
      for (int s = 0; s < pp_; ++s)
        if (sc.stage_peaks[s] > context_.budget)
          shift[s] -= int64_t(double(sc.stage_peaks[s] - context_.budget) / frag) + bucket,
              changed = true;
    }
    return changed;
  }

  const ConfigSearchContext& context_;
  const Config& cf_;
  const PairData& pair_data_;
  const int pp_, layer_count_, v_, microbatch_count_, n_max_;
  const int n_lo_;  // layer counts a stage can hold start here (pp == 1: all of them)
  const double bubble_weight_;
  const std::vector<int> ends_;  // the stages holding the embedding and the head
  std::vector<int> stage_type_;  // [stage] its DP
  std::vector<std::unique_ptr<StageDp>> dps_;
  std::map<int, std::vector<double>> entry_cache_;  // [strategy] stage 0's entry costs
  std::vector<double> least_entry_;                 // the least entry costs of any strategy
  std::map<std::vector<double>, int> entry_ids_;
  std::vector<int> entry_id_;  // [strategy] its entry costs' id
  // Rows of DP answers by (DP, entry id) and caps.
  std::map<std::pair<std::pair<int, int>, std::vector<int64_t>>, std::vector<double>> rows_;
  std::vector<Pending>* pending_ = nullptr;
  std::vector<std::vector<double>> stage_costs_;  // [stage][layers] the partition's stage costs
  std::vector<std::vector<std::vector<double>>> end_rows_;  // [strategy] the end stages' rows
};

int64_t Searcher::nccl_floor(const Config& cf) const {
  const auto [cp, cp_tp] = cp_groups_[size_t(cf.cpg)];
  const int ranks = c_.world_size() / cf.pp / cp;  // tp x dp of a stage
  if (cf.pp * cf.v > m_.layers || ranks < 1) return 0;
  int64_t floor = std::numeric_limits<int64_t>::max();
  for (int t = 1; t <= ranks; t *= 2) {
    if ((cp > 1 && t != cp_tp) || ranks % t) continue;
    Plan p;
    p.pp = cf.pp, p.vpp = cf.v, p.schedule = cf.sched;
    p.chunks = even_chunks(m_.layers, cf.pp * cf.v);
    LayerStrategy st;
    st.tp = t, st.cp = cp, st.dp = ranks / t, st.cp_kind = CpKind::allgather;
    p.layers.assign(size_t(m_.layers), st);
    p.embedding = st;
    for (int s = 0; s < cf.pp; ++s)
      floor = std::min(floor, process_memory(m_, c_, p, s).nccl_buffers_bytes);
  }
  return floor == std::numeric_limits<int64_t>::max() ? 0 : floor;
}

void Searcher::search_config(const Config& cf) {
  const int64_t floor = nccl_floor(cf);
  const ConfigSearchContext context{
      .m = m_,
      .c = c_,
      .o = o_,
      .tables = tables_,
      .workers = *workers_,
      .budget = budget_,
      .net_budget = net_budget_ - int64_t(double(floor) / (1.0 + c_.gpu.allocator_fragmentation)),
      .bucket = bucket_,
      .nccl_floor = floor,
      .full = full_,
      .min_memory = min_memory_,
      .evaluated = evaluated_,
      .scored = local_scored_,
      .dp_cells = local_dp_cells_,
      .violations = local_violations_};
  ConfigSearch(context, cf, pair(cf.pp, cf.Bm, cf.cpg)).run();
}

// The least-memory plan of a configuration (only when nothing fits): every stage uses its
// least-memory layer strategy, the embedding its least-memory one, and the partition minimizes
// the largest stage.
void Searcher::min_memory_config(const Config& cf) {
  const PairData& pd = pair(cf.pp, cf.Bm, cf.cpg);
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
