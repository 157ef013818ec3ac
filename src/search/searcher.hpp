// Internals of the strategy search, shared by its files:
//   space.cpp          the configuration space, the (pp, Bm) cost tables, plan assembly
//   bounds.cpp         a configuration's lower bound (relax_stage, lower_bound)
//   ranking.cpp        scoring plans and the order the search ranks them in
//   searcher.cpp       the run over the configurations and the exhaustive enumeration
//   bound_exchange.hpp the bound the MPI processes share while they search
//   config_search.cpp  one configuration: stage DPs, the partition, the plans it yields
//   baselines.cpp      the uniform Megatron and ZeRO-3 spaces
//   merge.cpp          merging what the MPI processes found
//   rerank.cpp         the simulator re-rank of the top candidates
//   simulation_scheduler.cpp  its simulations on threads, early ones beside the DP search
//   search.cpp         the public entry points and JSON
//
// Work units. An outer configuration is (pp, Bm, schedule, v) where Bm is the number of samples
// a micro-batch carries through the pipeline (Plan::micro_batch x the widest dp) and
// M = global_batch / Bm the micro-batch count. Per (pp, Bm) every candidate layer strategy is
// costed once per stage placement (PairData) and pruned by dominance; every configuration with
// that pair reuses the costs, weighting them by its M and by each stage's in-flight count.
//
// Lower bound (best-first order and skipping). The estimator's iteration time is at least
//     (M - 1/v) max_s c_s + (1/v) sum_s c_s + (1/v) sum_s P_s / 2,    c_s = u_s + P_s / 2
// (M x the largest cycle, the others' fill and drain, every pipeline transfer P_s / v; the tail
// is >= 0), where a stage's micro-batch time u_s (the largest of its busy time and its side
// streams, plus the unhidden transfers at the ends of each chunk pass) is at least its layers'
// LP-relaxed minimum of a convex combination of those terms under its memory budget, with the
// resident memory (model states + in-flight saved activations, and once the forward peak and
// workspace of a chunk's last layer) that the estimator charges at least, and P_s at least its
// transfer count x the cheapest transfer of any layer's boundary activations. The partition
// solver minimizes the first two terms over the stage partitions exactly (Searcher::lower_bound,
// relax_stage). The configurations are visited in increasing bound; one whose bound exceeds the
// K-th best plan found so far cannot enter the top K and is skipped (a test searches every
// configuration too and compares: test_search's pruning_by_the_bound_changes_no_answer).
//
// Per configuration: a stage DP (stage_dp.hpp) per distinct (in-flight count, placement), the
// partition solver per embedding strategy, then the plan of the best (embedding, partition) and
// the plan of the even partition are built and scored by the estimator. A plan the estimator
// finds over budget (the DP's memory model rounds up, but merges transient-memory classes) is
// repaired by shrinking the offending stage's budget (up to three times).
#pragma once
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "src/search/evaluated.hpp"
#include "src/search/layer_costs.hpp"
#include "src/search/simulation_scheduler.hpp"
#include "src/search/stage_dp.hpp"
#include "src/search/workers.hpp"
#include "stratagem/schedule.hpp"
#include "stratagem/search.hpp"

namespace stratagem::search_detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
std::string fmt_gib(int64_t b);
std::vector<int> divisors(int n);
template <class T>
bool contains(const std::vector<T>& v, T x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
// Layer sizes of the v chunks of a stage holding n layers (earlier chunks take the remainder).
std::vector<int> chunk_sizes(int n, int v);
// A plan from stage totals and per-stage layer strategies (first layer of the stage first).
Plan assemble(const ModelSpec& m, const SearchOptions& o, int pp, Schedule sched, int v, int Bm,
              const std::vector<int>& totals, const std::vector<std::vector<LayerStrategy>>& seqs,
              const LayerStrategy& emb);

// ---- the scorer ---------------------------------------------------------------------------

struct Scored {
  double time = kInf;
  double tokens = 0;
  int64_t peak = 0;
  std::vector<int64_t> stage_peaks;
  // What each stage takes of the net budget (Searcher::net_budget_) at its peak: its tensors
  // (MemoryBreakdown::tensor_bytes) and its NCCL buffers, which the net budget leaves in, in
  // the same units (divided by 1 + the allocator's fragmentation).
  std::vector<int64_t> stage_net_bytes;
};

Scored score(const ModelSpec& m, const ClusterSpec& c, const Plan& p,
             const FrameworkSpec& fw = FrameworkSpec{});

SearchCandidate make_candidate(const Plan& p, const Scored& s, const char* origin);

// How the search orders plans, wherever it ranks or keeps them (TopK, the final ranking): by
// iteration time, with times equal within about 1e-9 relative counted as equal (compared rounded
// to 30 significant bits, which keeps the order transitive), then by lower peak memory, then by
// the plan's key (its canonical JSON). Without the first two, plans of equal throughput were
// ordered by the last bits of their times, which differ between builds (fused multiply-adds in
// the release build's -march=native, none in the ASan build).
double time_rank(double time_s);
bool ranks_before(double time_a, int64_t peak_a, const std::string& key_a, double time_b,
                  int64_t peak_b, const std::string& key_b);

// The K best plans by estimated time (ranks_before), distinct keys.
class TopK {
 public:
  explicit TopK(int k) : k_(std::max(1, k)) {}
  double kth_time() const { return int(v_.size()) < k_ ? kInf : v_.back().est_iteration_time_s; }
  // Whether a plan of this time may enter (one of equal rank may, by lower memory or key).
  bool wants(double t) const { return time_rank(t) <= time_rank(kth_time()); }
  void offer(SearchCandidate c) {
    if (!wants(c.est_iteration_time_s)) return;
    for (const auto& x : v_)
      if (x.key == c.key) return;
    auto less = [](const SearchCandidate& a, const SearchCandidate& b) {
      return ranks_before(a.est_iteration_time_s, a.est_peak_memory_bytes, a.key,
                          b.est_iteration_time_s, b.est_peak_memory_bytes, b.key);
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

// The candidates of the pools, in order, each key once.
std::vector<SearchCandidate> distinct_candidates(const std::vector<const TopK*>& pools);

// ---- (pp, Bm) cost tables ---------------------------------------------------------------------

struct GeoData {
  std::vector<LayerCost> items;  // pruned
};

// The lower bound's relaxation of one stage's layer choice (Searcher::lower_bound), per
// weighting of its streams: per position type, the lower convex envelope of (memory, time) over
// the strategies, and the envelopes' segments in increasing time per byte.
struct StageRelaxation {
  static constexpr int kTypes = 6;
  // One edge of an envelope: going along it adds `added_bytes` of memory per position and changes
  // its time by `time_change_s` (< 0: the envelope falls), `s_per_byte` the ratio.
  struct Segment {
    double s_per_byte, added_bytes, time_change_s;
    int type;
  };
  struct Weighting {
    std::array<std::pair<double, double>, kTypes> least;  // each envelope's least-memory point
    std::vector<Segment> segments;
  };
  std::vector<Weighting> weightings;
};

struct PairData {
  int pp = 1, Bm = 1, D = 1;
  std::vector<int> tps;
  std::vector<int> stage_geo;  // stage -> geometry index
  std::vector<GeoData> geos;
  std::vector<EmbeddingCost> emb;  // pruned; first_* with stage 0's placement, last_* with pp-1's
  int64_t raw_layers = 0, kept_layers = 0;
  // The cheapest pipeline transfer of any kept layer's boundary activations, between stages on
  // other nodes [0] and on the same node [1] (the lower bound's).
  double p2p_min_s[2] = {kInf, kInf};
  // Relaxations by (geometry, in-flight micro-batches).
  std::map<std::pair<int, double>, StageRelaxation> relaxations;
};

// ---- the search -------------------------------------------------------------------------------

struct Config {
  int pp = 1, Bm = 1, M = 1, v = 1;
  int cpg = 0;  // context group: index into Searcher::cp_groups_ (0: cp 1)
  Schedule sched = Schedule::one_f_one_b;
  double lb = 0;
  int order = 0;  // enumeration index (tie-break of equal bounds)
  ScheduleShape shape() const {
    return {pp, v, sched, M, sched == Schedule::interleaved ? interleaved_group(pp, M) : 0};
  }
};

// The space's pipeline degrees and micro-batch sizes (Bm).
std::vector<int> pp_list(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o);
std::vector<int> bm_list(const SearchOptions& o);
// The baseline spaces (baselines.cpp): uniform Megatron-style plans, ZeRO-3 data parallelism.
std::vector<Plan> megatron_plans(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o);
std::vector<Plan> zero_plans(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o);
// Micro-batches whose saved activations stage s holds at its worst moment, and the least of
// them under the interleaved schedule (bounds.cpp).
double in_flight(const Config& cf, int s);
double interleaved_least_in_flight(const Config& cf, int s);
// The lower bound's relaxation of a stage with k micro-batches in flight (bounds.cpp).
StageRelaxation relax_stage(const GeoData& gd, double k);

// What one configuration's search (ConfigSearch, config_search.cpp) reads, and where it leaves
// what it finds: these parts of the Searcher rather than the Searcher.
struct ConfigSearchContext {
  const ModelSpec& m;
  const ClusterSpec& c;
  const SearchOptions& o;
  const CostTables& tables;
  Workers& workers;  // its DPs and DP queries run on them
  // Bytes (Searcher: the same names); net_budget less what every plan of the configuration
  // holds of NCCL's buffers (nccl_floor, in tensor bytes).
  int64_t budget, net_budget, bucket;
  int64_t nccl_floor;  // the least NCCL buffers of a rank of the configuration's plans
  TopK& full;
  MinMemory& min_memory;
  EvaluatedLog& evaluated;
  int64_t& scored;      // plans scored
  int64_t& dp_cells;    // cells of the stage DPs built
  int64_t& violations;  // plans that fit, faster than the configuration's lower bound
  bool fits(const Scored& s) const { return s.peak <= budget; }
};

class Searcher {
 public:
  Searcher(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o, int64_t budget)
      : m_(m),
        c_(c),
        o_(o),
        budget_(budget),
        tables_(
            m, c, o.dtype, o.flash_attention, o.overlap_grad_reduce, o.framework,
            o.space == SearchSpace::full ? cp_degrees_for(m, c, o.cp_degrees) : std::vector<int>{}),
        full_(o.top_k),
        megatron_(o.top_k),
        zero_(o.top_k),
        megatron_ep_(o.top_k),
        simulations_(m, c, o.framework, budget) {
    filter_.tp_degrees = o.tp_degrees;
    filter_.zero_stages = o.zero_stages;
    filter_.recompute = o.recompute;
    filter_.sequence_parallel_off = o.sequence_parallel_off;
    filter_.sequence_parallel_on = o.sequence_parallel_on;
    filter_.offload = o.offload;
    filter_.max_samples_per_rank = o.max_samples_per_rank;
    filter_.max_tp = o.allow_cross_node_tp ? c.world_size() : 0;
    filter_.flash_attention = o.flash_attention;
    // Context groups: cp 1 (tp free per layer), then each cp > 1 with each tp it can take.
    cp_groups_.push_back({1, 1});
    const int max_tp = filter_.max_tp > 0 ? filter_.max_tp : std::max(1, c.node.gpus_per_node);
    for (int cp : tables_.cp_degrees())
      for (int tp = 1; tp <= max_tp && int64_t(tp) * cp <= c.world_size(); tp *= 2)
        cp_groups_.push_back({cp, tp});
    // The tensors' room: what the GPU process ledger leaves of the budget. Its NCCL part
    // depends on the plan's communicators, so it is left out here: the room is an upper bound
    // (the bounds stay bounds), and a plan it admits that does not fit is refused by its peak.
    const GpuSpec& g = c.gpu;
    net_budget_ = int64_t(double(budget_ - g.process.cuda_context_bytes) /
                          (1.0 + g.allocator_fragmentation)) -
                  g.process.cublas_workspace_bytes;
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
  std::vector<Config> configs() const;
  const PairData& pair(int pp, int Bm, int cpg = 0);
  PairData& pair_mutable(int pp, int Bm, int cpg = 0);
  // The space filter of a context group (Config::cpg).
  SpaceFilter filter_for(int cpg) const {
    SpaceFilter f = filter_;
    f.cp = cp_groups_[size_t(cpg)].first;
    f.cp_tp = cp_groups_[size_t(cpg)].second;
    return f;
  }
  double lower_bound(const Config& cf);
  void bound_configs(std::vector<Config>& cfs);
  void search_configs(std::vector<Config>& cfs);
  [[noreturn]] void throw_no_plan_fits(const std::vector<Config>& cfs);
  void search_config(const Config& cf);
  // The least NCCL buffers a rank holds in any plan of configuration cf: of the uniform plans of
  // each tensor degree it allows (with the cp kind that sends nothing point to point), the least
  // over them and over the stages. A plan's other layers only add communicators, so the DP's
  // room net_budget_ less this stays an upper bound.
  int64_t nccl_floor(const Config& cf) const;
  void min_memory_config(const Config& cf);
  void baselines();
  bool fits(const Scored& s) const { return s.peak <= budget_; }
  void consider(const Plan& p, const char* origin, TopK* space_pool);
  // The zero-bubble schedules as variants of the full space's best 1F1B plans (zero_bubble.cpp).
  void split_backward_variants();
  void tick(const char* what);
  // MPI merge
  std::string pack() const;
  void merge(const std::vector<std::string>& parts);
  void rerank(SearchResult& r);
  void rerank_progress(size_t done, size_t total, int threads);
  void rank_result(const std::vector<SearchCandidate>& set, SearchResult& r) const;
  // The pool of the space searched (o_.space).
  const TopK& own_pool() const {
    return o_.space == SearchSpace::full       ? full_
           : o_.space == SearchSpace::megatron ? megatron_
                                               : zero_;
  }
  int rerank_threads() const;

  const ModelSpec& m_;
  const ClusterSpec& c_;
  const SearchOptions& o_;
  int64_t budget_;
  int64_t net_budget_ = 0;
  int64_t bucket_ = 64 << 20;
  CostTables tables_;
  SpaceFilter filter_;
  std::vector<std::pair<int, int>> cp_groups_;  // (cp, its tp); [0]: cp 1, tp free
  std::map<std::tuple<int, int, int>, std::unique_ptr<PairData>> pairs_;  // (pp, Bm, cpg)
  TopK full_, megatron_, zero_;
  // Uniform Megatron-style plans with expert parallelism (an MoE model): re-ranked beside the
  // baselines, so that the estimator's top K of the full space cannot crowd them out, but not
  // a baseline (the megatron baseline is the best uniform plan with ep 1).
  TopK megatron_ep_;
  MinMemory min_memory_;
  EvaluatedLog evaluated_;  // every plan scored, bounded (evaluated.hpp)
  SearchStats stats_;
  int64_t local_scored_ = 0, local_searched_ = 0, local_dp_cells_ = 0, local_violations_ = 0;
  int rank_ = 0, procs_ = 1;
  Clock::time_point t0_ = Clock::now(), last_progress_ = Clock::now();
  int64_t progress_done_ = 0, progress_total_ = 0;
  // The threads a configuration's independent DPs and DP queries run on, during the DP
  // search (rerank_threads() of them: the cores this process may use).
  std::unique_ptr<Workers> workers_;
  // The re-rank's simulations; on one process with a spare core the baselines' start beside
  // the DP search (run()).
  SimulationScheduler simulations_;
};

// The largest layer count the search gives one stage of a pp-stage pipeline.
int n_max_of(int L, int pp, int v);
// Every process's string, in process order (an all-gather of variable-length strings).
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine);
int64_t resolve_budget(const ClusterSpec& c, const SearchOptions& o);
void check_options(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o);

}  // namespace stratagem::search_detail
