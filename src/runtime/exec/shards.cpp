#include "src/runtime/exec/shards.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "stratagem/layout.hpp"

namespace stratagem::exec {

namespace {
// Where flat [a, b) (inside one run) starts among the segment's elements.
int64_t concatenated(const Segment& s, int64_t a, int64_t b) {
  for (size_t r = 0; r < s.runs.size(); ++r)
    if (a >= s.runs[r].first && b <= s.runs[r].second) return s.starts[r] + (a - s.runs[r].first);
  throw std::logic_error("executor: flat range [" + std::to_string(a) + ", " + std::to_string(b) +
                         ") is not inside one run of layer " + std::to_string(s.layer));
}
}  // namespace

std::vector<int64_t> Segment::counts(int64_t a, int64_t b) const {
  const int64_t ca = concatenated(*this, a, b), cb = ca + (b - a);
  std::vector<int64_t> out(dp);
  for (int d = 0; d < dp; ++d)
    out[d] = std::max<int64_t>(0, std::min(cb, bounds[d + 1]) - std::max(ca, bounds[d]));
  return out;
}

int64_t Segment::piece_begin(int64_t a, int64_t b, int d) const {
  const int64_t ca = concatenated(*this, a, b);
  return a + std::max<int64_t>(0, bounds[d] - ca);
}

std::vector<FlatRange> Segment::piece(int d) const {
  std::vector<FlatRange> out;
  for (size_t r = 0; r < runs.size(); ++r) {
    const int64_t len = runs[r].second - runs[r].first;
    const int64_t lo = std::max(starts[r], bounds[d]),
                  hi = std::min(starts[r] + len, bounds[d + 1]);
    if (lo < hi)
      out.push_back({runs[r].first + (lo - starts[r]), runs[r].first + (hi - starts[r])});
  }
  return out;
}

FlatMap::FlatMap(std::vector<FlatRun> runs, bool merge) {
  std::sort(runs.begin(), runs.end(),
            [](const FlatRun& x, const FlatRun& y) { return x.flat_begin < y.flat_begin; });
  for (FlatRun r : runs) {
    if (r.flat_end <= r.flat_begin) continue;
    if (!runs_.empty() && runs_.back().flat_end > r.flat_begin)
      throw std::logic_error("executor: overlapping flat runs in a state tensor");
    // Neighbours alike merge: fewer, longer optimizer and norm kernel calls.
    if (merge && !runs_.empty() && runs_.back().flat_end == r.flat_begin &&
        runs_.back().dp_replicated == r.dp_replicated && runs_.back().dp_first == r.dp_first &&
        runs_.back().on_host == r.on_host) {
      runs_.back().flat_end = r.flat_end;
    } else {
      r.local = size_;
      runs_.push_back(r);
    }
    size_ += r.flat_end - r.flat_begin;
  }
}

bool FlatMap::holds(int64_t flat) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), flat,
                             [](int64_t f, const FlatRun& r) { return f < r.flat_begin; });
  return it != runs_.begin() && flat < std::prev(it)->flat_end;
}

int64_t FlatMap::local(int64_t flat) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), flat,
                             [](int64_t f, const FlatRun& r) { return f < r.flat_begin; });
  if (it == runs_.begin() || flat >= std::prev(it)->flat_end)
    throw std::logic_error("executor: flat element " + std::to_string(flat) +
                           " is not held in this state tensor");
  --it;
  return it->local + (flat - it->flat_begin);
}

const Segment& Sharding::of(int layer) const {
  auto it = segments.find(layer < 0 && !is_expert_segment(layer) ? -1 : layer);
  if (it == segments.end())
    throw std::logic_error("executor: no parameters of layer " + std::to_string(layer) +
                           " on this rank");
  return it->second;
}

const Segment& Sharding::of_param(std::string_view name, int layer) const {
  if (layer >= 0 && is_expert_param(name)) {
    auto it = segments.find(expert_segment(layer));
    if (it != segments.end()) return it->second;
  }
  return of(layer);
}

Sharding make_sharding(const ParamTable& table, const std::vector<SegmentPlacement>& placements,
                       int local) {
  Sharding sh;
  std::vector<FlatRun> w, hw, g, o, ho;
  for (const SegmentPlacement& st : placements) {
    const int l = st.layer;
    // (The embedding and head's segment is held on the first and last stage only.)
    using Subset = ParamTable::Subset;
    const std::vector<FlatRange> runs =
        is_expert_segment(l)
            ? table.ranges_of_layer(layer_of_segment(l), Subset::experts)
            : table.ranges_of_layer(l, st.experts_apart ? Subset::without_experts : Subset::all);
    if (l < 0 && runs.empty()) continue;
    Segment s;
    s.layer = l;
    s.zero = st.zero;
    s.dp = st.dp;
    s.dp_index = RankGeometry::dp_cp_index(local, st.tp);
    s.params_on_host = st.params_on_host;
    s.optimizer_on_host = st.optimizer_on_host;
    s.runs = runs;
    int64_t n = 0;
    for (auto [a, b] : s.runs) s.starts.push_back(n), n += b - a;
    for (int d = 0; d <= s.dp; ++d) s.bounds.push_back(n * d / s.dp);
    const std::vector<FlatRange> mine = s.piece(s.dp_index);
    auto add = [&](std::vector<FlatRun>& to, bool sharded, bool on_host = false) {
      for (auto [a, b] : sharded ? mine : s.runs)
        to.push_back(FlatRun{a, b, 0, !sharded, s.dp_index == 0, on_host});
    };
    add(s.params_on_host ? hw : w, s.sharded_weights(), s.params_on_host);
    add(g, s.sharded_grads());
    add(s.optimizer_on_host ? ho : o, s.sharded_state(), s.optimizer_on_host);
    sh.segments[l] = std::move(s);
  }
  sh.weights = FlatMap(std::move(w));
  sh.host_weights = FlatMap(std::move(hw));
  sh.all_weights = sh.weights.runs();
  for (const FlatRun& r : sh.host_weights.runs()) sh.all_weights.push_back(r);
  sh.grads = FlatMap(std::move(g));
  sh.state = FlatMap(std::move(o), false);
  sh.host_state = FlatMap(std::move(ho), false);
  sh.all_state = sh.state.runs();
  for (const FlatRun& r : sh.host_state.runs()) sh.all_state.push_back(r);
  // The gradient norm counts each logical element once: its state's owner (one replica where
  // the state is replicated), one tp rank for tp-replicated tensors, and not the tied head copy.
  for (const ParamInfo& e : table.entries()) {
    if (e.tied_copy || (e.replicated && e.tp_rank != 0)) continue;
    for (const FlatRun& r : sh.all_state) {
      if (r.dp_replicated && !r.dp_first) continue;
      const int64_t a = std::max(r.flat_begin, e.offset);
      const int64_t b = std::min(r.flat_end, e.offset + e.numel());
      if (a >= b) continue;
      if (!sh.norm_runs.empty() && sh.norm_runs.back().second == a)
        sh.norm_runs.back().second = b;
      else
        sh.norm_runs.push_back({a, b});
    }
  }
  return sh;
}

}  // namespace stratagem::exec
