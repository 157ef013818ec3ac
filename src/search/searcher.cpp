// The search driver: the configuration space, its lower bounds, the run and the exhaustive
// enumeration (see searcher.hpp).
#include "src/search/searcher.hpp"

#if __has_include(<malloc.h>)
#include <malloc.h>  // glibc: malloc_trim
#endif

#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"

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
      if (!h_.empty() && p.second >= h_.back().second) continue;  // no cheaper: not on the front
      while (h_.size() >= 2) {
        const auto& a = h_[h_.size() - 2];
        const auto& b = h_.back();
        // b above segment a-p: drop it.
        if ((b.second - a.second) * (p.first - a.first) >=
            (p.second - a.second) * (b.first - a.first))
          h_.pop_back();
        else
          break;
      }
      h_.push_back(p);
    }
  }
  const std::vector<std::pair<double, double>>& points() const { return h_; }
  double at(double x) const {
    if (h_.empty() || x < h_.front().first) return kInf;
    if (x >= h_.back().first) return h_.back().second;
    auto it =
        std::upper_bound(h_.begin(), h_.end(), x,
                         [](double v, const std::pair<double, double>& p) { return v < p.first; });
    const auto& b = *it;
    const auto& a = *(it - 1);
    return a.second + (b.second - a.second) * (x - a.first) / (b.first - a.first);
  }

 private:
  std::vector<std::pair<double, double>> h_;
};

// The shared bound of run(): the processes exchange their top-K (time, plan-key hash) lists in
// a chain of non-blocking all-gathers (every process posts the same sequence; the chain ends
// with the first exchange in which nobody is searching any more). The K-th best distinct plan
// of the union bounds every process's pruning. A hash collision can only merge two plans, which
// loosens the bound: the answer never depends on the process count.
class BoundExchange {
 public:
  struct Entry {
    double time;
    uint64_t hash;
  };
  BoundExchange(MPI_Comm comm, int k) : comm_(comm), k_(k) {
    if (comm_ != MPI_COMM_NULL) {
      MPI_Comm_size(comm_, &procs_);
      send_.resize(size_t(k_) + 1);
      recv_.resize(send_.size() * size_t(procs_));
    }
  }
  double shared() const { return shared_; }
  // Between configurations: take a finished exchange's result and post the next one.
  void poll(const TopK& mine) {
    if (comm_ == MPI_COMM_NULL) return;
    if (req_ == MPI_REQUEST_NULL) return post(mine, true);
    int done = 0;
    MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    if (done) {
      absorb();
      post(mine, true);
    }
  }
  // After the last configuration: keep exchanging until nobody searches.
  void finish(const TopK& mine) {
    if (comm_ == MPI_COMM_NULL) return;
    if (req_ == MPI_REQUEST_NULL) post(mine, true);
    while (true) {
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
      if (!absorb()) break;
      post(mine, false);
    }
  }

 private:
  void post(const TopK& mine, bool active) {
    std::fill(send_.begin(), send_.end(), Entry{kInf, 0});
    for (size_t i = 0; i < mine.items().size() && i < size_t(k_); ++i)
      send_[i] = {mine.items()[i].est_iteration_time_s,
                  std::hash<std::string>{}(mine.items()[i].key)};
    send_[size_t(k_)] = {active ? 1.0 : 0.0, 0};  // the last entry: still searching?
    const int bytes = int(send_.size() * sizeof(Entry));
    MPI_Iallgather(send_.data(), bytes, MPI_BYTE, recv_.data(), bytes, MPI_BYTE, comm_, &req_);
  }
  // Updates the bound; true when some process is still searching.
  bool absorb() {
    std::vector<Entry> all;
    bool active = false;
    for (int p = 0; p < procs_; ++p) {
      const Entry* e = recv_.data() + size_t(p) * send_.size();
      for (int i = 0; i < k_; ++i)
        if (e[i].time < kInf) all.push_back(e[i]);
      active |= e[k_].time > 0;
    }
    std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
      return a.hash != b.hash ? a.hash < b.hash : a.time < b.time;
    });
    all.erase(std::unique(all.begin(), all.end(),
                          [](const Entry& a, const Entry& b) { return a.hash == b.hash; }),
              all.end());
    if (int(all.size()) >= k_) {
      std::nth_element(all.begin(), all.begin() + (k_ - 1), all.end(),
                       [](const Entry& a, const Entry& b) { return a.time < b.time; });
      shared_ = std::min(shared_, all[size_t(k_ - 1)].time);
    }
    return active;
  }
  MPI_Comm comm_;
  int k_, procs_ = 1;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<Entry> send_, recv_;
  double shared_ = kInf;
};
}  // namespace

double time_rank(double t) {
  if (!std::isfinite(t) || t == 0) return t;
  int e = 0;
  const double m = std::frexp(t, &e);  // t = m 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, 30)), e - 30);
}

bool ranks_before(double time_a, int64_t peak_a, const std::string& key_a, double time_b,
                  int64_t peak_b, const std::string& key_b) {
  const double ra = time_rank(time_a), rb = time_rank(time_b);
  if (ra != rb) return ra < rb;
  if (peak_a != peak_b) return peak_a < peak_b;
  return key_a < key_b;
}

double gib(int64_t b) {
  return double(b) / double(int64_t(1) << 30);
}
std::string fmt_gib(int64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", gib(b));
  return buf;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<int> chunk_sizes(int n, int v) {
  std::vector<int> out;
  for (const auto& r : even_chunks(n, v)) out.push_back(r.size());
  return out;
}

Plan assemble(const ModelSpec& m, const SearchOptions& o, int pp, Schedule sched, int v, int Bm,
              const std::vector<int>& totals, const std::vector<std::vector<LayerStrategy>>& seqs,
              const LayerStrategy& emb) {
  Plan p;
  p.pp = pp;
  p.schedule = sched;
  p.vpp = sched == Schedule::interleaved ? v : 1;
  p.global_batch = o.global_batch;
  p.dtype = o.dtype;
  p.flash_attention = o.flash_attention;
  p.overlap_grad_reduce = o.overlap_grad_reduce;
  p.embedding = emb;
  p.layers.assign(m.layers, LayerStrategy{});
  std::vector<std::vector<int>> sizes(pp);
  for (int s = 0; s < pp; ++s) sizes[s] = chunk_sizes(totals[s], v);
  std::vector<int> used(pp, 0);
  int at = 0;
  for (int c = 0; c < pp * v; ++c) {
    const int s = c % pp, i = c / pp;
    const int n = sizes[s][i];
    p.chunks.push_back({at, at + n});
    for (int k = 0; k < n; ++k) p.layers[at + k] = seqs[s][used[s]++];
    at += n;
  }
  int max_dp = emb.dp;
  for (const auto& l : p.layers) max_dp = std::max(max_dp, l.dp);
  p.micro_batch = Bm / max_dp;
  return p;
}

Scored score(const ModelSpec& m, const ClusterSpec& c, const Plan& p, const FrameworkSpec& fw) {
  CostModel cm(m, c, p, fw);
  Estimate e = estimate(cm);
  Scored s;
  s.time = e.iteration_time_s;
  s.tokens = e.tokens_per_s;
  s.peak = e.peak_memory_bytes;
  for (const auto& st : e.stages) s.stage_peaks.push_back(st.peak_memory_bytes);
  return s;
}

SearchCandidate make_candidate(const Plan& p, const Scored& s, const char* origin) {
  SearchCandidate c;
  c.plan = p;
  c.key = to_json(p).dump();
  c.origin = origin;
  c.est_iteration_time_s = s.time;
  c.est_tokens_per_s = s.tokens;
  c.est_peak_memory_bytes = s.peak;
  c.est_stage_peak_bytes = s.stage_peaks;
  return c;
}

std::vector<int> Searcher::pp_list() const {
  std::vector<int> out;
  for (int pp : divisors(c_.world_size())) {
    if (pp > m_.layers) continue;
    if (!o_.pp_degrees.empty() && !contains(o_.pp_degrees, pp)) continue;
    out.push_back(pp);
  }
  return out;
}

std::vector<int> Searcher::bm_list() const {
  std::vector<int> out;
  for (int b : divisors(o_.global_batch)) {
    if (!o_.micro_batches.empty() && !contains(o_.micro_batches, b)) continue;
    out.push_back(b);
  }
  return out;
}

std::vector<Config> Searcher::configs() const {
  std::vector<Config> out;
  const int world = c_.world_size();
  for (int pp : pp_list()) {
    const int D = world / pp;
    for (int Bm : bm_list()) {
      if (tp_degrees_for(m_, c_, D, Bm, filter_).empty()) continue;
      const int M = o_.global_batch / Bm;
      for (Schedule sch : o_.schedules) {
        std::vector<int> vs{1};
        if (sch == Schedule::gpipe && pp == 1) continue;  // 1f1b with more memory in flight
        if (sch == Schedule::interleaved) {
          if (pp < 2 || M % pp) continue;
          vs.clear();
          for (int v : o_.vpp_degrees)
            if (v >= 2 && pp * v <= m_.layers) vs.push_back(v);
        }
        for (int v : vs) {
          Config cf;
          cf.pp = pp, cf.Bm = Bm, cf.M = M, cf.v = v, cf.sched = sch;
          cf.order = int(out.size());
          out.push_back(cf);
        }
      }
    }
  }
  return out;
}

const PairData& Searcher::pair(int pp, int Bm) {
  return pair_mutable(pp, Bm);
}

PairData& Searcher::pair_mutable(int pp, int Bm) {
  // (run() makes every configuration's slot before its tasks fill them: they only look up.)
  auto it = pairs_.find({pp, Bm});
  auto& slot = it != pairs_.end() ? it->second : pairs_[{pp, Bm}];
  if (slot) return *slot;
  slot = std::make_unique<PairData>();
  PairData& pd = *slot;
  pd.pp = pp, pd.Bm = Bm, pd.D = c_.world_size() / pp;
  pd.tps = tp_degrees_for(m_, c_, pd.D, Bm, filter_);
  Geometry geo;
  geo.g = std::max(1, c_.node.gpus_per_node);
  geo.D = pd.D;
  const auto raw = layer_candidates(m_, c_, pd.D, Bm, filter_);
  std::map<std::vector<int>, int> sig_index;
  for (int s = 0; s < pp; ++s) {
    auto sig = geo.signature(s, pd.tps);
    auto it = sig_index.find(sig);
    if (it != sig_index.end()) {
      pd.stage_geo.push_back(it->second);
      continue;
    }
    const int gi = int(pd.geos.size());
    sig_index[sig] = gi;
    pd.stage_geo.push_back(gi);
    std::vector<LayerCost> costs;
    costs.reserve(raw.size());
    for (const auto& st : raw) {
      costs.push_back(
          tables_.layer(st, Bm / st.dp, geo.tp_nodes(s, st.tp), geo.dp_nodes(s, st.tp)));
      // Beside a pipeline, a send and a receive of the stream in flight (as the estimator).
      if (pp > 1) costs.back().workspace = costs.back().pipelined_workspace;
    }
    pd.raw_layers += int64_t(costs.size());
    GeoData gd;
    gd.items = prune_dominated(std::move(costs));
    pd.kept_layers += int64_t(gd.items.size());
    pd.geos.push_back(std::move(gd));
  }
  {
    std::set<int64_t> bytes;
    for (const auto& gd : pd.geos)
      for (const auto& lc : gd.items) bytes.insert(lc.boundary);
    for (int64_t b : bytes)
      for (int same = 0; same < 2; ++same)
        pd.p2p_min_s[same] =
            std::min(pd.p2p_min_s[same], tables_.cost(1).p2p_cost(b, same == 1).time_s());
  }
  // Embedding strategies: the first stage's placement for the embedding, the last's for the head.
  std::vector<EmbeddingCost> emb;
  for (const auto& st : embedding_candidates(m_, c_, pd.D, Bm, filter_))
    emb.push_back(tables_.embedding(st, Bm / st.dp, geo, pp));
  pd.emb = prune_dominated(std::move(emb));
  return pd;
}

// Micro-batches whose saved activations a stage holds at its worst moment (per layer): the
// schedule's chunk passes in flight, each a 1/v of the stage's layers on average.
double Searcher::in_flight(const Config& cf, int s) const {
  const ScheduleShape shape = cf.shape();
  return double(shape.passes_in_flight(s)) / shape.vpp;
}

// The estimator's interleaved schedule (schedule_peak in src/cost/plan_costs.cpp) holds the kept
// activations of the first passes_in_flight forwards at its peak (the next forward's own peak
// covers its kept activations). Chunk c holds A_c, the kept activations of its layers, once per
// forward on it, so that peak is at least (the fewest forwards on any chunk) x sum_c A_c: every
// layer's kept activations that many times. The DP's in_flight is the average count instead,
// which a chunk of the stage may not reach.
double Searcher::interleaved_least_in_flight(const Config& cf, int s) const {
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
StageRelaxation Searcher::relax_stage(const GeoData& gd, double k) {
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
        const double dm = h[j].first - h[j - 1].first, dc = h[j].second - h[j - 1].second;
        x.segments.push_back({dc / dm, dm, dc, t});
      }
    }
    std::stable_sort(x.segments.begin(), x.segments.end(),
                     [](const StageRelaxation::Segment& a, const StageRelaxation::Segment& b) {
                       return a.rate < b.rate;
                     });
    out.weightings.push_back(std::move(x));
  }
  return out;
}

double Searcher::lower_bound(const Config& cf) {
  PairData& pd = pair_mutable(cf.pp, cf.Bm);
  const int pp = cf.pp, L = m_.layers, v = cf.v;
  if (pd.emb.empty()) return kInf;
  const int n_max = n_max_of(L, pp, v);
  double e_first = kInf, e_last = kInf, e_only = kInf, b_first = kInf, b_last = kInf, b_only = kInf;
  for (const auto& e : pd.emb) {
    e_first = std::min(e_first, double(e.first_states));
    e_last = std::min(e_last, double(e.last_states));
    e_only = std::min(e_only, double(e.only_states));
    b_first = std::min(b_first, e.first_busy_s);
    b_last = std::min(b_last, e.last_busy_s);
    b_only = std::min(b_only, e.first_busy_s + e.last_busy_s);
  }
  // Position counts of a stage of n layers (relax_stage's types), from its chunks (chunk_sizes).
  constexpr int kTypes = StageRelaxation::kTypes;
  std::vector<std::array<double, kTypes>> counts(size_t(n_max) + 1);
  for (int n = v; n <= n_max; ++n) {
    int singles = 0;
    for (int size : chunk_sizes(n, v)) singles += size == 1;
    const int longer = v - singles;
    counts[size_t(n)] = {
        double(n - singles - 2 * longer),    double(longer),
        double(longer > 0 ? longer - 1 : 0), double(longer > 0 ? singles : singles - 1),
        double(longer > 0 ? 1 : 0),          double(longer > 0 ? 0 : 1)};
  }
  std::vector<std::vector<double>> T(pp, std::vector<double>(n_max + 1, kInf));
  for (int s = 0; s < pp; ++s) {
    const double k =
        cf.sched == Schedule::interleaved ? interleaved_least_in_flight(cf, s) : in_flight(cf, s);
    const int gi = pd.stage_geo[s];
    if (pd.geos[gi].items.empty()) continue;
    auto slot = pd.relaxations.find({gi, k});
    if (slot == pd.relaxations.end())
      slot = pd.relaxations.emplace(std::make_pair(gi, k), relax_stage(pd.geos[gi], k)).first;
    const StageRelaxation& rel = slot->second;
    // (A few bytes over net_budget_: the estimator rounds its fragmentation down.)
    double room = double(net_budget_) + 64, extra = 0;
    if (pp == 1)
      room -= e_only, extra = b_only;
    else if (s == 0)
      room -= e_first, extra = b_first;
    else if (s == pp - 1)
      room -= e_last, extra = b_last;
    for (size_t wi = 0; wi < rel.weightings.size(); ++wi) {
      const auto& x = rel.weightings[wi];
      const double busy_weight = kStreamWeights[wi][0];
      // The LP relaxation of the stage's choice under its room: every position starts at its
      // type's least memory; memory then goes where it saves the most time per byte (each
      // envelope is convex, so its segments come in its own order).
      for (int n = v; n <= n_max; ++n) {
        const auto& cnt = counts[size_t(n)];
        double time = busy_weight * extra, left = room;
        for (int t = 0; t < kTypes; ++t) {
          time += cnt[size_t(t)] * x.least[size_t(t)].second;
          left -= cnt[size_t(t)] * x.least[size_t(t)].first;
        }
        if (left < 0) continue;  // nothing fits
        for (const auto& g : x.segments) {
          const double c = cnt[size_t(g.type)];
          if (c == 0) continue;
          const double need = c * g.dm;
          if (need <= left) {
            time += c * g.dc;
            left -= need;
          } else {
            time += c * g.dc * (left / need);
            break;
          }
        }
        T[s][n] = T[s][n] == kInf ? time : std::max(T[s][n], time);
      }
    }
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

void Searcher::consider(const Plan& p, const char* origin, TopK* space_pool) {
  Scored s = score(m_, c_, p, o_.framework);
  ++local_scored_;
  evaluated_.record(p, s.time, s.tokens, s.peak, origin);
  min_memory_.offer(p, s, origin);
  if (!fits(s)) return;
  const bool want_full = o_.space == SearchSpace::full && full_.wants(s.time);
  const bool want_space = space_pool && space_pool->wants(s.time);
  if (!want_full && !want_space) return;
  SearchCandidate c = make_candidate(p, s, origin);
  if (want_space) space_pool->offer(c);
  if (want_full) full_.offer(std::move(c));
}

void Searcher::tick(const char* what) {
  ++progress_done_;
  if (rank_ != 0 || !o_.progress) return;
  if (std::chrono::duration<double>(Clock::now() - last_progress_).count() < o_.progress_interval_s)
    return;
  last_progress_ = Clock::now();
  const TopK& pool = o_.space == SearchSpace::full       ? full_
                     : o_.space == SearchSpace::megatron ? megatron_
                                                         : zero_;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "search: %s %lld/%lld on this process, %lld plans scored, best %.0f tokens/s, %.1f s", what,
      (long long)progress_done_, (long long)progress_total_, (long long)local_scored_,
      pool.empty() ? 0.0 : pool.items().front().est_tokens_per_s, seconds_since(t0_));
  o_.progress(buf);
}

SearchResult Searcher::run() {
#if defined(M_MMAP_MAX)
  // The search allocates and frees large blocks over and over: DP tables, configuration after
  // configuration, and each simulation's Program and index. glibc serves blocks over its mmap
  // threshold with their own mmap and unmaps them on free, and trims the heap's free top, so
  // each was faulted in afresh (the DP alone on one thread: 1.1 s of 5.4 s in the kernel, and a
  // fifth of a large simulation's time). For the search they come from the heap, which keeps
  // its free pages for the next one (at the cost of some fragmentation); malloc_trim returns
  // them after the DP search and after the re-rank, and glibc's defaults come back at the end.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, int(1) << 30);
  struct RestoreMalloc {
    ~RestoreMalloc() {
      malloc_trim(0);
      mallopt(M_MMAP_MAX, 65536);  // glibc's defaults
      mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    }
  } restore_malloc;
#endif
  SearchResult r;
  r.space = o_.space;
  r.memory_budget_bytes = budget_;
  stats_.processes = procs_;
  std::vector<Config> cfs;
  if (o_.space == SearchSpace::full) cfs = configs();
  stats_.configs = int64_t(cfs.size());
  // Baselines first: they seed the K-th best time that lets the bound skip configurations.
  baselines();
  start_early_simulations();
  struct Joiner {
    Searcher* s;
    ~Joiner() { s->finish_early_simulations(); }
  } joiner{this};
  if (!cfs.empty()) {
    // The bounds, a (pp, Bm) pair per task (each builds its pair's cost tables).
    workers_ = std::make_unique<Workers>(rerank_threads());
    {
      std::map<std::pair<int, int>, std::vector<Config*>> by_pair;
      for (auto& cf : cfs) by_pair[{cf.pp, cf.Bm}].push_back(&cf);
      std::vector<const std::vector<Config*>*> tasks;
      for (const auto& [key, list] : by_pair) {
        pairs_[key];  // the slot, filled by its task
        tasks.push_back(&list);
      }
      workers_->run(int(tasks.size()), [&](int i) {
        for (Config* cf : *tasks[size_t(i)]) cf->lb = lower_bound(*cf);
      });
      for (const auto& [key, pd] : pairs_) {
        if (!pd) continue;
        stats_.layer_strategies_costed += pd->raw_layers;
        stats_.layer_strategies_kept += pd->kept_layers;
      }
    }
    std::sort(cfs.begin(), cfs.end(), [](const Config& a, const Config& b) {
      if (a.lb != b.lb) return a.lb < b.lb;
      return a.order < b.order;
    });
    progress_done_ = 0;
    progress_total_ = int64_t((cfs.size() + procs_ - 1) / procs_);
    // Under MPI the processes share their K-th best time while they search (a chain of
    // non-blocking all-reduces, MIN, that also tells whether anyone is still searching): any
    // bound at or above the final K-th best is valid, so sharing it changes no answer, only how
    // many configurations are skipped.
    BoundExchange bound(o_.comm, std::max(1, o_.top_k));
    for (const Config& cf : cfs) stats_.configs_unfit += cf.lb == kInf;
    for (size_t i = rank_; i < cfs.size(); i += procs_) {
      const Config& cf = cfs[i];
      if (o_.prune_configurations) {
        if (cf.lb == kInf) break;  // sorted: the rest cannot fit either
        // (Ranks: a plan of equal rank may still enter, by lower memory or key.)
        if (time_rank(cf.lb) > time_rank(std::min(full_.kth_time(), bound.shared()))) break;
      }
      ++local_searched_;
      search_config(cf);
      bound.poll(full_);
      tick("configurations");
    }
    bound.finish(full_);
    workers_.reset();  // and their threads' DP tables
  }
  stats_.estimate_phase_s = seconds_since(t0_);
  merge(allgather_strings(o_.comm, pack()));
  if (o_.prune_configurations)
    stats_.configs_pruned = stats_.configs - stats_.configs_searched - stats_.configs_unfit;
  const TopK& own = o_.space == SearchSpace::full       ? full_
                    : o_.space == SearchSpace::megatron ? megatron_
                                                        : zero_;
  if (own.empty()) {
    // Nothing fits: find the least memory any plan of the space needs.
    if (o_.space == SearchSpace::full) {
      for (size_t i = rank_; i < cfs.size(); i += procs_) min_memory_config(cfs[i]);
      merge(allgather_strings(o_.comm, pack()));
    }
    std::string msg = "no plan of the " + std::string(to_string(o_.space)) +
                      " space fits the memory budget of " + fmt_gib(budget_) + " per GPU";
    if (min_memory_.best) {
      msg += "; the smallest peak memory reachable is " +
             fmt_gib(min_memory_.best->est_peak_memory_bytes) +
             " per GPU, with: " + min_memory_.best->plan.describe();
    } else {
      msg += " (no valid plan at all for this model, cluster and global batch)";
    }
    throw NoFeasiblePlan(msg, budget_, min_memory_.best);
  }
  // The cost tables and DP tables are not needed any more: the re-rank's simulations get their
  // memory.
  pairs_.clear();
#if defined(M_TRIM_THRESHOLD)
  // Tables the DP workers freed sit in their threads' malloc arenas: back to the system.
  malloc_trim(0);
#endif
  finish_early_simulations(/*help=*/true);
  rerank(r);
  r.evaluated = evaluated_.plans();
  stats_.search_time_s = seconds_since(t0_);
  r.stats = stats_;
  return r;
}

// ---- exhaustive enumeration -------------------------------------------------------------------

void Searcher::enumerate(const std::function<void(const Plan&)>& visit) {
  const int L = m_.layers;
  for (const Config& cf : configs()) {
    const int pp = cf.pp, v = cf.v, D = c_.world_size() / pp;
    const auto raw = layer_candidates(m_, c_, D, cf.Bm, filter_);
    const auto embs = embedding_candidates(m_, c_, D, cf.Bm, filter_);
    if (raw.empty() || embs.empty()) continue;
    // Stage totals: every composition of L into pp parts of at least v layers.
    std::vector<int> totals(pp, v);
    std::function<void(int, int)> compose = [&](int s, int left) {
      if (s == pp - 1) {
        if (left < v) return;
        totals[s] = left;
        std::vector<int> idx(L, 0);
        for (const auto& e : embs) {
          std::fill(idx.begin(), idx.end(), 0);
          while (true) {
            std::vector<std::vector<LayerStrategy>> seqs(pp);
            int at = 0;
            for (int st = 0; st < pp; ++st)
              for (int k = 0; k < totals[st]; ++k) seqs[st].push_back(raw[idx[at++]]);
            visit(assemble(m_, o_, pp, cf.sched, v, cf.Bm, totals, seqs, e));
            int l = L - 1;
            while (l >= 0 && ++idx[l] == int(raw.size())) idx[l--] = 0;
            if (l < 0) break;
          }
        }
        return;
      }
      for (int n = v; n <= left - v * (pp - 1 - s); ++n) {
        totals[s] = n;
        compose(s + 1, left - n);
      }
    };
    compose(0, L);
  }
}

}  // namespace stratagem::search_detail
