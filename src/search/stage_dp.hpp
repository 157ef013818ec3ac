// The dynamic program over the layers of one pipeline stage, under a discretized memory budget,
// and the stage-partition solver on top of it. Its tables are built in stage_dp.cpp, queried in
// stage_dp_query.cpp; the partition solver is partition.cpp, the reference model and brute
// force the tests compare with stage_dp_reference.cpp.
//
// Stage model. A stage runs layers c_0 (first) .. c_{n-1} (last); each c_l is an item (a layer
// strategy with its costs). The stage costs
//     sum_l cost(c_l) + sum_{l>0} reshard(class(c_{l-1}), class(c_l))
//       + first(c_0) + entry(class(c_0)) + last(c_{n-1})
// (first/last: what a stage's first and last layer add, e.g. weight fetches or activation copies
// nothing can hide; entry: per class, e.g. the reshard from the embedding, given per query), and
// fits its budget when
//     bucket * sum_l w(c_l) + max(max_l e_l, extra_tr) + max(max_l ws(c_l), extra_ws) <= budget.
// w is the item's resident memory (model states + in-flight saved activations) in buckets,
// rounded up; ws its gradient workspace. e_l is what layer l needs at its worst moment beyond
// the activations of the layers up to it: its transient tr(c_l) less the activations of the
// layers after it, which its backward pass has already freed; that cover is counted in levels:
//     q_{n-1} = 0,  q_{l-1} = floor_level(q_l + kept(c_l)),  e_l = max(0, tr(c_l) - q_l)
// where floor_level rounds down to one of the levels 0 = L_0 < L_1 < .. (from the items' kept
// activations). The DP builds a stage from its last layer up (rows 1 .. n) with state
// (row, memory, class of the row's layer, level) and resolves the first layer, row n, at query
// time. The max terms are handled by thresholds: per threshold (X_tr, X_ws) the DP admits an
// item at level q when tr - L_q <= X_tr and ws <= X_ws, and reserves X_tr and X_ws. With every
// distinct threshold and level (exact mode) the DP is exact for this model; by default the
// thresholds are merged into a few classes and the levels into one (each rounded so that
// answers still fit).
//
// Exact sums: every term of the objective (item costs, reshards, entry costs) is rounded to a
// multiple of one power of two, the quantum, 2^-50 of a bound on the largest stage cost (within
// 2^-51 of it: a relative error near 1e-15), and coarse enough that every sum the DP forms is
// exact (below 2^53 quanta). A sequence's cost is then the same whatever the order its terms are
// added in, so sequences of equal cost (the same layers in another order, common when layers are
// identical) tie exactly, and the DP's fixed order of items decides between them, the same in every
// build. (Without it the last bits of the costs decided: a build with fused multiply-adds, such as
// the release build's -march=native, picked another of two equal plans than the ASan build.) Among
// equal costs an answer also takes the least memory (buckets) that reaches that cost.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace stratagem::search_detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// An allocator whose resize() leaves new elements uninitialized: the DP fills each row of its
// tables right before it reads them, so zeroing them first was a tenth of the DP's time.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using DpTable = std::vector<double, UninitAllocator<double>>;

struct DpItem {
  int id = 0;        // the caller's index
  int cls = 0;       // reshard class, 0 .. num_classes-1
  double cost = 0;   // objective (seconds per iteration)
  double last = 0;   // extra cost when it is the stage's last layer
  double first = 0;  // extra cost when it is the stage's first layer
  int64_t w = 0;     // resident memory in buckets
  int64_t tr = 0;    // transient bytes beyond its own kept activations
  int64_t kept = 0;  // saved activations of one micro-batch (covers earlier layers' peaks)
  int64_t ws = 0;    // workspace bytes
};

struct StageDpProblem {
  std::vector<DpItem> items;
  int num_classes = 1;
  std::vector<double> reshard;  // [a * num_classes + b]: from a layer of class a to one of b
  int n_max = 1;                // longest sequence asked for
  int64_t bucket_bytes = 64LL << 20;
  int64_t max_budget_bytes = 0;  // the largest budget a query passes (bounds the memory axis)
  int max_tr_classes = 3;
  int max_kept_levels = 1;  // levels above 0
  bool exact = false;       // every distinct threshold and level: exact for the model above
};

class StageDp {
 public:
  explicit StageDp(StageDpProblem p);
  ~StageDp();
  StageDp(const StageDp&) = delete;
  StageDp& operator=(const StageDp&) = delete;

  struct Answer {
    double cost = kInf;
    int threshold = -1;
    int64_t m = -1;        // memory cap in buckets
    int head = -1;         // the first layer's item (index into problem().items)
    int level = 0;         // cover level below the first layer
    int64_t reserved = 0;  // bytes reserved for the transient and workspace maxima
  };
  // Cheapest n-layer sequence within `budget_bytes`, reserving at least extra_tr / extra_ws;
  // `entry` (per class, may be null) is added for the class of the first layer.
  Answer best(int n, int64_t budget_bytes, int64_t extra_tr, int64_t extra_ws,
              const std::vector<double>* entry = nullptr) const;
  // What a query leaves each threshold: its memory cap in buckets, -1 where the reserve alone
  // exceeds the budget. best() depends on the budget and the extra reserves only through them,
  // so queries with equal caps (and entry) have equal answers.
  std::vector<int64_t> caps(int64_t budget_bytes, int64_t extra_tr, int64_t extra_ws) const;
  // best() from caps (Answer::reserved is left 0).
  Answer best_within(int n, const std::vector<int64_t>& caps,
                     const std::vector<double>* entry = nullptr) const;
  // best_within(n, caps, entry).cost for every n in [n_lo, n_hi] (out[n]; out is resized to at
  // least n_hi + 1 and other entries are left alone): the same values, found faster by visiting
  // each threshold's first-layer items in increasing cost.
  void best_costs(const std::vector<int64_t>& caps, const std::vector<double>* entry, int n_lo,
                  int n_hi, std::vector<double>& out) const;
  // The same for several rows that share the caps and differ in the entry costs (one pass over
  // the items for all of them).
  struct CostRow {
    const std::vector<double>* entry;  // may be null
    std::vector<double>* out;
  };
  void best_costs(const std::vector<int64_t>& caps, const std::vector<CostRow>& rows, int n_lo,
                  int n_hi) const;
  // The same for several queries, each with its caps and rows: one pass over the table's layer
  // counts answers them all, so that each part of the table comes from memory once for all of
  // them (a query at a time, the lookups of each pass missed the cache).
  struct CostQuery {
    const std::vector<int64_t>* caps;
    std::vector<CostRow> rows;
  };
  void best_costs(const std::vector<CostQuery>& queries, int n_lo, int n_hi) const;
  // Item ids of that sequence, the stage's first layer first; `footprint` (optional) gets the
  // model's memory of it: buckets x bucket bytes + the reserved bytes.
  std::vector<int> reconstruct(int n, const Answer& a, int64_t* footprint = nullptr) const;

  // The problem as the DP solves it: its costs rounded to the quantum (see the top).
  const StageDpProblem& problem() const { return p_; }
  double quantum() const { return quantum_; }
  // x rounded to a multiple of the quantum (kInf stays kInf): what a caller adds to the DP's
  // costs, so that those sums stay exact too.
  double quantize(double x) const;
  const std::vector<int64_t>& levels() const { return levels_; }
  uint64_t cells() const { return cells_; }
  int thresholds() const { return int(thr_.size()); }

 private:
  struct Threshold {
    int64_t tr = 0, ws = 0;
    std::vector<int> items;   // rows 2 .. n-1
    std::vector<int> tail;    // row 1, the stage's last layer
    std::vector<int> head;    // row n, the first layer
    std::vector<int> single;  // n = 1: first and last
    DpTable f;  // [(((n - 1) * C + cls) * Q + level) * (M + 1) + m], rows n = 1 .. N-1
    // Per row (n, cls, level), [((n - 1) * C + cls) * Q + level]: the entries below it are
    // infinite and left unwritten (no item reaches them; read through fv()).
    std::vector<uint32_t> start;
  };
  // f[n][m][cls][q], infinite below the row's start.
  double fv(const Threshold& t, int n, int64_t m, int cls, int q) const {
    const size_t r =
        (size_t(n - 1) * size_t(class_count_) + size_t(cls)) * size_t(level_count_) + size_t(q);
    return m < int64_t(t.start[r]) ? kInf : t.f[r * size_t(budget_buckets_ + 1) + size_t(m)];
  }
  size_t at(int n, int64_t m, int cls, int q) const {
    return ((size_t(n - 1) * size_t(class_count_) + size_t(cls)) * size_t(level_count_) +
            size_t(q)) *
               size_t(budget_buckets_ + 1) +
           size_t(m);
  }
  bool admits(const Threshold& t, const DpItem& it, int q) const {
    return it.tr - levels_[q] <= t.tr;
  }
  void set_cover_levels();
  void quantize_costs();
  void build_thresholds();
  std::vector<int> front(const Threshold& t, bool with_first, bool with_last, bool level0_only,
                         bool above) const;
  void run(Threshold& t);
  // Parts of best_costs (stage_dp_query.cpp).
  void take_least(const CostQuery& qu, const double* lq, const double* ents, int n) const;
  void least_single(const Threshold& t, int64_t m, double* lq) const;
  void head_order(const Threshold& t, int64_t m, std::vector<std::pair<double, int>>* o) const;
  void least_above(const Threshold& t, int n, int64_t m, double lb_below,
                   const std::vector<std::pair<double, int>>* o, double* lq) const;
  // g[b][q][m] of row n (the cheapest n-1 layers below, next to a class-b layer) at one m.
  double below(const Threshold& t, int n, int64_t m, int b, int q) const;

  StageDpProblem p_;
  int class_count_ = 1, level_count_ = 1;
  int64_t budget_buckets_ = 0;
  std::vector<int64_t> levels_;          // memory levels, levels_[0] = 0
  std::vector<std::vector<int>> after_;  // [item][level] -> level after adding the item below
  std::vector<double> min_reshard_to_;   // [class]: the cheapest reshard into it
  double quantum_ = 0;                   // 0: every cost is 0, nothing to round
  std::vector<Threshold> thr_;
  uint64_t cells_ = 0;
};

// The model above, evaluated for one sequence (its cost, kInf when it does not fit).
double stage_model_cost(const StageDpProblem& p, const std::vector<int64_t>& levels,
                        const std::vector<int>& item_index, int64_t budget_bytes, int64_t extra_tr,
                        int64_t extra_ws, const std::vector<double>* entry = nullptr);
// Brute force over every sequence of n items for the same model (tests). Returns the minimum
// cost (kInf when nothing fits) and, if asked, the sequence of item ids.
double brute_force_stage(const StageDpProblem& p, const std::vector<int64_t>& levels, int n,
                         int64_t budget_bytes, int64_t extra_tr, int64_t extra_ws,
                         const std::vector<double>* entry = nullptr,
                         std::vector<int>* best = nullptr);

// Stage partition. T[s][n] is the cost of stage s holding n layers (kInf: does not fit or not
// allowed), n = 0 .. T[s].size()-1. Chooses n_s >= n_min with sum n_s = L minimizing
//     max_s T[s][n_s] + bubble_weight * (sum_s T[s][n_s] - max_s T[s][n_s])
// (the slowest stage paces every micro-batch; the others fill and drain the pipeline): the
// smallest achievable maximum is found by bisection over the stage costs, then larger maxima
// are tried, each with the least sum under it, while they can still win (exact for
// bubble_weight in [0, 1]). Empty when nothing is feasible.
std::vector<int> solve_partition(const std::vector<std::vector<double>>& T, int L, int n_min,
                                 double bubble_weight, double* objective = nullptr);
// Minimum over partitions of sum_s T[s][n_s] (lower bounds).
double min_sum_partition(const std::vector<std::vector<double>>& T, int L, int n_min);

}  // namespace stratagem::search_detail
