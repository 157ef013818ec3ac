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
  C_ = std::max(1, p_.num_classes);
  if (int(p_.reshard.size()) != C_ * C_) p_.reshard.assign(size_t(C_) * C_, 0.0);
  if (p_.items.size() > 32767) throw std::logic_error("StageDp: too many items");
  M_ = std::max<int64_t>(0, p_.max_budget_bytes / std::max<int64_t>(1, p_.bucket_bytes));
  if (M_ >= int64_t(INT32_MAX)) throw std::logic_error("StageDp: memory axis too long");
  const int S = int(p_.items.size());
  // Cover levels: 0 and the items' kept activations (merged, rounding down, so the cover a
  // level promises is always there).
  std::vector<int64_t> kept;
  for (const auto& it : p_.items)
    if (it.kept > 0) kept.push_back(it.kept);
  kept = distinct_sorted(kept);
  L_ = {0};
  if (p_.exact) {
    L_.insert(L_.end(), kept.begin(), kept.end());
  } else if (!kept.empty() && p_.max_kept_levels > 0) {
    const int q = p_.max_kept_levels;
    for (int i = 1; i <= q; ++i) {
      const int64_t v = kept[(kept.size() * size_t(i)) / size_t(q + 1)];
      if (v > L_.back()) L_.push_back(v);
    }
  }
  Q_ = int(L_.size());
  // The quantum (see stage_dp.hpp): 2^-50 of a bound on any stage's objective, a power of two.
  {
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
  min_reshard_to_.assign(C_, kInf);
  for (int b = 0; b < C_; ++b)
    for (int c = 0; c < C_; ++c)
      min_reshard_to_[c] = std::min(min_reshard_to_[c], p_.reshard[size_t(b) * C_ + c]);
  auto floor_level = [&](int64_t x) {
    return int(std::upper_bound(L_.begin(), L_.end(), x) - L_.begin()) - 1;
  };
  after_.assign(S, std::vector<int>(Q_, 0));
  for (int i = 0; i < S; ++i)
    for (int q = 0; q < Q_; ++q) after_[i][q] = floor_level(L_[q] + p_.items[i].kept);
  // Thresholds: what a layer may need beyond its cover, and the workspace.
  std::vector<int64_t> trs, wss;
  for (const auto& it : p_.items) {
    wss.push_back(it.ws);
    for (int q = 0; q < Q_; ++q) trs.push_back(std::max<int64_t>(0, it.tr - L_[q]));
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
      // Under this threshold an item matters through (cost + the row's edges, w) and, where
      // layers sit above it, through the levels it admits and leads to: keep the front.
      auto usable = [&](const DpItem& it) {
        return it.ws <= ws && it.w <= M_ && admits(t, it, Q_ - 1);
      };
      auto front = [&](bool with_first, bool with_last, bool level0_only, bool above) {
        std::vector<int> out;
        auto c_of = [&](const DpItem& it) {
          return it.cost + (with_first ? it.first : 0.0) + (with_last ? it.last : 0.0);
        };
        for (int c = 0; c < C_; ++c)
          for (int i = 0; i < S; ++i) {
            const DpItem& it = p_.items[i];
            if (it.cls != c || !usable(it) || (level0_only && !admits(t, it, 0))) continue;
            bool dead = false;
            for (int j = 0; j < S && !dead; ++j) {
              const DpItem& o = p_.items[j];
              if (j == i || o.cls != c || !usable(o) || (level0_only && !admits(t, o, 0))) continue;
              bool beats = c_of(o) <= c_of(it) && o.w <= it.w;
              bool equal = c_of(o) == c_of(it) && o.w == it.w;
              for (int q = 0; q < (level0_only ? 1 : Q_) && beats; ++q) {
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
      };
      t.items = front(false, false, false, true);
      t.tail = front(false, true, true, true);
      t.head = front(true, false, false, false);
      t.single = front(true, true, true, false);
      if (t.single.empty() && t.head.empty()) continue;
      run(t);
      thr_.push_back(std::move(t));
    }
}

double StageDp::quantize(double x) const {
  if (quantum_ <= 0 || !std::isfinite(x)) return x;
  return std::nearbyint(x / quantum_) * quantum_;
}

StageDp::~StageDp() = default;

void StageDp::run(Threshold& t) {
  const int N = std::max(1, p_.n_max);
  const size_t row = size_t(M_ + 1);
  const size_t CQ = size_t(C_) * size_t(Q_);
  // Rows 1 .. N-1 (row N, the first layer, is resolved by best()).
  const size_t size = size_t(N - 1) * CQ * row;
  // Each row is set to infinity from its start (the least entry an item writes; below it the
  // row is infinite and left unwritten, read through fv()) right before it is filled (stays in
  // cache). Freed tables' pages stay in the heap during the search (Searcher::run), so a new
  // table reuses them without faulting them in: no pool of tables is needed.
  t.f.resize(size);
  t.start.assign(size_t(N - 1) * CQ, uint32_t(row));
  DpTable g(CQ * row);  // filled from gfirst before it is read, as the rows
  auto grow = [&](int b, int q) { return g.data() + (size_t(b) * Q_ + size_t(q)) * row; };
  std::vector<size_t> ffirst(CQ), gfirst(CQ);
  for (int n = 1; n <= N - 1; ++n) {
    const std::vector<int>& items = n == 1 ? t.tail : t.items;
    // g[b][q][m]: the cheapest n-1 layers below within m buckets, at cover level q, next to a
    // class-b layer; infinite below gfirst[b][q] (entries there are not read).
    if (n == 1) {
      std::fill(g.begin(), g.end(), kInf);
      for (int b = 0; b < C_; ++b) std::fill(grow(b, 0), grow(b, 0) + row, 0.0);
      std::fill(gfirst.begin(), gfirst.end(), row);
      for (int b = 0; b < C_; ++b) gfirst[size_t(b) * Q_] = 0;
    } else {
      // Rows are infinite below their first finite entry (f does not grow with memory): the
      // relaxations start there.
      for (int a = 0; a < C_; ++a)
        for (int q = 0; q < Q_; ++q) {
          const size_t r = size_t(n - 2) * CQ + size_t(a) * Q_ + size_t(q);
          const double* fa = t.f.data() + r * row;
          ffirst[size_t(a) * Q_ + q] = size_t(
              std::find_if(fa + t.start[r], fa + row, [](double x) { return x != kInf; }) - fa);
        }
      for (int b = 0; b < C_; ++b)
        for (int q = 0; q < Q_; ++q) {
          double* gb = grow(b, q);
          size_t first = row;
          for (int a = 0; a < C_; ++a) first = std::min(first, ffirst[size_t(a) * Q_ + q]);
          std::fill(gb + first, gb + row, kInf);
          for (int a = 0; a < C_; ++a) {
            const size_t o = ffirst[size_t(a) * Q_ + q];
            relax(t.f.data() + at(n - 1, 0, a, q) + o, gb + o, row - o,
                  p_.reshard[size_t(a) * C_ + b]);
          }
          gfirst[size_t(b) * Q_ + q] = first;
        }
    }
    // Where each row of f starts: the least entry an item writes.
    uint32_t* st = t.start.data() + size_t(n - 1) * CQ;
    for (int i : items) {
      const DpItem& it = p_.items[i];
      for (int q = 0; q < (n == 1 ? 1 : Q_); ++q) {
        if (!admits(t, it, q)) continue;
        const size_t o = gfirst[size_t(it.cls) * Q_ + q] + size_t(it.w);
        uint32_t& s0 = st[size_t(it.cls) * Q_ + size_t(after_[i][q])];
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
      for (int q = 0; q < (n == 1 ? 1 : Q_); ++q) {
        if (!admits(t, it, q)) continue;
        // f[m] = min(f[m], g[m - w] + cost) for m >= w (g is infinite below gfirst).
        const size_t o = gfirst[size_t(it.cls) * Q_ + q];
        if (o + w >= row) continue;
        relax(grow(it.cls, q) + o, t.f.data() + at(n, 0, it.cls, after_[i][q]) + w + o, row - w - o,
              cost);
      }
    }
    cells_ += uint64_t(row) * (items.size() * Q_ + size_t(C_) * C_ * Q_);
  }
}

std::vector<int64_t> StageDp::caps(int64_t budget, int64_t extra_tr, int64_t extra_ws) const {
  std::vector<int64_t> out(thr_.size(), -1);
  for (size_t k = 0; k < thr_.size(); ++k) {
    const Threshold& t = thr_[k];
    const int64_t room = budget - (std::max(t.tr, extra_tr) + std::max(t.ws, extra_ws));
    if (room >= 0) out[k] = std::min(M_, room / p_.bucket_bytes);
  }
  return out;
}

StageDp::Answer StageDp::best(int n, int64_t budget, int64_t extra_tr, int64_t extra_ws,
                              const std::vector<double>* entry) const {
  Answer a = best_within(n, caps(budget, extra_tr, extra_ws), entry);
  if (a.threshold >= 0) {
    const Threshold& t = thr_[a.threshold];
    a.reserved = std::max(t.tr, extra_tr) + std::max(t.ws, extra_ws);
  }
  return a;
}

StageDp::Answer StageDp::best_within(int n, const std::vector<int64_t>& caps,
                                     const std::vector<double>* entry) const {
  Answer a;
  if (n < 1 || n > p_.n_max) return a;
  auto ent = [&](int cls) { return entry ? quantize((*entry)[cls]) : 0.0; };
  for (int k = 0; k < int(thr_.size()); ++k) {
    const Threshold& t = thr_[k];
    const int64_t m = caps[size_t(k)];
    if (m < 0) continue;
    // A lower bound of every item's `prev`: f does not grow with memory, so no row-n-1 value an
    // item reads (at m - w) is below its value at m. An item whose total cannot beat the best so
    // far is skipped without its lookups (the same answer: only strictly better values are taken).
    double lb_below = 0;
    if (n > 1) {
      lb_below = kInf;
      for (int b = 0; b < C_; ++b)
        for (int q = 0; q < Q_; ++q) lb_below = std::min(lb_below, fv(t, n - 1, m, b, q));
      if (lb_below == kInf) continue;
    }
    // Row n: the first layer on top of the best n-1 layers below it.
    for (int i : n == 1 ? t.single : t.head) {
      const DpItem& it = p_.items[i];
      if (it.w > m) continue;
      if (n > 1 && a.cost < kInf) {
        const double bound =
            (lb_below + min_reshard_to_[it.cls]) + it.cost + it.first + ent(it.cls);
        if (bound >= a.cost) continue;
      }
      for (int q = 0; q < (n == 1 ? 1 : Q_); ++q) {
        if (!admits(t, it, q)) continue;
        double prev = 0;
        if (n > 1) {
          prev = kInf;
          for (int b = 0; b < C_; ++b)
            prev =
                std::min(prev, fv(t, n - 1, m - it.w, b, q) + p_.reshard[size_t(b) * C_ + it.cls]);
          if (prev == kInf) continue;
        }
        const double v = prev + it.cost + it.first + (n == 1 ? it.last : 0.0) + ent(it.cls);
        if (v < a.cost) a = {v, k, m, i, q, 0};
      }
    }
  }
  return a;
}

void StageDp::best_costs(const std::vector<int64_t>& caps, const std::vector<double>* entry,
                         int n_lo, int n_hi, std::vector<double>& out) const {
  best_costs(caps, {{entry, &out}}, n_lo, n_hi);
}

void StageDp::best_costs(const std::vector<int64_t>& caps, const std::vector<CostRow>& rows,
                         int n_lo, int n_hi) const {
  best_costs({CostQuery{&caps, rows}}, n_lo, n_hi);
}

void StageDp::best_costs(const std::vector<CostQuery>& queries, int n_lo, int n_hi) const {
  const size_t nq = queries.size(), C = size_t(C_);
  for (const CostQuery& qu : queries)
    for (const CostRow& r : qu.rows)
      if (int(r.out->size()) < n_hi + 1) r.out->resize(size_t(n_hi) + 1, kInf);
  n_lo = std::max(n_lo, 1);
  n_hi = std::min(n_hi, p_.n_max);
  // Per query and row, the entry cost of each class. The entry cost is the last term of a total
  // (best_within's sum), and adding it is monotone: the least total of a class is its least
  // total without the entry plus the entry, so one pass over the items serves every row.
  std::vector<size_t> ent_at(nq);
  std::vector<double> ents;
  for (size_t qi = 0; qi < nq; ++qi) {
    ent_at[qi] = ents.size();
    for (const CostRow& r : queries[qi].rows) {
      for (int n = n_lo; n <= n_hi; ++n) (*r.out)[size_t(n)] = kInf;
      for (int c = 0; c < C_; ++c) ents.push_back(r.entry ? quantize((*r.entry)[size_t(c)]) : 0.0);
    }
  }
  // least[qi * C + cls]: the least total (entry left out) of a sequence whose first layer is of
  // class cls.
  std::vector<double> least(nq * C);
  auto take = [&](size_t qi, int n) {
    const double* lq = least.data() + qi * C;
    const auto& rows = queries[qi].rows;
    for (size_t r = 0; r < rows.size(); ++r) {
      double& best = (*rows[r].out)[size_t(n)];
      const double* e = ents.data() + ent_at[qi] + r * C;
      for (size_t c = 0; c < C; ++c) {
        if (lq[c] == kInf) continue;
        const double v = lq[c] + e[c];
        if (v < best) best = v;
      }
    }
  };
  std::vector<std::vector<std::pair<double, int>>> order(nq * C);
  std::vector<double> lbs(nq);
  for (int k = 0; k < int(thr_.size()); ++k) {
    const Threshold& t = thr_[k];
    if (n_lo == 1) {
      for (size_t qi = 0; qi < nq; ++qi) {
        const int64_t m = (*queries[qi].caps)[size_t(k)];
        if (m < 0) continue;
        double* lq = least.data() + qi * C;
        std::fill(lq, lq + C, kInf);
        for (int i : t.single) {
          const DpItem& it = p_.items[i];
          if (it.w > m) continue;
          const double v = 0.0 + it.cost + it.first + it.last;
          if (v < lq[size_t(it.cls)]) lq[size_t(it.cls)] = v;
        }
        take(qi, 1);
      }
    }
    if (n_hi < 2) continue;
    // The first layer's items per class by the part of their total that does not depend on
    // the layers below (best_within's bound less lb_below and the entry), cheapest first.
    for (size_t qi = 0; qi < nq; ++qi) {
      auto* o = order.data() + qi * C;
      for (size_t c = 0; c < C; ++c) o[c].clear();
      const int64_t m = (*queries[qi].caps)[size_t(k)];
      if (m < 0) continue;
      for (int i : t.head) {
        const DpItem& it = p_.items[i];
        if (it.w <= m)
          o[size_t(it.cls)].push_back({min_reshard_to_[it.cls] + it.cost + it.first, i});
      }
      for (size_t c = 0; c < C; ++c) std::sort(o[c].begin(), o[c].end());
    }
    for (int n = std::max(n_lo, 2); n <= n_hi; ++n) {
      // The lower bounds' lookups first, in one loop, so that their misses overlap.
      for (size_t qi = 0; qi < nq; ++qi) {
        const int64_t m = (*queries[qi].caps)[size_t(k)];
        double lb_below = kInf;
        if (m >= 0)
          for (int b = 0; b < C_; ++b)
            for (int q = 0; q < Q_; ++q) lb_below = std::min(lb_below, fv(t, n - 1, m, b, q));
        lbs[qi] = lb_below;
      }
      for (size_t qi = 0; qi < nq; ++qi) {
        const double lb_below = lbs[qi];
        if (lb_below == kInf) continue;
        const int64_t m = (*queries[qi].caps)[size_t(k)];
        for (int c = 0; c < C_; ++c) {
          double& best = least[qi * C + size_t(c)];
          best = kInf;
          for (const auto& [key, i] : order[qi * C + size_t(c)]) {
            const DpItem& it = p_.items[i];
            // As in best_within; the items after one whose bound exceeds the best by more than
            // rounding have bounds at least the best too.
            const double bound = (lb_below + min_reshard_to_[c]) + it.cost + it.first;
            if (bound >= best) {
              if (bound > best * (1 + 1e-12)) break;
              continue;
            }
            for (int q = 0; q < Q_; ++q) {
              if (!admits(t, it, q)) continue;
              double prev = kInf;
              for (int b = 0; b < C_; ++b)
                prev =
                    std::min(prev, fv(t, n - 1, m - it.w, b, q) + p_.reshard[size_t(b) * C_ + c]);
              if (prev == kInf) continue;
              const double v = prev + it.cost + it.first;
              if (v < best) best = v;
            }
          }
        }
        take(qi, n);
      }
    }
  }
}

double StageDp::below(const Threshold& t, int n, int64_t m, int b, int q) const {
  if (n == 1) return q == 0 ? 0.0 : kInf;
  double v = kInf;
  for (int a = 0; a < C_; ++a)
    v = std::min(v, fv(t, n - 1, m, a, q) + p_.reshard[size_t(a) * C_ + b]);
  return v;
}

std::vector<int> StageDp::reconstruct(int n, const Answer& a, int64_t* footprint) const {
  std::vector<int> seq;
  if (a.threshold < 0) return seq;
  const Threshold& t = thr_[a.threshold];
  const DpItem& head = p_.items[a.head];
  seq.push_back(head.id);
  int64_t m = a.m - head.w;
  int cls = head.cls, q = a.level;
  for (int k = n - 1; k >= 1; --k) {
    // The class below that gives the minimum (first minimum, as in run()'s g).
    double best = kInf;
    int arg = -1;
    for (int b = 0; b < C_; ++b) {
      const double v = fv(t, k, m, b, q);
      if (v == kInf) continue;
      const double x = v + p_.reshard[size_t(b) * C_ + cls];
      if (x < best) best = x, arg = b;
    }
    if (arg < 0) throw std::logic_error("StageDp: broken chain");
    // The first (item, level) of run()'s order that produced f[k][m][arg][q].
    const double target = fv(t, k, m, arg, q);
    int found = -1, prev_q = -1;
    for (int i : k == 1 ? t.tail : t.items) {
      const DpItem& it = p_.items[i];
      if (it.cls != arg || it.w > m) continue;
      const double cost = it.cost + (k == 1 ? it.last : 0.0);
      for (int pq = 0; pq < (k == 1 ? 1 : Q_) && found < 0; ++pq) {
        if (!admits(t, it, pq) || after_[i][pq] != q) continue;
        if (below(t, k, m - it.w, arg, pq) + cost == target) found = i, prev_q = pq;
      }
      if (found >= 0) break;
    }
    if (found < 0) throw std::logic_error("StageDp: broken chain");
    seq.push_back(p_.items[found].id);
    m -= p_.items[found].w;
    cls = arg;
    q = prev_q;
  }
  // seq[0] is row n (the stage's first layer), seq[n-1] row 1 (its last layer).
  if (footprint) *footprint = (a.m - m) * p_.bucket_bytes + a.reserved;
  return seq;
}

double stage_model_cost(const StageDpProblem& p, const std::vector<int64_t>& L,
                        const std::vector<int>& idx, int64_t budget, int64_t extra_tr,
                        int64_t extra_ws, const std::vector<double>* entry) {
  const int C = std::max(1, p.num_classes);
  const int n = int(idx.size());
  auto floor_level = [&](int64_t x) {
    return int(std::upper_bound(L.begin(), L.end(), x) - L.begin()) - 1;
  };
  int64_t w = 0, peak = extra_tr, ws = extra_ws;
  double cost = 0;
  int q = 0;
  for (int l = n - 1; l >= 0; --l) {
    const DpItem& it = p.items[idx[l]];
    w += it.w;
    peak = std::max(peak, std::max<int64_t>(0, it.tr - L[q]));
    ws = std::max(ws, it.ws);
    cost += it.cost;
    if (l > 0)
      cost += p.reshard.empty() ? 0.0 : p.reshard[size_t(p.items[idx[l - 1]].cls) * C + it.cls];
    q = floor_level(L[q] + it.kept);
  }
  cost += p.items[idx[0]].first + p.items[idx[n - 1]].last;
  if (entry) cost += (*entry)[p.items[idx[0]].cls];
  return w * p.bucket_bytes + peak + ws <= budget ? cost : kInf;
}

double brute_force_stage(const StageDpProblem& p, const std::vector<int64_t>& levels, int n,
                         int64_t budget, int64_t extra_tr, int64_t extra_ws,
                         const std::vector<double>* entry, std::vector<int>* best_seq) {
  const int S = int(p.items.size());
  double best = kInf;
  std::vector<int> idx(n, 0);
  if (S == 0 || n < 1) return best;
  while (true) {
    const double cost = stage_model_cost(p, levels, idx, budget, extra_tr, extra_ws, entry);
    if (cost < best) {
      best = cost;
      if (best_seq) {
        best_seq->clear();
        for (int l = 0; l < n; ++l) best_seq->push_back(p.items[idx[l]].id);
      }
    }
    int l = n - 1;
    while (l >= 0 && ++idx[l] == S) idx[l--] = 0;
    if (l < 0) break;
  }
  return best;
}

namespace {
// min sum_s T[s][n_s] over n_s >= n_min, sum = L, with T[s][n_s] <= cap. Fills choice.
double min_sum_capped(const std::vector<std::vector<double>>& T, int L, int n_min, double cap,
                      std::vector<int>* choice) {
  const int S = int(T.size());
  std::vector<double> h(size_t(S + 1) * (L + 1), kInf);
  std::vector<int> arg(size_t(S + 1) * (L + 1), -1);
  h[0] = 0;
  for (int s = 0; s < S; ++s) {
    const auto& row = T[s];
    for (int N = 0; N <= L; ++N) {
      const double base = h[size_t(s) * (L + 1) + N];
      if (base == kInf) continue;
      for (int n = std::max(1, n_min); n < int(row.size()) && N + n <= L; ++n) {
        const double v = row[n];
        if (v == kInf || v > cap) continue;
        double& slot = h[size_t(s + 1) * (L + 1) + N + n];
        if (base + v < slot) {
          slot = base + v;
          arg[size_t(s + 1) * (L + 1) + N + n] = n;
        }
      }
    }
  }
  const double total = h[size_t(S) * (L + 1) + L];
  if (choice && total < kInf) {
    choice->assign(S, 0);
    int N = L;
    for (int s = S; s >= 1; --s) {
      const int n = arg[size_t(s) * (L + 1) + N];
      (*choice)[s - 1] = n;
      N -= n;
    }
  }
  return total;
}
}  // namespace

namespace {
// Whether min_sum_capped(T, L, n_min, cap) is finite: when every stage's layer counts within
// the cap form an interval, their sums do too (a scan instead of the DP).
bool feasible_under(const std::vector<std::vector<double>>& T, int L, int n_min, double cap) {
  int64_t lo = 0, hi = 0;
  for (const auto& row : T) {
    int first = -1, last = -1;
    bool gap = false;
    for (int n = std::max(1, n_min); n < int(row.size()) && n <= L; ++n) {
      if (row[n] == kInf || row[n] > cap) continue;
      if (first < 0)
        first = n;
      else if (n != last + 1)
        gap = true;
      last = n;
    }
    if (first < 0) return false;
    if (gap) return min_sum_capped(T, L, n_min, cap, nullptr) < kInf;
    lo += first, hi += last;
  }
  return lo <= L && L <= hi;
}
}  // namespace

double min_sum_partition(const std::vector<std::vector<double>>& T, int L, int n_min) {
  return min_sum_capped(T, L, n_min, kInf, nullptr);
}

std::vector<int> solve_partition(const std::vector<std::vector<double>>& T, int L, int n_min,
                                 double bubble_weight, double* objective) {
  std::vector<double> vals;
  for (const auto& row : T)
    for (int n = std::max(1, n_min); n < int(row.size()); ++n)
      if (row[n] < kInf) vals.push_back(row[n]);
  std::sort(vals.begin(), vals.end());
  vals.erase(std::unique(vals.begin(), vals.end()), vals.end());
  std::vector<int> best;
  if (vals.empty()) return best;
  // Smallest feasible maximum stage cost.
  int lo = 0, hi = int(vals.size()) - 1;
  if (!feasible_under(T, L, n_min, vals[hi])) return best;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (feasible_under(T, L, n_min, vals[mid]))
      hi = mid;
    else
      lo = mid + 1;
  }
  double best_obj = kInf;
  // Exact for bubble_weight in [0, 1]: under each cap the least sum is best among partitions of
  // that maximum, and one of a smaller maximum and no larger sum beats them all.
  for (int k = lo; k < int(vals.size()); ++k) {
    std::vector<int> choice;
    const double sum = min_sum_capped(T, L, n_min, vals[k], &choice);
    if (sum == kInf) continue;
    double mx = 0;
    for (size_t s = 0; s < choice.size(); ++s) mx = std::max(mx, T[s][choice[s]]);
    const double obj = mx + bubble_weight * (sum - mx);
    if (obj < best_obj) best_obj = obj, best = choice;
    // A partition that needs the next larger cap has that maximum, so it costs at least that.
    if (k + 1 < int(vals.size()) && vals[k + 1] >= best_obj) break;
  }
  if (objective) *objective = best_obj;
  return best;
}

}  // namespace stratagem::search_detail
