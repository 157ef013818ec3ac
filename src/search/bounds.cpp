// The lower bound of a configuration's best iteration time, by which the search visits
// configurations best first and skips those that cannot enter the top K (see searcher.hpp).
#include <algorithm>
#include <array>

#include "src/search/searcher.hpp"

namespace stratagem::search_detail {

namespace {
// Lower convex envelope of (memory, time) points, made non-increasing: the least average time
// per layer reachable with average memory x (LP relaxation of the stage's layer choice).
class Envelope {
 public:
  // `sorted`: the points are already in increasing order.
  explicit Envelope(std::vector<std::pair<double, double>> pts, bool sorted = false) {
    if (!sorted) std::sort(pts.begin(), pts.end());
    for (const auto& p : pts) {
      // No cheaper than the last vertex: not on the front.
      if (!vertices_.empty() && p.second >= vertices_.back().second) continue;
      while (vertices_.size() >= 2) {
        const auto& a = vertices_[vertices_.size() - 2];
        const auto& b = vertices_.back();
        // b above segment a-p: drop it.
        if ((b.second - a.second) * (p.first - a.first) >=
            (p.second - a.second) * (b.first - a.first))
          vertices_.pop_back();
        else
          break;
      }
      vertices_.push_back(p);
    }
  }
  const std::vector<std::pair<double, double>>& points() const { return vertices_; }
  double at(double x) const {
    if (vertices_.empty() || x < vertices_.front().first) return kInf;
    if (x >= vertices_.back().first) return vertices_.back().second;
    auto it =
        std::upper_bound(vertices_.begin(), vertices_.end(), x,
                         [](double v, const std::pair<double, double>& p) { return v < p.first; });
    const auto& b = *it;
    const auto& a = *(it - 1);
    return a.second + (b.second - a.second) * (x - a.first) / (b.first - a.first);
  }

 private:
  std::vector<std::pair<double, double>> vertices_;
};
}  // namespace

// Micro-batches whose saved activations a stage holds at its worst moment (per layer): the
// schedule's chunk passes in flight, each a 1/v of the stage's layers on average.
double in_flight(const Config& cf, int s) {
  const ScheduleShape shape = cf.shape();
  return double(shape.passes_in_flight(s)) / shape.vpp;
}

// The estimator's interleaved schedule (schedule_peak in src/cost/plan_costs.cpp) holds the kept
// activations of the first passes_in_flight forwards at its peak (the next forward's own peak
// covers its kept activations). Chunk c holds A_c, the kept activations of its layers, once per
// forward on it, so that peak is at least (the fewest forwards on any chunk) x sum_c A_c: every
// layer's kept activations that many times. The DP's in_flight is the average count instead,
// which a chunk of the stage may not reach.
double interleaved_least_in_flight(const Config& cf, int s) {
  const ScheduleShape shape = cf.shape();
  const int in_flight = shape.passes_in_flight(s);
  int least = in_flight;
  for (int c = 0; c < shape.vpp; ++c)
    least = std::min(least, shape.forwards_on_chunk(in_flight, c));
  return least;
}

int n_max_of(int L, int pp, int v) {
  if (pp == 1) return L;
  const int even = (L + pp - 1) / pp;
  return std::max(v, std::min(L - (pp - 1) * v, 2 * even + 2));
}

namespace {
// Weights of (busy, dp stream, host-to-device, device-to-host) in the lower bound's relaxations.
// (A grid of 25 in steps of 1/8 prunes no more configurations of the GPT-3 175B benchmark.)
constexpr double kStreamWeights[][4] = {{1, 0, 0, 0},     {0.5, 0.5, 0, 0}, {0.5, 0, 0.5, 0},
                                        {0.5, 0, 0, 0.5}, {0, 1, 0, 0},     {0, 0, 1, 0},
                                        {0, 0, 0, 1}};
}  // namespace

// Memory. The estimator charges a stage its layers' states, at least k x their kept activations
// (k: in_flight; interleaved: interleaved_least_in_flight), the largest workspace of its layers,
// and its schedule's peak, which is at least the moment of the last in-flight forward: reaching
// the last layer of its chunk, that layer holds its forward transient (forward activations +
// buffers - kept) above all those kept activations. So one chunk-last layer of the stage also
// holds its transient and its workspace.
//
// Time. The estimator's micro-batch time of a stage is the largest of its busy time and its side
// streams' times (dp, host-to-device, device-to-host), each a sum over its layers, so it is at
// least any convex combination of them: the bound is the best of a few combinations. (Busy alone
// misses what offloading costs on the copy streams.) Added in full: what nothing hides at the
// ends of each chunk pass, the first layer's weight fetch, the last layer's fetch and activation
// copy-back (a chunk of one layer pays all three).
//
// Position types: plain, a chunk's first, a chunk's last, a chunk of one layer, and (once per
// stage) a chunk's last or a one-layer chunk that holds the peak above.
StageRelaxation relax_stage(const GeoData& gd, double k) {
  constexpr int kTypes = StageRelaxation::kTypes;
  StageRelaxation out;
  const size_t S = gd.items.size();
  // Strategies by memory, without and with the peak (equal memory: by time, per weighting).
  std::vector<double> base(S), peak(S);
  for (size_t i = 0; i < S; ++i) {
    const auto& it = gd.items[i];
    base[i] = double(it.states) + k * double(it.kept);
    peak[i] = base[i] + double(it.fwd_transient + it.workspace);
  }
  auto order_of = [&](const std::vector<double>& mem) {
    std::vector<int> o(S);
    for (size_t i = 0; i < S; ++i) o[i] = int(i);
    std::sort(o.begin(), o.end(), [&](int a, int b) { return mem[size_t(a)] < mem[size_t(b)]; });
    return o;
  };
  const std::vector<int> by_base = order_of(base), by_peak = order_of(peak);
  std::vector<std::pair<double, double>> pts;
  pts.reserve(S);
  for (const auto& w : kStreamWeights) {
    StageRelaxation::Weighting x;
    for (int t = 0; t < kTypes; ++t) {
      const bool last = t == 2 || t == 4, single = t == 3 || t == 5;
      const std::vector<double>& mem = t >= 4 ? peak : base;
      pts.clear();
      for (int i : t >= 4 ? by_peak : by_base) {
        const auto& it = gd.items[size_t(i)];
        const double ends = t == 1   ? it.fetch_s
                            : last   ? it.fetch_s + it.act_h2d_s
                            : single ? 2 * it.fetch_s + it.act_h2d_s
                                     : 0.0;
        pts.push_back({mem[size_t(i)], w[0] * it.busy_s + w[1] * it.dp_stream_s +
                                           w[2] * it.h2d_stream_s + w[3] * it.d2h_stream_s + ends});
      }
      // Sorted by memory already; equal memory by time, as std::sort orders the pairs.
      for (size_t a = 0, b; a < pts.size(); a = b) {
        for (b = a + 1; b < pts.size() && pts[b].first == pts[a].first;) ++b;
        if (b - a > 1) std::sort(pts.begin() + long(a), pts.begin() + long(b));
      }
      const Envelope env(pts, /*sorted=*/true);
      const auto& h = env.points();
      x.least[size_t(t)] = h.front();
      for (size_t j = 1; j < h.size(); ++j) {
        const double added_bytes = h[j].first - h[j - 1].first;
        const double time_change_s = h[j].second - h[j - 1].second;
        x.segments.push_back({time_change_s / added_bytes, added_bytes, time_change_s, t});
      }
    }
    std::stable_sort(x.segments.begin(), x.segments.end(),
                     [](const StageRelaxation::Segment& a, const StageRelaxation::Segment& b) {
                       return a.s_per_byte < b.s_per_byte;
                     });
    out.weightings.push_back(std::move(x));
  }
  return out;
}

namespace {
// The least an embedding-and-head placement of any strategy takes, by where it sits.
struct EndBounds {
  double first_states = kInf, last_states = kInf, only_states = kInf;  // bytes
  double first_busy_s = kInf, last_busy_s = kInf, only_busy_s = kInf;
};
EndBounds end_bounds(const std::vector<EmbeddingCost>& emb) {
  EndBounds b;
  for (const auto& e : emb) {
    b.first_states = std::min(b.first_states, double(e.first_states));
    b.last_states = std::min(b.last_states, double(e.last_states));
    b.only_states = std::min(b.only_states, double(e.only_states));
    b.first_busy_s = std::min(b.first_busy_s, e.first_busy_s);
    b.last_busy_s = std::min(b.last_busy_s, e.last_busy_s);
    b.only_busy_s = std::min(b.only_busy_s, e.first_busy_s + e.last_busy_s);
  }
  return b;
}

using PositionCounts = std::array<double, StageRelaxation::kTypes>;
// Position counts of a stage of n layers (relax_stage's types), from its chunks (chunk_sizes),
// for n = v .. n_max.
std::vector<PositionCounts> position_counts(int v, int n_max) {
  std::vector<PositionCounts> counts(size_t(n_max) + 1);
  for (int n = v; n <= n_max; ++n) {
    int singles = 0;
    for (int size : chunk_sizes(n, v)) singles += size == 1;
    const int longer = v - singles;
    counts[size_t(n)] = {
        double(n - singles - 2 * longer),    double(longer),
        double(longer > 0 ? longer - 1 : 0), double(longer > 0 ? singles : singles - 1),
        double(longer > 0 ? 1 : 0),          double(longer > 0 ? 0 : 1)};
  }
  return counts;
}

// The LP relaxation of a stage's choice under its room, for each layer count n: every position
// starts at its type's least memory; memory then goes where it saves the most time per byte
// (each envelope is convex, so its segments come in its own order). The stage's bound over its
// stream weightings is the largest; `times[n]` keeps it.
void relaxed_stage_times(const StageRelaxation& rel, const std::vector<PositionCounts>& counts,
                         double room, double extra_s, int v, std::vector<double>& times) {
  for (size_t wi = 0; wi < rel.weightings.size(); ++wi) {
    const auto& x = rel.weightings[wi];
    const double busy_weight = kStreamWeights[wi][0];
    for (int n = v; n < int(counts.size()); ++n) {
      const auto& cnt = counts[size_t(n)];
      double time = busy_weight * extra_s, left = room;
      for (int t = 0; t < StageRelaxation::kTypes; ++t) {
        time += cnt[size_t(t)] * x.least[size_t(t)].second;
        left -= cnt[size_t(t)] * x.least[size_t(t)].first;
      }
      if (left < 0) continue;  // nothing fits
      for (const auto& g : x.segments) {
        const double c = cnt[size_t(g.type)];
        if (c == 0) continue;
        const double need = c * g.added_bytes;
        if (need <= left) {
          time += c * g.time_change_s;
          left -= need;
        } else {
          time += c * g.time_change_s * (left / need);
          break;
        }
      }
      times[size_t(n)] = times[size_t(n)] == kInf ? time : std::max(times[size_t(n)], time);
    }
  }
}
}  // namespace

double Searcher::lower_bound(const Config& cf) {
  PairData& pd = pair_mutable(cf.pp, cf.Bm, cf.cpg);
  const int pp = cf.pp, L = m_.layers, v = cf.v;
  if (pd.emb.empty()) return kInf;
  const int n_max = n_max_of(L, pp, v);
  const EndBounds ends = end_bounds(pd.emb);
  const std::vector<PositionCounts> counts = position_counts(v, n_max);
  std::vector<std::vector<double>> T(pp, std::vector<double>(n_max + 1, kInf));
  for (int s = 0; s < pp; ++s) {
    const double k =
        cf.sched == Schedule::interleaved ? interleaved_least_in_flight(cf, s) : in_flight(cf, s);
    const int gi = pd.stage_geo[s];
    if (pd.geos[gi].items.empty()) continue;
    auto slot = pd.relaxations.find({gi, k});
    if (slot == pd.relaxations.end())
      slot = pd.relaxations.emplace(std::make_pair(gi, k), relax_stage(pd.geos[gi], k)).first;
    // (A few bytes over net_budget_: the estimator rounds its fragmentation down.)
    double room = double(net_budget_) + 64, extra_s = 0;
    if (pp == 1)
      room -= ends.only_states, extra_s = ends.only_busy_s;
    else if (s == 0)
      room -= ends.first_states, extra_s = ends.first_busy_s;
    else if (s == pp - 1)
      room -= ends.last_states, extra_s = ends.last_busy_s;
    relaxed_stage_times(slot->second, counts, room, extra_s, v, T[s]);
  }
  // The estimator's pipeline time is M x the largest cycle (a stage's micro-batch time u_s plus
  // half its pipeline transfers P_s), plus the others' u_s / v (fill and drain), plus every
  // transfer / v, plus the tail (>= 0). With u_crit <= the largest cycle it is at least
  //     (M - 1/v) max_s (u_s + P_s / 2) + (1/v) sum_s (u_s + P_s / 2) + (1/v) sum_s P_s / 2,
  // each P_s at least its transfer count x the cheapest transfer of any layer's boundary. The
  // partition solver minimizes the first two terms exactly (bubble weight 1 / (M v), scaled by
  // M).
  double half_p2p = 0;
  if (pp > 1) {
    const cost_detail::Geometry geo{std::max(1, c_.node.gpus_per_node), pd.D};
    for (int s = 0; s < pp; ++s) {
      const double sends = v - (s == pp - 1 ? 1 : 0), receives = v - (s == 0 ? 1 : 0);
      const double p = sends * pd.p2p_min_s[geo.same_node(s, (s + 1) % pp) ? 1 : 0] +
                       receives * pd.p2p_min_s[geo.same_node(s, (s + pp - 1) % pp) ? 1 : 0];
      if (!(p < kInf)) continue;
      half_p2p += 0.5 * p;
      for (double& x : T[s])
        if (x < kInf) x += 0.5 * p;
    }
  }
  const double M = cf.M;
  double objective = kInf;
  if (solve_partition(T, L, v, 1.0 / (M * v), &objective).empty()) return kInf;
  // Slack for rounding: the estimator adds its terms in another order.
  return (M * objective + half_p2p / v) * (1 - 1e-9);
}

}  // namespace stratagem::search_detail
