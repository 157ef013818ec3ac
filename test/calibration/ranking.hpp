// Ranking figures of a calibration file (issue 29): for a planner the order of the plans
// matters more than their absolute times. Rows are grouped by what a planner holds fixed, the
// model's weights (layers, hidden, heads, FFN, vocabulary), the cluster, the GPU count and the
// tokens per iteration (global batch x sequence length); within a group, rows differ in plan
// (and, in small-jobs.json, in the sequence length the same tokens are cut into). Per group of
// two rows or more: the Spearman rank correlation of forecast and measured time, and the regret
// of running the forecast-fastest row, how much slower it measured than the fastest measured.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "test/calibration/megatron_rows.hpp"

namespace stratagem::calibration {

struct RankedRow {
  std::string group;
  std::string id;
  double measured_s = 0, estimate_s = 0, simulate_s = 0;
};

inline std::string group_key(const Row& r) {
  const ModelSpec& m = r.model;
  char buf[256];
  std::snprintf(buf, sizeof buf, "l%d h%lld a%d f%lld V%lld | %s x%d | %lld tok", int(m.layers),
                (long long)m.hidden, int(m.heads), (long long)m.ffn_hidden, (long long)m.vocab,
                r.cluster.name.c_str(), r.plan.world_size(),
                (long long)r.plan.global_batch * (long long)m.seq_len);
  return buf;
}

// Ranks 1..n with ties sharing their mean rank.
inline std::vector<double> ranks_of(const std::vector<double>& v) {
  std::vector<size_t> idx(v.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j) + 1;
    i = j + 1;
  }
  return r;
}

// Pearson correlation of the ranks; 0 when either side has no spread.
inline double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  const std::vector<double> rx = ranks_of(x), ry = ranks_of(y);
  const double n = double(rx.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < rx.size(); ++i) mx += rx[i] / n, my += ry[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < rx.size(); ++i) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0;
}

// measured(forecast-fastest) / min(measured) - 1.
inline double regret(const std::vector<double>& forecast, const std::vector<double>& measured) {
  const size_t pick = size_t(std::min_element(forecast.begin(), forecast.end()) - forecast.begin());
  return measured[pick] / *std::min_element(measured.begin(), measured.end()) - 1;
}

struct RankingSummary {
  int groups = 0;
  double spearman_est = 0, spearman_sim = 0;  // means over the groups
  double regret_est = 0, regret_sim = 0;      // means over the groups
  double worst_regret_est = 0, worst_regret_sim = 0;
};

inline RankingSummary print_ranking(const std::vector<RankedRow>& rows, bool print = true) {
  std::map<std::string, std::vector<const RankedRow*>> groups;
  for (const RankedRow& r : rows) groups[r.group].push_back(&r);
  RankingSummary s;
  for (const auto& [key, g] : groups) {
    if (g.size() < 2) continue;
    std::vector<double> meas, est, sim;
    std::string ids;
    for (const RankedRow* r : g) {
      meas.push_back(r->measured_s), est.push_back(r->estimate_s), sim.push_back(r->simulate_s);
      ids += (ids.empty() ? "" : ",") + r->id;
    }
    const double se = spearman(est, meas), ss = spearman(sim, meas);
    const double re = regret(est, meas), rs = regret(sim, meas);
    if (print)
      std::printf(
          "  rank %-52s %-28s spearman est %+5.2f sim %+5.2f  regret est %5.1f%% sim %5.1f%%\n",
          key.c_str(), ids.c_str(), se, ss, 100 * re, 100 * rs);
    ++s.groups;
    s.spearman_est += se, s.spearman_sim += ss, s.regret_est += re, s.regret_sim += rs;
    s.worst_regret_est = std::max(s.worst_regret_est, re);
    s.worst_regret_sim = std::max(s.worst_regret_sim, rs);
  }
  if (s.groups > 0) {
    s.spearman_est /= s.groups, s.spearman_sim /= s.groups;
    s.regret_est /= s.groups, s.regret_sim /= s.groups;
  }
  if (print) {
    if (s.groups == 0)
      std::printf("  ranking: no group of rows shares model, cluster, GPUs and batch\n");
    else
      std::printf(
          "  ranking (%d groups): mean spearman est %+5.2f sim %+5.2f; mean regret est %4.1f%% sim "
          "%4.1f%%, worst est %4.1f%% sim %4.1f%%\n",
          s.groups, s.spearman_est, s.spearman_sim, 100 * s.regret_est, 100 * s.regret_sim,
          100 * s.worst_regret_est, 100 * s.worst_regret_sim);
  }
  return s;
}

}  // namespace stratagem::calibration
