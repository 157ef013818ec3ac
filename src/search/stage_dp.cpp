#include "src/search/stage_dp.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

namespace stratagem::search_detail {

namespace {
// dst[j] = min(dst[j], src[j] + add): the DP's inner loop (kept apart so that it vectorizes).
// GCC: unrolled, and full-width vectors where the target has them (AVX-512: a fifth less time
// in it on the development host); the same values, element by element.
#if defined(__GNUC__) && !defined(__clang__)
#define STRATAGEM_RELAX_ATTRS \
  __attribute__((noinline, optimize("unroll-loops"), target("prefer-vector-width=512")))
#else
#define STRATAGEM_RELAX_ATTRS __attribute__((noinline))
#endif
STRATAGEM_RELAX_ATTRS void relax(const double* __restrict src, double* __restrict dst, size_t len,
                                 double add) {
#pragma omp simd
  for (size_t j = 0; j < len; ++j) {
    const double v = src[j] + add, cur = dst[j];
    dst[j] = v < cur ? v : cur;
  }
}

std::vector<int64_t> distinct_sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}
// At most k values of the sorted list `v`, each a member of it, always including the largest:
// every value of v is covered by the next chosen one at or above it.
std::vector<int64_t> merged_classes(const std::vector<int64_t>& v, int k) {
  if (int(v.size()) <= k || k <= 0) return v;
  std::vector<int64_t> out;
  const size_t n = v.size();
  for (int i = 1; i <= k; ++i) {
    const size_t idx = (n * size_t(i) + size_t(k) - 1) / size_t(k) - 1;
    if (out.empty() || out.back() != v[idx]) out.push_back(v[idx]);
  }
  return out;
}
}  // namespace

StageDp::StageDp(StageDpProblem p) : p_(std::move(p)) {
  class_count_ = std::max(1, p_.num_classes);
  if (int(p_.reshard.size()) != class_count_ * class_count_)
    p_.reshard.assign(size_t(class_count_) * class_count_, 0.0);
  if (p_.items.size() > 32767) throw std::logic_error("StageDp: too many items");
  budget_buckets_ =
      std::max<int64_t>(0, p_.max_budget_bytes / std::max<int64_t>(1, p_.bucket_bytes));
  if (budget_buckets_ >= int64_t(INT32_MAX))
    throw std::logic_error("StageDp: memory axis too long");
  set_cover_levels();
  quantize_costs();
  min_reshard_to_.assign(class_count_, kInf);
  for (int b = 0; b < class_count_; ++b)
    for (int c = 0; c < class_count_; ++c)
      min_reshard_to_[c] = std::min(min_reshard_to_[c], p_.reshard[size_t(b) * class_count_ + c]);
  auto floor_level = [&](int64_t x) {
    return int(std::upper_bound(levels_.begin(), levels_.end(), x) - levels_.begin()) - 1;
  };
  const int S = int(p_.items.size());
  after_.assign(S, std::vector<int>(level_count_, 0));
  for (int i = 0; i < S; ++i)
    for (int q = 0; q < level_count_; ++q)
      after_[i][q] = floor_level(levels_[q] + p_.items[i].kept);
  build_thresholds();
}

// Cover levels: 0 and the items' kept activations (merged, rounding down, so the cover a
// level promises is always there).
void StageDp::set_cover_levels() {
  std::vector<int64_t> kept;
  for (const auto& it : p_.items)
    if (it.kept > 0) kept.push_back(it.kept);
  kept = distinct_sorted(kept);
  levels_ = {0};
  if (p_.exact) {
    levels_.insert(levels_.end(), kept.begin(), kept.end());
  } else if (!kept.empty() && p_.max_kept_levels > 0) {
    const int q = p_.max_kept_levels;
    for (int i = 1; i <= q; ++i) {
      const int64_t v = kept[(kept.size() * size_t(i)) / size_t(q + 1)];
      if (v > levels_.back()) levels_.push_back(v);
    }
  }
  level_count_ = int(levels_.size());
}

// The quantum (see stage_dp.hpp): 2^-50 of a bound on any stage's objective, a power of two.
void StageDp::quantize_costs() {
  double item = 0, ends = 0, reshard = 0;
  for (const auto& it : p_.items) {
    item = std::max(item, std::abs(it.cost));
    ends = std::max(ends, std::abs(it.first) + std::abs(it.last));
  }
  for (double r : p_.reshard) reshard = std::max(reshard, std::abs(r));
  // n layers, n - 1 reshards between them and one from the embedding, the pass ends.
  const double bound = double(std::max(1, p_.n_max)) * (item + reshard) + ends;
  if (bound > 0 && std::isfinite(bound)) {
    int e = 0;
    std::frexp(bound, &e);  // bound < 2^e
    quantum_ = std::ldexp(1.0, e - 50);
  }
  for (auto& it : p_.items) {
    it.cost = quantize(it.cost);
    it.first = quantize(it.first);
    it.last = quantize(it.last);
  }
  for (auto& r : p_.reshard) r = quantize(r);
}

// Thresholds: what a layer may need beyond its cover, and the workspace; a table each.
void StageDp::build_thresholds() {
  std::vector<int64_t> trs, wss;
  for (const auto& it : p_.items) {
    wss.push_back(it.ws);
    for (int q = 0; q < level_count_; ++q) trs.push_back(std::max<int64_t>(0, it.tr - levels_[q]));
  }
  trs = distinct_sorted(trs);
  wss = distinct_sorted(wss);
  if (!p_.exact) {
    // Values closer than 1/128 of the budget axis fold into the larger, then at most
    // max_tr_classes remain (each rounded up to a member).
    const int64_t close = std::max<int64_t>(p_.bucket_bytes, p_.max_budget_bytes / 128);
    std::vector<int64_t> folded;
    for (auto it = trs.rbegin(); it != trs.rend(); ++it)
      if (folded.empty() || folded.back() - *it > close) folded.push_back(*it);
    std::reverse(folded.begin(), folded.end());
    trs = merged_classes(folded, p_.max_tr_classes);
    if (!wss.empty()) wss = {wss.back()};
  }
  for (int64_t ws : wss)
    for (int64_t tr : trs) {
      Threshold t;
      t.tr = tr, t.ws = ws;
      t.items = front(t, false, false, false, true);
      t.tail = front(t, false, true, true, true);
      t.head = front(t, true, false, false, false);
      t.single = front(t, true, true, true, false);
      if (t.single.empty() && t.head.empty()) continue;
      run(t);
      thr_.push_back(std::move(t));
    }
}

// Under threshold t an item matters through (cost + the row's edges, w) and, where layers sit
// above it, through the levels it admits and leads to: the items no other of their class
// beats in all of these.
std::vector<int> StageDp::front(const Threshold& t, bool with_first, bool with_last,
                                bool level0_only, bool above) const {
  const int S = int(p_.items.size());
  auto usable = [&](const DpItem& it) {
    return it.ws <= t.ws && it.w <= budget_buckets_ && admits(t, it, level_count_ - 1);
  };
  auto c_of = [&](const DpItem& it) {
    return it.cost + (with_first ? it.first : 0.0) + (with_last ? it.last : 0.0);
  };
  std::vector<int> out;
  for (int c = 0; c < class_count_; ++c)
    for (int i = 0; i < S; ++i) {
      const DpItem& it = p_.items[i];
      if (it.cls != c || !usable(it) || (level0_only && !admits(t, it, 0))) continue;
      bool dead = false;
      for (int j = 0; j < S && !dead; ++j) {
        const DpItem& o = p_.items[j];
        if (j == i || o.cls != c || !usable(o) || (level0_only && !admits(t, o, 0))) continue;
        bool beats = c_of(o) <= c_of(it) && o.w <= it.w;
        bool equal = c_of(o) == c_of(it) && o.w == it.w;
        for (int q = 0; q < (level0_only ? 1 : level_count_) && beats; ++q) {
          beats = beats && (admits(t, o, q) || !admits(t, it, q));
          equal = equal && admits(t, o, q) == admits(t, it, q);
          if (above) {
            beats = beats && after_[j][q] >= after_[i][q];
            equal = equal && after_[j][q] == after_[i][q];
          }
        }
        dead = beats && (!equal || j < i);
      }
      if (!dead) out.push_back(i);
    }
  return out;
}

double StageDp::quantize(double x) const {
  if (quantum_ <= 0 || !std::isfinite(x)) return x;
  return std::nearbyint(x / quantum_) * quantum_;
}

StageDp::~StageDp() = default;

void StageDp::run(Threshold& t) {
  const int N = std::max(1, p_.n_max);
  const size_t row = size_t(budget_buckets_ + 1);
  const size_t CQ = size_t(class_count_) * size_t(level_count_);
  // Rows 1 .. N-1 (row N, the first layer, is resolved by best()).
  const size_t size = size_t(N - 1) * CQ * row;
  // Each row is set to infinity from its start (the least entry an item writes; below it the
  // row is infinite and left unwritten, read through fv()) right before it is filled (stays in
  // cache). Freed tables' pages stay in the heap during the search (Searcher::run), so a new
  // table reuses them without faulting them in: no pool of tables is needed.
  t.f.resize(size);
  t.start.assign(size_t(N - 1) * CQ, uint32_t(row));
  DpTable g(CQ * row);  // filled from gfirst before it is read, as the rows
  auto grow = [&](int b, int q) { return g.data() + (size_t(b) * level_count_ + size_t(q)) * row; };
  std::vector<size_t> ffirst(CQ), gfirst(CQ);
  for (int n = 1; n <= N - 1; ++n) {
    const std::vector<int>& items = n == 1 ? t.tail : t.items;
    // g[b][q][m]: the cheapest n-1 layers below within m buckets, at cover level q, next to a
    // class-b layer; infinite below gfirst[b][q] (entries there are not read).
    if (n == 1) {
      std::fill(g.begin(), g.end(), kInf);
      for (int b = 0; b < class_count_; ++b) std::fill(grow(b, 0), grow(b, 0) + row, 0.0);
      std::fill(gfirst.begin(), gfirst.end(), row);
      for (int b = 0; b < class_count_; ++b) gfirst[size_t(b) * level_count_] = 0;
    } else {
      // Rows are infinite below their first finite entry (f does not grow with memory): the
      // relaxations start there.
      for (int a = 0; a < class_count_; ++a)
        for (int q = 0; q < level_count_; ++q) {
          const size_t r = size_t(n - 2) * CQ + size_t(a) * level_count_ + size_t(q);
          const double* fa = t.f.data() + r * row;
          ffirst[size_t(a) * level_count_ + q] = size_t(
              std::find_if(fa + t.start[r], fa + row, [](double x) { return x != kInf; }) - fa);
        }
      for (int b = 0; b < class_count_; ++b)
        for (int q = 0; q < level_count_; ++q) {
          double* gb = grow(b, q);
          size_t first = row;
          for (int a = 0; a < class_count_; ++a)
            first = std::min(first, ffirst[size_t(a) * level_count_ + q]);
          std::fill(gb + first, gb + row, kInf);
          for (int a = 0; a < class_count_; ++a) {
            const size_t o = ffirst[size_t(a) * level_count_ + q];
            relax(t.f.data() + at(n - 1, 0, a, q) + o, gb + o, row - o,
                  p_.reshard[size_t(a) * class_count_ + b]);
          }
          gfirst[size_t(b) * level_count_ + q] = first;
        }
    }
    // Where each row of f starts: the least entry an item writes.
    uint32_t* st = t.start.data() + size_t(n - 1) * CQ;
    for (int i : items) {
      const DpItem& it = p_.items[i];
      for (int q = 0; q < (n == 1 ? 1 : level_count_); ++q) {
        if (!admits(t, it, q)) continue;
        const size_t o = gfirst[size_t(it.cls) * level_count_ + q] + size_t(it.w);
        uint32_t& s0 = st[size_t(it.cls) * level_count_ + size_t(after_[i][q])];
        if (o < row) s0 = std::min(s0, uint32_t(o));
      }
    }
    for (size_t r = 0; r < CQ; ++r) {
      double* fr = t.f.data() + (size_t(n - 1) * CQ + r) * row;
      std::fill(fr + st[r], fr + row, kInf);
    }
    // One item at a time over the whole memory row (contiguous, vectorizes). No parent
    // pointers: reconstruct() finds the first (item, level) in this order that gives the value.
    for (int i : items) {
      const DpItem& it = p_.items[i];
      const double cost = it.cost + (n == 1 ? it.last : 0.0);
      const size_t w = size_t(it.w);
      for (int q = 0; q < (n == 1 ? 1 : level_count_); ++q) {
        if (!admits(t, it, q)) continue;
        // f[m] = min(f[m], g[m - w] + cost) for m >= w (g is infinite below gfirst).
        const size_t o = gfirst[size_t(it.cls) * level_count_ + q];
        if (o + w >= row) continue;
        relax(grow(it.cls, q) + o, t.f.data() + at(n, 0, it.cls, after_[i][q]) + w + o, row - w - o,
              cost);
      }
    }
    cells_ += uint64_t(row) *
              (items.size() * level_count_ + size_t(class_count_) * class_count_ * level_count_);
  }
}

}  // namespace stratagem::search_detail
