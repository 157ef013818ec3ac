// The stage DP's answers: the best stage of n layers under a budget, rows of those for many
// caps at once, and the layer sequence of an answer.
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "src/search/stage_dp.hpp"

namespace stratagem::search_detail {

std::vector<int64_t> StageDp::caps(int64_t budget, int64_t extra_tr, int64_t extra_ws) const {
  std::vector<int64_t> out(thr_.size(), -1);
  for (size_t k = 0; k < thr_.size(); ++k) {
    const Threshold& t = thr_[k];
    const int64_t room = budget - (std::max(t.tr, extra_tr) + std::max(t.ws, extra_ws));
    if (room >= 0) out[k] = std::min(budget_buckets_, room / p_.bucket_bytes);
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
      for (int b = 0; b < class_count_; ++b)
        for (int q = 0; q < level_count_; ++q) lb_below = std::min(lb_below, fv(t, n - 1, m, b, q));
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
      for (int q = 0; q < (n == 1 ? 1 : level_count_); ++q) {
        if (!admits(t, it, q)) continue;
        double prev = 0;
        if (n > 1) {
          prev = kInf;
          for (int b = 0; b < class_count_; ++b)
            prev = std::min(
                prev, fv(t, n - 1, m - it.w, b, q) + p_.reshard[size_t(b) * class_count_ + it.cls]);
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

// Each row of query qu at layer count n takes the least total of each first-layer class
// (lq, entry left out) plus the row's entry cost of that class (ents, C per row), where lower.
void StageDp::take_least(const CostQuery& qu, const double* lq, const double* ents, int n) const {
  const size_t C = size_t(class_count_);
  for (size_t r = 0; r < qu.rows.size(); ++r) {
    double& best = (*qu.rows[r].out)[size_t(n)];
    const double* e = ents + r * C;
    for (size_t c = 0; c < C; ++c) {
      if (lq[c] == kInf) continue;
      const double v = lq[c] + e[c];
      if (v < best) best = v;
    }
  }
}

// n = 1 under threshold t and cap m: the least total per class (lq) of a one-layer stage.
void StageDp::least_single(const Threshold& t, int64_t m, double* lq) const {
  std::fill(lq, lq + class_count_, kInf);
  for (int i : t.single) {
    const DpItem& it = p_.items[i];
    if (it.w > m) continue;
    const double v = 0.0 + it.cost + it.first + it.last;
    if (v < lq[size_t(it.cls)]) lq[size_t(it.cls)] = v;
  }
}

// The first layer's items per class by the part of their total that does not depend on the
// layers below (best_within's bound less lb_below and the entry), cheapest first.
void StageDp::head_order(const Threshold& t, int64_t m,
                         std::vector<std::pair<double, int>>* o) const {
  for (int c = 0; c < class_count_; ++c) o[c].clear();
  if (m < 0) return;
  for (int i : t.head) {
    const DpItem& it = p_.items[i];
    if (it.w <= m) o[size_t(it.cls)].push_back({min_reshard_to_[it.cls] + it.cost + it.first, i});
  }
  for (int c = 0; c < class_count_; ++c) std::sort(o[c].begin(), o[c].end());
}

// n >= 2 under threshold t and cap m: the least total per first-layer class (lq), the items
// of each class visited in `o`'s order (head_order) while their bound can still win.
void StageDp::least_above(const Threshold& t, int n, int64_t m, double lb_below,
                          const std::vector<std::pair<double, int>>* o, double* lq) const {
  for (int c = 0; c < class_count_; ++c) {
    double& best = lq[size_t(c)];
    best = kInf;
    for (const auto& [key, i] : o[size_t(c)]) {
      const DpItem& it = p_.items[i];
      // As in best_within; the items after one whose bound exceeds the best by more than
      // rounding have bounds at least the best too.
      const double bound = (lb_below + min_reshard_to_[c]) + it.cost + it.first;
      if (bound >= best) {
        if (bound > best * (1 + 1e-12)) break;
        continue;
      }
      for (int q = 0; q < level_count_; ++q) {
        if (!admits(t, it, q)) continue;
        double prev = kInf;
        for (int b = 0; b < class_count_; ++b)
          prev = std::min(prev,
                          fv(t, n - 1, m - it.w, b, q) + p_.reshard[size_t(b) * class_count_ + c]);
        if (prev == kInf) continue;
        const double v = prev + it.cost + it.first;
        if (v < best) best = v;
      }
    }
  }
}

void StageDp::best_costs(const std::vector<CostQuery>& queries, int n_lo, int n_hi) const {
  const size_t nq = queries.size(), C = size_t(class_count_);
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
      for (int c = 0; c < class_count_; ++c)
        ents.push_back(r.entry ? quantize((*r.entry)[size_t(c)]) : 0.0);
    }
  }
  // least[qi * C + cls]: the least total (entry left out) of a sequence whose first layer is of
  // class cls.
  std::vector<double> least(nq * C);
  std::vector<std::vector<std::pair<double, int>>> order(nq * C);
  std::vector<double> lbs(nq);
  for (int k = 0; k < int(thr_.size()); ++k) {
    const Threshold& t = thr_[k];
    auto cap = [&](size_t qi) { return (*queries[qi].caps)[size_t(k)]; };
    if (n_lo == 1) {
      for (size_t qi = 0; qi < nq; ++qi) {
        if (cap(qi) < 0) continue;
        least_single(t, cap(qi), least.data() + qi * C);
        take_least(queries[qi], least.data() + qi * C, ents.data() + ent_at[qi], 1);
      }
    }
    if (n_hi < 2) continue;
    for (size_t qi = 0; qi < nq; ++qi) head_order(t, cap(qi), order.data() + qi * C);
    for (int n = std::max(n_lo, 2); n <= n_hi; ++n) {
      // The lower bounds' lookups first, in one loop, so that their misses overlap.
      for (size_t qi = 0; qi < nq; ++qi) {
        const int64_t m = cap(qi);
        double lb_below = kInf;
        if (m >= 0)
          for (int b = 0; b < class_count_; ++b)
            for (int q = 0; q < level_count_; ++q)
              lb_below = std::min(lb_below, fv(t, n - 1, m, b, q));
        lbs[qi] = lb_below;
      }
      for (size_t qi = 0; qi < nq; ++qi) {
        if (lbs[qi] == kInf) continue;
        least_above(t, n, cap(qi), lbs[qi], order.data() + qi * C, least.data() + qi * C);
        take_least(queries[qi], least.data() + qi * C, ents.data() + ent_at[qi], n);
      }
    }
  }
}

double StageDp::below(const Threshold& t, int n, int64_t m, int b, int q) const {
  if (n == 1) return q == 0 ? 0.0 : kInf;
  double v = kInf;
  for (int a = 0; a < class_count_; ++a)
    v = std::min(v, fv(t, n - 1, m, a, q) + p_.reshard[size_t(a) * class_count_ + b]);
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
    for (int b = 0; b < class_count_; ++b) {
      const double v = fv(t, k, m, b, q);
      if (v == kInf) continue;
      const double x = v + p_.reshard[size_t(b) * class_count_ + cls];
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
      for (int pq = 0; pq < (k == 1 ? 1 : level_count_) && found < 0; ++pq) {
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

}  // namespace stratagem::search_detail
