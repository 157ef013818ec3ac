// The strategy search (see search.hpp for the overview).
//
// Work units. An outer configuration is (pp, Bm, schedule, v) where Bm is the number of samples
// a micro-batch carries through the pipeline (Plan::micro_batch x the widest dp) and
// M = global_batch / Bm the micro-batch count. Per (pp, Bm) every candidate layer strategy is
// costed once per stage placement (PairData) and pruned by dominance; every configuration with
// that pair reuses the costs, weighting them by its M and by each stage's in-flight count.
//
// Lower bound (best-first order and skipping). The estimator's iteration time is at least
//     ((M - 1/v)/pp + 1/v) * sum_s busy_s
// (M x the slowest stage's micro-batch time plus the fill and drain of the others), and a
// stage's busy time is at least its layers' LP-relaxed minimum under its memory budget, with the
// resident memory (model states + in-flight saved activations) that the estimator charges at
// least. The configurations are visited in increasing bound; one whose bound exceeds the K-th
// best plan found so far cannot enter the top K and is skipped.
//
// Per configuration: a stage DP (stage_dp.hpp) per distinct (in-flight count, placement), the
// partition solver per embedding strategy, then the plan of the best (embedding, partition) and
// the plan of the even partition are built and scored by the estimator. A plan the estimator
// finds over budget (the DP's memory model rounds up, but merges transient-memory classes) is
// repaired by shrinking the offending stage's budget (up to three times).
#include "stratagem/search.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "src/search/layer_costs.hpp"
#include "src/search/stage_dp.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/program.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem {

const char* to_string(SearchSpace s) {
  switch (s) {
    case SearchSpace::full:
      return "full";
    case SearchSpace::megatron:
      return "megatron";
    case SearchSpace::zero:
      return "zero";
  }
  return "?";
}

SearchSpace search_space_from_string(const std::string& s, const std::string& where) {
  if (s == "full") return SearchSpace::full;
  if (s == "megatron") return SearchSpace::megatron;
  if (s == "zero") return SearchSpace::zero;
  throw InputError(where + ": expected full|megatron|zero, got '" + s + "'");
}

namespace {

using namespace search_detail;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double gib(int64_t b) {
  return double(b) / double(int64_t(1) << 30);
}
std::string fmt_gib(int64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", gib(b));
  return buf;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}
bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
template <class T>
bool contains(const std::vector<T>& v, T x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Layer sizes of the v chunks of a stage holding n layers (earlier chunks take the remainder).
std::vector<int> chunk_sizes(int n, int v) {
  std::vector<int> out;
  for (const auto& r : even_chunks(n, v)) out.push_back(r.size());
  return out;
}

// A plan from stage totals and per-stage layer strategies (first layer of the stage first).
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
    for (int k = 0; k < n; ++k) p.layers[at + k] = seqs[s][used[s]++];
    at += n;
  }
  int max_dp = emb.dp;
  for (const auto& l : p.layers) max_dp = std::max(max_dp, l.dp);
  p.micro_batch = Bm / max_dp;
  return p;
}

// ---- the scorer ---------------------------------------------------------------------------

struct Scored {
  double time = kInf;
  double tokens = 0;
  int64_t peak = 0;
  std::vector<int64_t> stage_peaks;
};

Scored score(const ModelSpec& m, const ClusterSpec& c, const Plan& p) {
  CostModel cm(m, c, p);
  Estimate e = estimate(cm);
  Scored s;
  s.time = e.iteration_time_s;
  s.tokens = e.tokens_per_s;
  s.peak = e.peak_memory_bytes;
  for (const auto& st : e.stages) s.stage_peaks.push_back(st.peak_memory_bytes);
  return s;
}

SearchCandidate make_candidate(const Plan& p, const Scored& s, const char* origin) {
  SearchCandidate c;
  c.plan = p;
  c.key = to_json(p).dump();
  c.origin = origin;
  c.est_iteration_time_s = s.time;
  c.est_tokens_per_s = s.tokens;
  c.est_peak_memory_bytes = s.peak;
  c.est_stage_peak_bytes = s.stage_peaks;
  return c;
}

// The K best plans by (estimated time, key), distinct keys.
class TopK {
 public:
  explicit TopK(int k) : k_(std::max(1, k)) {}
  double kth_time() const { return int(v_.size()) < k_ ? kInf : v_.back().est_iteration_time_s; }
  bool wants(double t) const { return t <= kth_time(); }
  void offer(SearchCandidate c) {
    if (!wants(c.est_iteration_time_s)) return;
    for (const auto& x : v_)
      if (x.key == c.key) return;
    auto less = [](const SearchCandidate& a, const SearchCandidate& b) {
      if (a.est_iteration_time_s != b.est_iteration_time_s)
        return a.est_iteration_time_s < b.est_iteration_time_s;
      return a.key < b.key;
    };
    v_.insert(std::upper_bound(v_.begin(), v_.end(), c, less), std::move(c));
    if (int(v_.size()) > k_) v_.pop_back();
  }
  const std::vector<SearchCandidate>& items() const { return v_; }
  bool empty() const { return v_.empty(); }

 private:
  int k_;
  std::vector<SearchCandidate> v_;
};

// The plan with the smallest forecast peak memory (ties: key).
struct MinMemory {
  std::optional<SearchCandidate> best;
  void offer(const Plan& p, const Scored& s, const char* origin) {
    if (best && s.peak > best->est_peak_memory_bytes) return;
    SearchCandidate c = make_candidate(p, s, origin);
    if (best && s.peak == best->est_peak_memory_bytes && c.key >= best->key) return;
    best = std::move(c);
  }
  void offer(const SearchCandidate& c) {
    if (best && (c.est_peak_memory_bytes > best->est_peak_memory_bytes ||
                 (c.est_peak_memory_bytes == best->est_peak_memory_bytes && c.key >= best->key)))
      return;
    best = c;
  }
};

// ---- (pp, Bm) cost tables ---------------------------------------------------------------------

struct GeoData {
  std::vector<LayerCost> items;  // pruned
};

struct PairData {
  int pp = 1, Bm = 1, D = 1;
  std::vector<int> tps;
  std::vector<int> stage_geo;  // stage -> geometry index
  std::vector<GeoData> geos;
  std::vector<EmbeddingCost> emb;  // pruned; first_* with stage 0's placement, last_* with pp-1's
  int64_t raw_layers = 0, kept_layers = 0;
};

// ---- the search -------------------------------------------------------------------------------

struct Config {
  int pp = 1, Bm = 1, M = 1, v = 1;
  Schedule sched = Schedule::one_f_one_b;
  double lb = 0;
  int order = 0;  // enumeration index (tie-break of equal bounds)
};

class Searcher {
 public:
  Searcher(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o, int64_t budget)
      : m_(m),
        c_(c),
        o_(o),
        budget_(budget),
        tables_(m, c, o.dtype, o.flash_attention, o.overlap_grad_reduce),
        full_(o.top_k),
        megatron_(o.top_k),
        zero_(o.top_k) {
    filter_.tp_degrees = o.tp_degrees;
    filter_.zero_stages = o.zero_stages;
    filter_.recompute = o.recompute;
    filter_.sequence_parallel_off = o.sequence_parallel_off;
    filter_.sequence_parallel_on = o.sequence_parallel_on;
    filter_.offload = o.offload;
    filter_.max_samples_per_rank = o.max_samples_per_rank;
    const GpuSpec& g = c.gpu;
    net_budget_ =
        int64_t(double(budget_ - g.context_overhead_bytes) / (1.0 + g.allocator_fragmentation));
    // DP resolution: 64 MiB, or budget / 1024 (whole MiB) when that is finer.
    bucket_ =
        o.memory_resolution_bytes > 0
            ? o.memory_resolution_bytes
            : std::max<int64_t>(
                  1 << 20, std::min<int64_t>(64 << 20, (budget_ / 1024) & ~int64_t((1 << 20) - 1)));
    if (o.comm != MPI_COMM_NULL) {
      MPI_Comm_rank(o.comm, &rank_);
      MPI_Comm_size(o.comm, &procs_);
    }
  }

  SearchResult run();

  // Exhaustive enumeration (for_each_plan).
  void enumerate(const std::function<void(const Plan&)>& visit);

 private:
  // space
  std::vector<int> pp_list() const;
  std::vector<int> bm_list() const;
  std::vector<Config> configs() const;
  const PairData& pair(int pp, int Bm);
  double in_flight(const Config& cf, int s) const;
  double lower_bound(const Config& cf);
  void search_config(const Config& cf);
  void min_memory_config(const Config& cf);
  void baselines();
  std::vector<Plan> megatron_plans() const;
  std::vector<Plan> zero_plans() const;
  bool fits(const Scored& s) const { return s.peak <= budget_; }
  void consider(const Plan& p, const char* origin, TopK* space_pool);
  void tick(const char* what);
  // MPI merge
  std::string pack() const;
  void merge(const std::vector<std::string>& parts);
  void rerank(SearchResult& r);
  int rerank_threads() const;

  const ModelSpec& m_;
  const ClusterSpec& c_;
  const SearchOptions& o_;
  int64_t budget_;
  int64_t net_budget_ = 0;
  int64_t bucket_ = 64 << 20;
  CostTables tables_;
  SpaceFilter filter_;
  std::map<std::pair<int, int>, std::unique_ptr<PairData>> pairs_;
  TopK full_, megatron_, zero_;
  MinMemory min_memory_;
  SearchStats stats_;
  int64_t local_scored_ = 0, local_searched_ = 0, local_dp_cells_ = 0, local_violations_ = 0;
  int rank_ = 0, procs_ = 1;
  Clock::time_point t0_ = Clock::now(), last_progress_ = Clock::now();
  int64_t progress_done_ = 0, progress_total_ = 0;
};

std::vector<int> Searcher::pp_list() const {
  std::vector<int> out;
  for (int pp : divisors(c_.world_size())) {
    if (pp > m_.layers) continue;
    if (!o_.pp_degrees.empty() && !contains(o_.pp_degrees, pp)) continue;
    out.push_back(pp);
  }
  return out;
}

std::vector<int> Searcher::bm_list() const {
  std::vector<int> out;
  for (int b : divisors(o_.global_batch)) {
    if (!o_.micro_batches.empty() && !contains(o_.micro_batches, b)) continue;
    out.push_back(b);
  }
  return out;
}

std::vector<Config> Searcher::configs() const {
  std::vector<Config> out;
  const int world = c_.world_size();
  for (int pp : pp_list()) {
    const int D = world / pp;
    for (int Bm : bm_list()) {
      if (tp_degrees_for(m_, c_, D, Bm, filter_).empty()) continue;
      const int M = o_.global_batch / Bm;
      for (Schedule sch : o_.schedules) {
        std::vector<int> vs{1};
        if (sch == Schedule::gpipe && pp == 1) continue;  // 1f1b with more memory in flight
        if (sch == Schedule::interleaved) {
          if (pp < 2 || M % pp) continue;
          vs.clear();
          for (int v : o_.vpp_degrees)
            if (v >= 2 && pp * v <= m_.layers) vs.push_back(v);
        }
        for (int v : vs) {
          Config cf;
          cf.pp = pp, cf.Bm = Bm, cf.M = M, cf.v = v, cf.sched = sch;
          cf.order = int(out.size());
          out.push_back(cf);
        }
      }
    }
  }
  return out;
}

const PairData& Searcher::pair(int pp, int Bm) {
  auto& slot = pairs_[{pp, Bm}];
  if (slot) return *slot;
  slot = std::make_unique<PairData>();
  PairData& pd = *slot;
  pd.pp = pp, pd.Bm = Bm, pd.D = c_.world_size() / pp;
  pd.tps = tp_degrees_for(m_, c_, pd.D, Bm, filter_);
  Geometry geo;
  geo.g = std::max(1, c_.node.gpus_per_node);
  geo.D = pd.D;
  const auto raw = layer_candidates(m_, c_, pd.D, Bm, filter_);
  std::map<std::vector<int>, int> sig_index;
  for (int s = 0; s < pp; ++s) {
    auto sig = geo.signature(s, pd.tps);
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
    for (const auto& st : raw)
      costs.push_back(
          tables_.layer(st, Bm / st.dp, geo.tp_nodes(s, st.tp), geo.dp_nodes(s, st.tp)));
    pd.raw_layers += int64_t(costs.size());
    GeoData gd;
    gd.items = prune_dominated(std::move(costs));
    pd.kept_layers += int64_t(gd.items.size());
    pd.geos.push_back(std::move(gd));
  }
  // Embedding strategies: the first stage's placement for the embedding, the last's for the head.
  std::vector<EmbeddingCost> emb;
  for (const auto& st : embedding_candidates(m_, c_, pd.D, Bm, filter_)) {
    const int b = Bm / st.dp;
    EmbeddingCost first =
        tables_.embedding(st, b, geo.tp_nodes(0, st.tp), geo.dp_nodes(0, st.tp), pp == 1);
    EmbeddingCost last =
        tables_.embedding(st, b, geo.tp_nodes(pp - 1, st.tp), geo.dp_nodes(pp - 1, st.tp), pp == 1);
    first.last_busy_s = last.last_busy_s;
    first.last_dp_stream_s = last.last_dp_stream_s;
    first.last_tail_s = last.last_tail_s;
    first.last_states = last.last_states;
    emb.push_back(first);
  }
  pd.emb = prune_dominated(std::move(emb));
  stats_.layer_strategies_costed += pd.raw_layers;
  stats_.layer_strategies_kept += pd.kept_layers;
  return pd;
}

// Micro-batches whose saved activations a stage holds at its worst moment (per layer).
double Searcher::in_flight(const Config& cf, int s) const {
  switch (cf.sched) {
    case Schedule::gpipe:
      return cf.M;
    case Schedule::one_f_one_b:
      return std::min(cf.pp - s, cf.M);
    case Schedule::interleaved: {
      const int W = (cf.pp - s - 1) * 2 + (cf.v - 1) * cf.pp;
      return double(std::min(W + 1, cf.M * cf.v)) / cf.v;
    }
  }
  return 1;
}

namespace {
// Lower convex envelope of (memory, time) points, made non-increasing: the least average time
// per layer reachable with average memory x (LP relaxation of the stage's layer choice).
class Envelope {
 public:
  explicit Envelope(std::vector<std::pair<double, double>> pts) {
    std::sort(pts.begin(), pts.end());
    for (const auto& p : pts) {
      if (!h_.empty() && p.second >= h_.back().second) continue;  // no cheaper: not on the front
      while (h_.size() >= 2) {
        const auto& a = h_[h_.size() - 2];
        const auto& b = h_.back();
        // b above segment a-p: drop it.
        if ((b.second - a.second) * (p.first - a.first) >=
            (p.second - a.second) * (b.first - a.first))
          h_.pop_back();
        else
          break;
      }
      h_.push_back(p);
    }
  }
  double at(double x) const {
    if (h_.empty() || x < h_.front().first) return kInf;
    if (x >= h_.back().first) return h_.back().second;
    auto it =
        std::upper_bound(h_.begin(), h_.end(), x,
                         [](double v, const std::pair<double, double>& p) { return v < p.first; });
    const auto& b = *it;
    const auto& a = *(it - 1);
    return a.second + (b.second - a.second) * (x - a.first) / (b.first - a.first);
  }

 private:
  std::vector<std::pair<double, double>> h_;
};
int n_max_of(int L, int pp, int v) {
  if (pp == 1) return L;
  const int even = (L + pp - 1) / pp;
  return std::max(v, std::min(L - (pp - 1) * v, 2 * even + 2));
}
}  // namespace

double Searcher::lower_bound(const Config& cf) {
  const PairData& pd = pair(cf.pp, cf.Bm);
  const int pp = cf.pp, L = m_.layers;
  if (pd.emb.empty()) return kInf;
  const int n_max = n_max_of(L, pp, cf.v);
  double e_first = kInf, e_last = kInf, e_only = kInf, b_first = kInf, b_last = kInf, b_only = kInf;
  for (const auto& e : pd.emb) {
    e_first = std::min(e_first, double(e.first_states));
    e_last = std::min(e_last, double(e.last_states));
    e_only = std::min(e_only, double(e.only_states));
    b_first = std::min(b_first, e.first_busy_s);
    b_last = std::min(b_last, e.last_busy_s);
    b_only = std::min(b_only, e.first_busy_s + e.last_busy_s);
  }
  std::vector<std::vector<double>> T(pp, std::vector<double>(n_max + 1, kInf));
  for (int s = 0; s < pp; ++s) {
    // Interleaved: a stage holds at least one whole micro-batch's activations (proof in the
    // header comment of the estimator's schedule_peak: its first backward needs all chunks).
    const double k = cf.sched == Schedule::interleaved ? 1.0 : in_flight(cf, s);
    const GeoData& gd = pd.geos[pd.stage_geo[s]];
    std::vector<std::pair<double, double>> pts;
    for (const auto& it : gd.items)
      pts.push_back({double(it.states) + k * double(it.kept), it.busy_s});
    Envelope env(std::move(pts));
    double room = double(net_budget_), extra = 0;
    if (pp == 1)
      room -= e_only, extra = b_only;
    else if (s == 0)
      room -= e_first, extra = b_first;
    else if (s == pp - 1)
      room -= e_last, extra = b_last;
    for (int n = cf.v; n <= n_max; ++n) {
      const double per = env.at(room / n);
      if (per < kInf) T[s][n] = n * per + extra;
    }
  }
  const double sum = min_sum_partition(T, L, cf.v);
  if (sum == kInf) return kInf;
  const double v = cf.v;
  return ((cf.M - 1.0 / v) / pp + 1.0 / v) * sum;
}

void Searcher::consider(const Plan& p, const char* origin, TopK* space_pool) {
  Scored s = score(m_, c_, p);
  ++local_scored_;
  min_memory_.offer(p, s, origin);
  if (!fits(s)) return;
  const bool want_full = o_.space == SearchSpace::full && full_.wants(s.time);
  const bool want_space = space_pool && space_pool->wants(s.time);
  if (!want_full && !want_space) return;
  SearchCandidate c = make_candidate(p, s, origin);
  if (want_space) space_pool->offer(c);
  if (want_full) full_.offer(std::move(c));
}

void Searcher::tick(const char* what) {
  ++progress_done_;
  if (rank_ != 0 || !o_.progress) return;
  if (std::chrono::duration<double>(Clock::now() - last_progress_).count() < o_.progress_interval_s)
    return;
  last_progress_ = Clock::now();
  const TopK& pool = o_.space == SearchSpace::full       ? full_
                     : o_.space == SearchSpace::megatron ? megatron_
                                                         : zero_;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "search: %s %lld/%lld on this process, %lld plans scored, best %.0f tokens/s, %.1f s", what,
      (long long)progress_done_, (long long)progress_total_, (long long)local_scored_,
      pool.empty() ? 0.0 : pool.items().front().est_tokens_per_s, seconds_since(t0_));
  o_.progress(buf);
}

// ---- one configuration ---------------------------------------------------------------------

void Searcher::search_config(const Config& cf) {
  const PairData& pd = pair(cf.pp, cf.Bm);
  const int pp = cf.pp, L = m_.layers, v = cf.v, M = cf.M;
  if (pd.emb.empty()) return;
  const int n_max = n_max_of(L, pp, v);
  const int64_t bucket = bucket_;
  // One DP per distinct (in-flight count, placement).
  std::map<std::pair<double, int>, int> type_index;
  std::vector<std::unique_ptr<StageDp>> dps;
  std::vector<int> stage_type(pp);
  for (int s = 0; s < pp; ++s) {
    const double k = in_flight(cf, s);
    const int gi = pd.stage_geo[s];
    auto key = std::make_pair(k, gi);
    auto it = type_index.find(key);
    if (it != type_index.end()) {
      stage_type[s] = it->second;
      continue;
    }
    // The memory axis reaches a quarter beyond the budget: room for build()'s widening.
    StageDpProblem prob = stage_problem(tables_, pd.geos[gi].items, M, k, n_max, bucket,
                                        net_budget_ + net_budget_ / 4, o_.max_tr_classes,
                                        o_.max_kept_levels, o_.exact_dp);
    auto dp = std::make_unique<StageDp>(std::move(prob));
    local_dp_cells_ += int64_t(dp->cells());
    stage_type[s] = int(dps.size());
    type_index[key] = int(dps.size());
    dps.push_back(std::move(dp));
  }
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
    if (r.a.cost < kInf) r.cost = r.a.cost + emb_cost(s, e);
    return r;
  };

  const double bubble_weight = 1.0 / (double(M) * v);
  // Middle stages do not depend on the embedding strategy.
  std::vector<std::vector<double>> T(pp, std::vector<double>(n_max + 1, kInf));
  // Layer counts a stage can hold (pp == 1: all of them).
  const int n_lo = pp == 1 ? L : v;
  for (int s = 1; s + 1 < pp; ++s)
    for (int n = n_lo; n <= n_max; ++n) T[s][n] = stage_answer(s, n, 0, 0).cost;
  int best_e = -1;
  double best_obj = kInf;
  std::vector<int> best_part;
  for (int ei = 0; ei < int(pd.emb.size()); ++ei) {
    for (int s : {0, pp - 1})
      for (int n = n_lo; n <= n_max; ++n) T[s][n] = stage_answer(s, n, ei, 0).cost;
    double obj = kInf;
    std::vector<int> part = solve_partition(T, L, v, bubble_weight, &obj);
    if (!part.empty() && obj < best_obj) best_obj = obj, best_e = ei, best_part = part;
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
      Scored sc = score(m_, c_, p);
      ++local_scored_;
      if (sc.time < cf.lb * (1 - 1e-9)) ++local_violations_;
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
  Scored sc = score(m_, c_, p);
  ++local_scored_;
  min_memory_.offer(p, sc, "dp");
}

// ---- baselines ----------------------------------------------------------------------------------

std::vector<Plan> Searcher::megatron_plans() const {
  std::vector<Plan> out;
  const int world = c_.world_size();
  const int g = std::max(1, c_.node.gpus_per_node);
  for (int pp : pp_list()) {
    const int D = world / pp;
    for (int tp = 1; tp <= g && tp <= D; tp *= 2) {
      if (D % tp || m_.heads % tp || m_.kv_heads % tp || m_.ffn_hidden % tp) continue;
      if (!o_.tp_degrees.empty() && !contains(o_.tp_degrees, tp)) continue;
      const int dp = D / tp;
      for (int mb = 1; mb <= o_.max_samples_per_rank; ++mb) {
        const int Bm = mb * dp;
        if (o_.global_batch % Bm) continue;
        if (!o_.micro_batches.empty() && !contains(o_.micro_batches, Bm)) continue;
        const int M = o_.global_batch / Bm;
        std::vector<std::pair<Schedule, int>> scheds;
        if (contains(o_.schedules, Schedule::one_f_one_b))
          scheds.push_back({Schedule::one_f_one_b, 1});
        if (contains(o_.schedules, Schedule::interleaved) && pp >= 2 && M % pp == 0)
          for (int v : o_.vpp_degrees)
            if (v >= 2 && pp * v <= m_.layers) scheds.push_back({Schedule::interleaved, v});
        for (auto [sch, v] : scheds)
          for (Recompute rc : o_.recompute)
            for (int sp = 0; sp < 2; ++sp) {
              if (sp && (tp == 1 || !o_.sequence_parallel_on || m_.seq_len % tp)) continue;
              if (!sp && tp > 1 && !o_.sequence_parallel_off) continue;
              for (int z : {0, 1}) {
                if (!contains(o_.zero_stages, z) || (z == 1 && dp == 1)) continue;
                LayerStrategy l;
                l.tp = tp, l.dp = dp, l.sequence_parallel = sp, l.zero = z, l.recompute = rc;
                LayerStrategy emb = l;
                emb.recompute = Recompute::none;
                std::vector<int> totals(pp, 0);
                const auto ch = even_chunks(m_.layers, pp * v);
                for (int c = 0; c < pp * v; ++c) totals[c % pp] += ch[c].size();
                std::vector<std::vector<LayerStrategy>> seqs(pp);
                for (int s = 0; s < pp; ++s) seqs[s].assign(totals[s], l);
                out.push_back(assemble(m_, o_, pp, sch, v, Bm, totals, seqs, emb));
              }
            }
      }
    }
  }
  return out;
}

std::vector<Plan> Searcher::zero_plans() const {
  std::vector<Plan> out;
  const int world = c_.world_size();
  if (!o_.pp_degrees.empty() && !contains(o_.pp_degrees, 1)) return out;
  if (!o_.tp_degrees.empty() && !contains(o_.tp_degrees, 1)) return out;
  if (!contains(o_.schedules, Schedule::one_f_one_b)) return out;
  const int z = world > 1 ? 3 : 0;  // ZeRO without data parallelism changes nothing
  if (!contains(o_.zero_stages, z)) return out;
  for (int mb = 1; mb <= o_.max_samples_per_rank; ++mb) {
    const int Bm = mb * world;
    if (o_.global_batch % Bm) continue;
    if (!o_.micro_batches.empty() && !contains(o_.micro_batches, Bm)) continue;
    for (Recompute rc : o_.recompute)
      // DeepSpeed: ZeRO-Offload (optimizer), ZeRO-Infinity (+ parameters), and CPU
      // checkpointing of the activations kept by full recompute.
      for (int off = 0; off < (o_.offload ? 3 : 1); ++off)
        for (int act = 0; act < ((o_.offload && rc == Recompute::full) ? 2 : 1); ++act) {
          LayerStrategy l;
          l.tp = 1, l.dp = world, l.zero = z, l.recompute = rc;
          l.offload_optimizer = off >= 1;
          l.offload_params = off >= 2;
          l.offload_activations = act;
          LayerStrategy emb = l;
          emb.recompute = Recompute::none;
          emb.offload_activations = false;
          std::vector<std::vector<LayerStrategy>> seqs{std::vector<LayerStrategy>(m_.layers, l)};
          out.push_back(assemble(m_, o_, 1, Schedule::one_f_one_b, 1, Bm, {m_.layers}, seqs, emb));
        }
  }
  return out;
}

void Searcher::baselines() {
  const bool full = o_.space == SearchSpace::full;
  if (full ? o_.baselines : o_.space == SearchSpace::megatron) {
    const auto plans = megatron_plans();
    progress_done_ = 0;
    progress_total_ = int64_t((plans.size() + procs_ - 1) / procs_);
    for (size_t i = rank_; i < plans.size(); i += procs_) {
      consider(plans[i], "megatron", &megatron_);
      tick("baseline plans");
    }
  }
  if (full ? o_.baselines : o_.space == SearchSpace::zero) {
    const auto plans = zero_plans();
    for (size_t i = rank_; i < plans.size(); i += procs_) {
      consider(plans[i], "zero", &zero_);
      tick("baseline plans");
    }
  }
}

// ---- MPI merge
// ------------------------------------------------------------------------------------

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
  if (comm == MPI_COMM_NULL) return {mine};
  int P = 1;
  MPI_Comm_size(comm, &P);
  int len = int(mine.size());
  std::vector<int> lens(P), offs(P, 0);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int i = 0; i < P; ++i) offs[i] = total, total += lens[i];
  std::string all(size_t(total), '\0');
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int i = 0; i < P; ++i) out.push_back(all.substr(size_t(offs[i]), size_t(lens[i])));
  return out;
}

nlohmann::json pack_candidate(const SearchCandidate& c) {
  return {{"plan", to_json(c.plan)},
          {"key", c.key},
          {"origin", c.origin},
          {"t", c.est_iteration_time_s},
          {"tok", c.est_tokens_per_s},
          {"peak", c.est_peak_memory_bytes},
          {"stages", c.est_stage_peak_bytes}};
}
SearchCandidate unpack_candidate(const nlohmann::json& j, const ModelSpec& m) {
  SearchCandidate c;
  c.plan = plan_from_json(j.at("plan"), m, "search");
  c.key = j.at("key").get<std::string>();
  c.origin = j.at("origin").get<std::string>();
  c.est_iteration_time_s = j.at("t").get<double>();
  c.est_tokens_per_s = j.at("tok").get<double>();
  c.est_peak_memory_bytes = j.at("peak").get<int64_t>();
  c.est_stage_peak_bytes = j.at("stages").get<std::vector<int64_t>>();
  return c;
}

std::string Searcher::pack() const {
  nlohmann::json j;
  auto list = [](const TopK& t) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& c : t.items()) a.push_back(pack_candidate(c));
    return a;
  };
  j["full"] = list(full_);
  j["megatron"] = list(megatron_);
  j["zero"] = list(zero_);
  j["minmem"] = min_memory_.best ? pack_candidate(*min_memory_.best) : nlohmann::json();
  j["stats"] = {local_scored_, local_searched_, local_dp_cells_, local_violations_};
  return j.dump();
}

void Searcher::merge(const std::vector<std::string>& parts) {
  if (parts.size() <= 1 && procs_ == 1) {
    stats_.candidates_evaluated = local_scored_;
    stats_.configs_searched = local_searched_;
    stats_.dp_cells = local_dp_cells_;
    stats_.bound_violations = local_violations_;
    return;
  }
  TopK full(o_.top_k), meg(o_.top_k), zero(o_.top_k);
  MinMemory mm;
  SearchStats st = stats_;
  st.candidates_evaluated = st.configs_searched = st.dp_cells = st.bound_violations = 0;
  for (const auto& s : parts) {
    const auto j = nlohmann::json::parse(s);
    for (const auto& c : j["full"]) full.offer(unpack_candidate(c, m_));
    for (const auto& c : j["megatron"]) meg.offer(unpack_candidate(c, m_));
    for (const auto& c : j["zero"]) zero.offer(unpack_candidate(c, m_));
    if (!j["minmem"].is_null()) mm.offer(unpack_candidate(j["minmem"], m_));
    st.candidates_evaluated += j["stats"][0].get<int64_t>();
    st.configs_searched += j["stats"][1].get<int64_t>();
    st.dp_cells += j["stats"][2].get<int64_t>();
    st.bound_violations += j["stats"][3].get<int64_t>();
  }
  full_ = std::move(full);
  megatron_ = std::move(meg);
  zero_ = std::move(zero);
  min_memory_ = std::move(mm);
  stats_ = st;
}

// ---- simulator re-rank ------------------------------------------------------------------------

void simulate_candidate(const ModelSpec& m, const ClusterSpec& c, int64_t budget,
                        SearchCandidate& x) {
  const Plan& p = x.plan;
  Layout layout(p, c);
  Program prog = build_program(m, p);
  CostModel cost(m, c, p);
  CostModelCosts costs(cost);
  SimOptions opt;
  SimResult r = simulate(prog, layout, c, costs, opt);
  x.simulated = true;
  const double it = double(r.makespan_ns) * 1e-9 / std::max(1, r.iterations);
  x.sim_iteration_time_s = it;
  x.sim_tokens_per_s = it > 0 ? double(p.global_batch) * m.seq_len / it : 0;
  x.sim_stage_peak_bytes.assign(p.pp, 0);
  x.sim_peak_memory_bytes = 0;
  for (const auto& rr : r.ranks) {
    x.sim_peak_memory_bytes = std::max(x.sim_peak_memory_bytes, rr.peak_memory_bytes);
    if (rr.stage >= 0 && rr.stage < p.pp)
      x.sim_stage_peak_bytes[rr.stage] =
          std::max(x.sim_stage_peak_bytes[rr.stage], rr.peak_memory_bytes);
  }
  x.sim_fits = !r.deadlock.deadlocked && x.sim_peak_memory_bytes <= budget;
}

// Final order: fitting candidates by the scorer's time, then the rest; ties by key.
void final_sort(std::vector<SearchCandidate>& v) {
  std::stable_sort(v.begin(), v.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
    if (a.sim_fits != b.sim_fits) return a.sim_fits;
    if (a.iteration_time_s() != b.iteration_time_s())
      return a.iteration_time_s() < b.iteration_time_s();
    return a.key < b.key;
  });
}

int Searcher::rerank_threads() const {
  if (o_.threads > 0) return o_.threads;
  // This node's cores shared by the search processes on it. Collective over o_.comm: every
  // process re-ranks, so every process gets here.
  int local = 1;
  if (o_.comm != MPI_COMM_NULL) {
    MPI_Comm node;
    MPI_Comm_split_type(o_.comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
  }
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local));
}

void Searcher::rerank(SearchResult& r) {
  const TopK& own = o_.space == SearchSpace::full       ? full_
                    : o_.space == SearchSpace::megatron ? megatron_
                                                        : zero_;
  // The set to re-rank: the space's top K and, for the full space, both baselines' top K, so
  // that the full search never does worse than a baseline search under the same scorer.
  std::vector<SearchCandidate> set;
  std::set<std::string> keys;
  auto add = [&](const TopK& t) {
    for (const auto& c : t.items())
      if (keys.insert(c.key).second) set.push_back(c);
  };
  add(own);
  if (o_.space == SearchSpace::full) add(megatron_), add(zero_);
  const auto t0 = Clock::now();
  if (o_.rerank_with_simulator) {
    // Deal the simulations round-robin over the processes, and over threads inside each;
    // gather (time, peak, stage peaks, fits). Each candidate is simulated on its own, so the
    // results do not depend on the number of threads.
    std::vector<size_t> todo;
    for (size_t i = rank_; i < set.size(); i += procs_) todo.push_back(i);
    const int threads = std::max(1, std::min<int>(rerank_threads(), int(todo.size())));
    std::atomic<size_t> next{0}, done{0};
    std::mutex failed_mutex;
    std::exception_ptr failed;
    auto work = [&](bool report) {
      for (size_t k; (k = next++) < todo.size();) {
        try {
          simulate_candidate(m_, c_, budget_, set[todo[k]]);
        } catch (...) {
          std::lock_guard<std::mutex> lock(failed_mutex);
          if (!failed) failed = std::current_exception();
          next = todo.size();
        }
        ++done;
        if (report && rank_ == 0 && o_.progress &&
            std::chrono::duration<double>(Clock::now() - last_progress_).count() >=
                o_.progress_interval_s) {
          last_progress_ = Clock::now();
          char buf[180];
          std::snprintf(buf, sizeof buf,
                        "search: simulating the top candidates, %zu/%zu on this process "
                        "(%d threads), %.1f s",
                        done.load(), todo.size(), threads, seconds_since(t0_));
          o_.progress(buf);
        }
      }
    };
    {
      std::vector<std::thread> pool;
      for (int t = 1; t < threads; ++t) pool.emplace_back(work, false);
      work(true);
      for (auto& t : pool) t.join();
    }
    if (failed) std::rethrow_exception(failed);
    nlohmann::json mine = nlohmann::json::array();
    for (size_t i : todo)
      mine.push_back({i, set[i].sim_iteration_time_s, set[i].sim_tokens_per_s,
                      set[i].sim_peak_memory_bytes, set[i].sim_stage_peak_bytes, set[i].sim_fits});
    for (const auto& part : allgather_strings(o_.comm, mine.dump()))
      for (const auto& e : nlohmann::json::parse(part)) {
        SearchCandidate& x = set[e[0].get<size_t>()];
        x.simulated = true;
        x.sim_iteration_time_s = e[1].get<double>();
        x.sim_tokens_per_s = e[2].get<double>();
        x.sim_peak_memory_bytes = e[3].get<int64_t>();
        x.sim_stage_peak_bytes = e[4].get<std::vector<int64_t>>();
        x.sim_fits = e[5].get<bool>();
      }
    stats_.plans_simulated = int64_t(set.size());
    r.scorer = "simulator";
  } else {
    r.scorer = "estimator";
    r.scorer_note = "the simulator re-rank is disabled (--rerank estimator)";
  }
  stats_.rerank_phase_s = seconds_since(t0);
  final_sort(set);
  bool any_fits = false;
  for (const auto& x : set) any_fits |= x.sim_fits;
  if (!any_fits) {
    // Every re-ranked plan overflows under the simulator: fall back to the estimator's order.
    for (auto& x : set) x.simulated = false, x.sim_fits = true;
    final_sort(set);
    r.scorer = "estimator";
    r.scorer_note =
        "the simulator found every re-ranked plan over the memory budget; ranked by the estimator";
  }
  // Best of the space, and best of each baseline under the same scorer.
  auto best_of = [&](const char* origin_space) -> std::optional<SearchCandidate> {
    const TopK& t = std::string(origin_space) == "megatron" ? megatron_ : zero_;
    std::set<std::string> ks;
    for (const auto& c : t.items()) ks.insert(c.key);
    for (const auto& x : set)
      if (ks.count(x.key)) return x;
    return std::nullopt;
  };
  std::vector<SearchCandidate> ranked;
  std::set<std::string> own_keys;
  for (const auto& c : own.items()) own_keys.insert(c.key);
  if (o_.space == SearchSpace::full) {
    ranked = set;  // baselines belong to the full space
  } else {
    for (const auto& x : set)
      if (own_keys.count(x.key)) ranked.push_back(x);
  }
  if (int(ranked.size()) > o_.top_k) ranked.resize(o_.top_k);
  r.best = ranked.front();
  r.ranked = ranked;
  if (o_.space == SearchSpace::full) {
    if (o_.baselines) {
      r.megatron = best_of("megatron");
      r.zero = best_of("zero");
      if (!r.megatron) r.megatron_note = "no uniform Megatron-style plan fits the budget";
      if (!r.zero) r.zero_note = "no ZeRO-3 plan (pp 1, tp 1) fits the budget or divides the batch";
    } else {
      r.megatron_note = r.zero_note = "baselines not searched";
    }
  } else if (o_.space == SearchSpace::megatron) {
    r.megatron = r.best;
    r.zero_note = "not searched (--space megatron)";
  } else {
    r.zero = r.best;
    r.megatron_note = "not searched (--space zero)";
  }
}

// The shared bound of run(): the processes exchange their top-K (time, plan-key hash) lists in
// a chain of non-blocking all-gathers (every process posts the same sequence; the chain ends
// with the first exchange in which nobody is searching any more). The K-th best distinct plan
// of the union bounds every process's pruning. A hash collision can only merge two plans, which
// loosens the bound: the answer never depends on the process count.
class BoundExchange {
 public:
  struct Entry {
    double time;
    uint64_t hash;
  };
  BoundExchange(MPI_Comm comm, int k) : comm_(comm), k_(k) {
    if (comm_ != MPI_COMM_NULL) {
      MPI_Comm_size(comm_, &procs_);
      send_.resize(size_t(k_) + 1);
      recv_.resize(send_.size() * size_t(procs_));
    }
  }
  double shared() const { return shared_; }
  // Between configurations: take a finished exchange's result and post the next one.
  void poll(const TopK& mine) {
    if (comm_ == MPI_COMM_NULL) return;
    if (req_ == MPI_REQUEST_NULL) return post(mine, true);
    int done = 0;
    MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    if (done) {
      absorb();
      post(mine, true);
    }
  }
  // After the last configuration: keep exchanging until nobody searches.
  void finish(const TopK& mine) {
    if (comm_ == MPI_COMM_NULL) return;
    if (req_ == MPI_REQUEST_NULL) post(mine, true);
    while (true) {
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
      if (!absorb()) break;
      post(mine, false);
    }
  }

 private:
  void post(const TopK& mine, bool active) {
    std::fill(send_.begin(), send_.end(), Entry{kInf, 0});
    for (size_t i = 0; i < mine.items().size() && i < size_t(k_); ++i)
      send_[i] = {mine.items()[i].est_iteration_time_s,
                  std::hash<std::string>{}(mine.items()[i].key)};
    send_[size_t(k_)] = {active ? 1.0 : 0.0, 0};  // the last entry: still searching?
    const int bytes = int(send_.size() * sizeof(Entry));
    MPI_Iallgather(send_.data(), bytes, MPI_BYTE, recv_.data(), bytes, MPI_BYTE, comm_, &req_);
  }
  // Updates the bound; true when some process is still searching.
  bool absorb() {
    std::vector<Entry> all;
    bool active = false;
    for (int p = 0; p < procs_; ++p) {
      const Entry* e = recv_.data() + size_t(p) * send_.size();
      for (int i = 0; i < k_; ++i)
        if (e[i].time < kInf) all.push_back(e[i]);
      active |= e[k_].time > 0;
    }
    std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
      return a.hash != b.hash ? a.hash < b.hash : a.time < b.time;
    });
    all.erase(std::unique(all.begin(), all.end(),
                          [](const Entry& a, const Entry& b) { return a.hash == b.hash; }),
              all.end());
    if (int(all.size()) >= k_) {
      std::nth_element(all.begin(), all.begin() + (k_ - 1), all.end(),
                       [](const Entry& a, const Entry& b) { return a.time < b.time; });
      shared_ = std::min(shared_, all[size_t(k_ - 1)].time);
    }
    return active;
  }
  MPI_Comm comm_;
  int k_, procs_ = 1;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<Entry> send_, recv_;
  double shared_ = kInf;
};

SearchResult Searcher::run() {
  SearchResult r;
  r.space = o_.space;
  r.memory_budget_bytes = budget_;
  stats_.processes = procs_;
  std::vector<Config> cfs;
  if (o_.space == SearchSpace::full) cfs = configs();
  stats_.configs = int64_t(cfs.size());
  // Baselines first: they seed the K-th best time that lets the bound skip configurations.
  baselines();
  if (!cfs.empty()) {
    for (auto& cf : cfs) cf.lb = lower_bound(cf);
    std::sort(cfs.begin(), cfs.end(), [](const Config& a, const Config& b) {
      if (a.lb != b.lb) return a.lb < b.lb;
      return a.order < b.order;
    });
    progress_done_ = 0;
    progress_total_ = int64_t((cfs.size() + procs_ - 1) / procs_);
    // Under MPI the processes share their K-th best time while they search (a chain of
    // non-blocking all-reduces, MIN, that also tells whether anyone is still searching): any
    // bound at or above the final K-th best is valid, so sharing it changes no answer, only how
    // many configurations are skipped.
    BoundExchange bound(o_.comm, std::max(1, o_.top_k));
    for (size_t i = rank_; i < cfs.size(); i += procs_) {
      const Config& cf = cfs[i];
      if (cf.lb == kInf) break;  // sorted: the rest cannot fit either
      if (cf.lb > std::min(full_.kth_time(), bound.shared())) break;
      ++local_searched_;
      search_config(cf);
      bound.poll(full_);
      tick("configurations");
    }
    bound.finish(full_);
  }
  stats_.estimate_phase_s = seconds_since(t0_);
  merge(allgather_strings(o_.comm, pack()));
  const TopK& own = o_.space == SearchSpace::full       ? full_
                    : o_.space == SearchSpace::megatron ? megatron_
                                                        : zero_;
  if (own.empty()) {
    // Nothing fits: find the least memory any plan of the space needs.
    if (o_.space == SearchSpace::full) {
      for (size_t i = rank_; i < cfs.size(); i += procs_) min_memory_config(cfs[i]);
      merge(allgather_strings(o_.comm, pack()));
    }
    std::string msg = "no plan of the " + std::string(to_string(o_.space)) +
                      " space fits the memory budget of " + fmt_gib(budget_) + " per GPU";
    if (min_memory_.best) {
      msg += "; the smallest peak memory reachable is " +
             fmt_gib(min_memory_.best->est_peak_memory_bytes) +
             " per GPU, with: " + min_memory_.best->plan.describe();
    } else {
      msg += " (no valid plan at all for this model, cluster and global batch)";
    }
    throw NoFeasiblePlan(msg, budget_, min_memory_.best);
  }
  rerank(r);
  stats_.search_time_s = seconds_since(t0_);
  r.stats = stats_;
  return r;
}

// ---- exhaustive enumeration -------------------------------------------------------------------

void Searcher::enumerate(const std::function<void(const Plan&)>& visit) {
  const int L = m_.layers;
  for (const Config& cf : configs()) {
    const int pp = cf.pp, v = cf.v, D = c_.world_size() / pp;
    const auto raw = layer_candidates(m_, c_, D, cf.Bm, filter_);
    const auto embs = embedding_candidates(m_, c_, D, cf.Bm, filter_);
    if (raw.empty() || embs.empty()) continue;
    // Stage totals: every composition of L into pp parts of at least v layers.
    std::vector<int> totals(pp, v);
    std::function<void(int, int)> compose = [&](int s, int left) {
      if (s == pp - 1) {
        if (left < v) return;
        totals[s] = left;
        std::vector<int> idx(L, 0);
        for (const auto& e : embs) {
          std::fill(idx.begin(), idx.end(), 0);
          while (true) {
            std::vector<std::vector<LayerStrategy>> seqs(pp);
            int at = 0;
            for (int st = 0; st < pp; ++st)
              for (int k = 0; k < totals[st]; ++k) seqs[st].push_back(raw[idx[at++]]);
            visit(assemble(m_, o_, pp, cf.sched, v, cf.Bm, totals, seqs, e));
            int l = L - 1;
            while (l >= 0 && ++idx[l] == int(raw.size())) idx[l--] = 0;
            if (l < 0) break;
          }
        }
        return;
      }
      for (int n = v; n <= left - v * (pp - 1 - s); ++n) {
        totals[s] = n;
        compose(s + 1, left - n);
      }
    };
    compose(0, L);
  }
}

int64_t resolve_budget(const ClusterSpec& c, const SearchOptions& o) {
  const int64_t hbm = c.gpu.hbm_bytes;
  if (o.memory_budget_bytes < 0) throw InputError("--memory-budget-gib: expected a positive size");
  const int64_t b = o.memory_budget_bytes == 0 ? hbm : o.memory_budget_bytes;
  if (b > hbm)
    throw InputError("--memory-budget-gib: " + fmt_gib(b) + " exceeds the " + fmt_gib(hbm) +
                     " of the cluster's GPU (" + c.gpu.name + "); give at most the GPU's memory");
  if (b <= c.gpu.context_overhead_bytes)
    throw InputError("--memory-budget-gib: " + fmt_gib(b) +
                     " leaves nothing after the GPU's context overhead of " +
                     fmt_gib(c.gpu.context_overhead_bytes));
  return b;
}

void check_options(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o) {
  if (o.global_batch < 1) throw InputError("--global-batch: expected a positive number of samples");
  if (o.top_k < 1 || o.top_k > 1000) throw InputError("--top: expected 1..1000");
  if (o.memory_resolution_bytes != 0 && o.memory_resolution_bytes < (1 << 20))
    throw InputError("memory resolution: expected 0 (auto) or >= 1 MiB");
  if (c.world_size() < 1) throw InputError("--nodes: the cluster has no GPUs");
  (void)m;
}

}  // namespace

SearchResult search(const ModelSpec& model, const ClusterSpec& cluster,
                    const SearchOptions& options) {
  check_options(model, cluster, options);
  const int64_t budget = resolve_budget(cluster, options);
  Searcher s(model, cluster, options, budget);
  // A global batch that no data-parallel degree of the space divides.
  {
    bool any = false;
    const int world = cluster.world_size();
    std::set<int> dps;
    for (int pp : divisors(world)) {
      if (pp > model.layers) continue;
      if (!options.pp_degrees.empty() && !contains(options.pp_degrees, pp)) continue;
      const int D = world / pp;
      for (int tp = 1; tp <= std::max(1, cluster.node.gpus_per_node) && tp <= D; tp *= 2)
        if (D % tp == 0) {
          dps.insert(D / tp);
          any |= options.global_batch % (D / tp) == 0;
        }
    }
    if (!any) {
      std::string list;
      for (int d : dps) list += (list.empty() ? "" : ", ") + std::to_string(d);
      throw InputError("--global-batch " + std::to_string(options.global_batch) +
                       " is not divisible by any data-parallel degree this cluster allows (" +
                       list + " for " + std::to_string(world) + " GPUs, tp up to " +
                       std::to_string(cluster.node.gpus_per_node) + ", pp up to the " +
                       std::to_string(model.layers) + " layers)");
    }
    if (options.space == SearchSpace::zero && options.global_batch % world)
      throw InputError("--space zero: the global batch " + std::to_string(options.global_batch) +
                       " is not divisible by the data-parallel degree " + std::to_string(world) +
                       " (pp 1, tp 1: every GPU is a replica)");
  }
  return s.run();
}

void for_each_plan(const ModelSpec& model, const ClusterSpec& cluster, const SearchOptions& options,
                   const std::function<void(const Plan&)>& visit) {
  check_options(model, cluster, options);
  Searcher s(model, cluster, options, resolve_budget(cluster, options));
  s.enumerate(visit);
}

// ---- JSON --------------------------------------------------------------------------------------

nlohmann::json to_json(const SearchCandidate& c) {
  nlohmann::json j = {{"plan", to_json(c.plan)},
                      {"description", c.plan.describe()},
                      {"origin", c.origin},
                      {"scored_by", c.simulated ? "simulator" : "estimator"},
                      {"tokens_per_s", c.tokens_per_s()},
                      {"iteration_time_s", c.iteration_time_s()},
                      {"peak_memory_bytes", c.peak_memory_bytes()},
                      {"stage_peak_memory_bytes", c.stage_peak_bytes()},
                      {"estimate",
                       {{"tokens_per_s", c.est_tokens_per_s},
                        {"iteration_time_s", c.est_iteration_time_s},
                        {"peak_memory_bytes", c.est_peak_memory_bytes},
                        {"stage_peak_memory_bytes", c.est_stage_peak_bytes}}}};
  if (c.simulated)
    j["simulation"] = {{"tokens_per_s", c.sim_tokens_per_s},
                       {"iteration_time_s", c.sim_iteration_time_s},
                       {"peak_memory_bytes", c.sim_peak_memory_bytes},
                       {"stage_peak_memory_bytes", c.sim_stage_peak_bytes},
                       {"fits", c.sim_fits}};
  return j;
}

nlohmann::json to_json(const SearchResult& r) {
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : r.ranked) cands.push_back(to_json(c));
  auto baseline = [](const std::optional<SearchCandidate>& c, const std::string& note) {
    if (c) return to_json(*c);
    return nlohmann::json{{"plan", nullptr}, {"note", note}};
  };
  const SearchStats& s = r.stats;
  return {{"space", to_string(r.space)},
          {"scorer", r.scorer},
          {"scorer_note", r.scorer_note},
          {"memory_budget_bytes", r.memory_budget_bytes},
          {"best", to_json(r.best)},
          {"baselines",
           {{"megatron", baseline(r.megatron, r.megatron_note)},
            {"zero", baseline(r.zero, r.zero_note)}}},
          {"candidates", cands},
          {"candidates_evaluated", s.candidates_evaluated},
          {"search_time_s", s.search_time_s},
          {"stats",
           {{"plans_simulated", s.plans_simulated},
            {"configs", s.configs},
            {"configs_searched", s.configs_searched},
            {"layer_strategies_costed", s.layer_strategies_costed},
            {"layer_strategies_kept", s.layer_strategies_kept},
            {"dp_cells", s.dp_cells},
            {"bound_violations", s.bound_violations},
            {"processes", s.processes},
            {"estimate_phase_s", s.estimate_phase_s},
            {"rerank_phase_s", s.rerank_phase_s}}}};
}

}  // namespace stratagem
