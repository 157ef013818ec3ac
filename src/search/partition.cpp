// The stage partition solver (stage_dp.hpp: solve_partition, min_sum_partition).
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "src/search/stage_dp.hpp"

namespace stratagem::search_detail {

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
