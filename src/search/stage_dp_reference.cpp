// The stage DP's model for one given sequence, and the brute force over all sequences the
// tests compare the DP with.
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "src/search/stage_dp.hpp"

namespace stratagem::search_detail {

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

}  // namespace stratagem::search_detail
