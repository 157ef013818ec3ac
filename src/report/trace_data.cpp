// Reading a trace for the report (trace_data.hpp) and the per-op-kind summary that
// `stratagem compare` prints.
#include "src/report/trace_data.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>

#include "stratagem/error.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/program.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem::report {

const char* to_string(OpClass c) {
  static const char* n[] = {"forward", "backward", "recompute", "tp_comm",
                            "dp_comm", "pp_comm",  "offload",   "optimizer",
                            "other",   "cp_comm",  "ep_comm",   "weight_grad"};
  return n[static_cast<int>(c)];
}

OpClass classify(const trace::OpRecord& r) {
  const auto kind = static_cast<OpKind>(r.kind);
  const auto stream = static_cast<Stream>(r.stream);
  if (stream == Stream::cp_comm && kind != OpKind::alloc && kind != OpKind::free)
    return OpClass::cp_comm;
  switch (kind) {
    case OpKind::send:
    case OpKind::recv:
      return OpClass::pp_comm;
    case OpKind::copy_d2h:
    case OpKind::copy_h2d:
      return OpClass::offload;
    case OpKind::host_compute:
      return OpClass::optimizer;
    case OpKind::collective:
      return stream == Stream::dp_comm                                ? OpClass::dp_comm
             : stream == Stream::pp_comm || stream == Stream::pp_recv ? OpClass::pp_comm
             : stream == Stream::ep_comm                              ? OpClass::ep_comm
                                                                      : OpClass::tp_comm;
    case OpKind::compute:
      break;
    default:
      return OpClass::other;
  }
  // The phase is the third dotted field of the name (op_name: "L3.attention.fwd.compute mb0").
  const char* n = r.name;
  const size_t len = strnlen(n, trace::kNameBytes);
  auto has = [&](const char* field) {
    const size_t k = std::strlen(field);
    for (size_t i = 0; i + k + 1 < len; ++i)
      if (n[i] == '.' && std::memcmp(n + i + 1, field, k) == 0 && n[i + 1 + k] == '.') return true;
    return false;
  };
  if (has("fwd")) return OpClass::forward;
  if (has("bwd")) return OpClass::backward;
  if (has("wgrad")) return OpClass::weight_grad;
  if (has("recompute")) return OpClass::recompute;
  if (has("opt")) return OpClass::optimizer;
  return OpClass::other;
}

namespace {

bool is_memory_event(const trace::OpRecord& r) {
  return r.kind == static_cast<uint8_t>(OpKind::alloc) ||
         r.kind == static_cast<uint8_t>(OpKind::free);
}

// "L3.attention.fwd.compute mb0" -> "attention.fwd.compute": one kind of op, all layers.
// Without an allocation: this runs once per op of every rank (10^7 for 1,024 ranks).
std::string_view op_kind(const trace::OpRecord& r) {
  std::string_view n(r.name, strnlen(r.name, trace::kNameBytes));
  if (n.size() > 1 && n[0] == 'L' && std::isdigit(static_cast<unsigned char>(n[1])))
    n.remove_prefix(n.find('.') + 1);
  if (auto at = n.rfind(" mb"); at != std::string_view::npos) n = n.substr(0, at);
  return n;
}

using Interval = std::pair<int64_t, int64_t>;

// Sorted, disjoint union of intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& x : v) {
    if (x.second <= x.first) continue;
    if (!out.empty() && x.first <= out.back().second)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

int64_t length(const std::vector<Interval>& v) {
  int64_t s = 0;
  for (const auto& x : v) s += x.second - x.first;
  return s;
}

// Length of the intersection of two sorted disjoint interval lists.
int64_t overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  int64_t s = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += hi - lo;
    (a[i].second < b[j].second ? i : j)++;
  }
  return s;
}

// Accumulates compare's figures over the ranks of one file.
struct SummaryBuilder {
  std::map<std::string, double, std::less<>> s_by_kind;
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  void add(const trace::OpRecord& op) {
    const std::string_view n = op_kind(op);
    auto it = s_by_kind.find(n);
    if (it == s_by_kind.end()) it = s_by_kind.emplace(std::string(n), 0.0).first;
    it->second += double(op.end_ns - op.start_ns) * 1e-9;
    t0 = std::min(t0, op.start_ns);
    t1 = std::max(t1, op.end_ns);
  }
  void finish(TraceSummary& s, int64_t iterations) const {
    for (const auto& [k, sec] : s_by_kind)
      s.seconds_by_kind[k] = sec / (double(std::max(1, s.ranks)) * double(iterations));
    s.iteration_s = t1 > t0 ? double(t1 - t0) * 1e-9 / double(iterations) : 0;
  }
};

nlohmann::json parse_attribute(const trace::Reader& r, const char* name, const std::string& path) {
  const std::string text = r.attribute(name);
  if (text.empty()) return nullptr;
  return io::parse_json(text, path + ": attribute '" + name + "'");
}

std::vector<Block> blocks_of(const std::vector<trace::OpRecord>& ops, int stream, int iteration,
                             int64_t gap_ns) {
  std::vector<Block> out;
  for (const auto& op : ops) {
    if (op.stream != stream || op.iteration != iteration || is_memory_event(op)) continue;
    const OpClass c = classify(op);
    if (!out.empty()) {
      Block& b = out.back();
      if (b.cls == c && b.microbatch == op.microbatch && op.start_ns - b.end_ns <= gap_ns &&
          op.start_ns >= b.start_ns) {
        b.end_ns = std::max(b.end_ns, op.end_ns);
        ++b.ops;
        continue;
      }
    }
    out.push_back({op.start_ns, op.end_ns, c, op.microbatch, 1});
  }
  return out;
}

}  // namespace

TraceSummary summarize_trace(const std::string& path) {
  trace::Reader r(path);
  TraceSummary s;
  s.source = r.attribute("source");
  const int64_t iters =
      std::max<int64_t>(1, r.has_attribute("iterations") ? r.int_attribute("iterations") : 1);
  SummaryBuilder b;
  // Ranks per stage from the plan (pp stages of equal size; the world when unknown).
  const auto ranks = r.ranks();
  int pp = 1;
  if (r.has_attribute("plan")) {
    // A plan attribute that is not JSON leaves the stages unknown: one stage.
    nlohmann::json plan;
    try {
      plan = parse_attribute(r, "plan", path);
    } catch (const InputError&) {
    }
    if (plan.is_object() && plan.contains("pp") && plan["pp"].is_number_integer())
      pp = std::max(1, plan["pp"].get<int>());
  }
  const int world = ranks.empty() ? 1 : ranks.back() + 1;
  const int per_stage = std::max(1, world / pp);
  s.stages.assign(size_t(std::max(1, std::min(pp, world))), {});
  for (int rank : ranks) {
    ++s.ranks;
    TraceSummary::Stage& st = s.stages[std::min<size_t>(rank / per_stage, s.stages.size() - 1)];
    ++st.ranks;
    for (const auto& op : r.ops(rank)) {
      if (is_memory_event(op)) continue;
      b.add(op);
      const double sec = double(op.end_ns - op.start_ns) * 1e-9 / double(iters);
      const auto k = static_cast<OpKind>(op.kind);
      if (k == OpKind::compute || k == OpKind::host_compute) st.compute_s += sec;
      if (k == OpKind::collective || k == OpKind::send || k == OpKind::recv) st.comm_s += sec;
    }
    for (const auto& m : r.memory(rank)) {
      s.peak_bytes = std::max(s.peak_bytes, m.high_water_bytes);
      st.peak_bytes = std::max(st.peak_bytes, m.high_water_bytes);
    }
  }
  for (auto& st : s.stages)
    if (st.ranks) st.compute_s /= st.ranks, st.comm_s /= st.ranks;
  b.finish(s, iters);
  return s;
}

namespace {

// The file's attributes (its source, model, cluster and plan) and its layout: the world and the
// stages. Returns the ranks the file holds.
std::vector<int> read_header(const trace::Reader& r, const std::string& path, TraceData& d) {
  d.path = path;
  d.source = r.attribute("source");
  d.tool_version = r.attribute("tool_version");
  d.schema_version = int(r.int_attribute("schema_version"));
  d.iterations = int(std::max<int64_t>(1, r.int_attribute("iterations")));
  d.model_json = parse_attribute(r, "model", path);
  d.cluster_json = parse_attribute(r, "cluster", path);
  d.plan_json = parse_attribute(r, "plan", path);
  if (!d.model_json.is_null()) d.model = model_from_json(d.model_json, path + " (model)");
  if (!d.cluster_json.is_null()) d.cluster = cluster_from_json(d.cluster_json, path + " (cluster)");
  if (d.model && !d.plan_json.is_null())
    d.plan = plan_from_json(d.plan_json, *d.model, path + " (plan)");
  std::vector<int> ranks = r.ranks();
  if (ranks.empty()) throw InputError(path + ": the trace holds no ranks");
  d.world = int(r.has_attribute("world_size") ? r.int_attribute("world_size") : 0);
  d.world = std::max(d.world, ranks.back() + 1);
  if (d.plan) {
    d.pp = d.plan->pp;
    d.devices_per_stage = std::max(1, d.plan->devices_per_stage());
  } else {
    d.pp = 1;
    d.devices_per_stage = d.world;
  }
  return ranks;
}

// One rank's figures over its first iteration `it` (its busy time, exposed communication and
// peak memory), widening the trace's window; every op of the rank enters the summary.
RankFigures rank_figures(const trace::Reader& r, int rank, const std::vector<trace::OpRecord>& ops,
                         int it, SummaryBuilder& sb, TraceData& d) {
  RankFigures f;
  f.rank = rank;
  f.stage = d.stage_of(rank);
  std::vector<Interval> busy, comm;
  for (const auto& op : ops) {
    if (is_memory_event(op)) continue;
    sb.add(op);
    if (op.iteration != it) continue;
    d.t0_ns = std::min(d.t0_ns, op.start_ns);
    d.t1_ns = std::max(d.t1_ns, op.end_ns);
    f.end_ns = std::max(f.end_ns, op.end_ns);
    if (op.stream == static_cast<uint8_t>(Stream::compute))
      busy.push_back({op.start_ns, op.end_ns});
    else if (op.kind != static_cast<uint8_t>(OpKind::recv))
      comm.push_back({op.start_ns, op.end_ns});
  }
  busy = merged(std::move(busy));
  comm = merged(std::move(comm));
  f.busy_ns = length(busy);
  f.exposed_comm_ns = length(comm) - overlap(comm, busy);
  for (const auto& m : r.memory(rank)) f.peak_bytes = std::max(f.peak_bytes, m.high_water_bytes);
  return f;
}

// Pass 1: every rank's figures, one rank in memory at a time, and the summary. Returns the
// first iteration of any rank.
int read_figures(const trace::Reader& r, const std::vector<int>& ranks, TraceData& d) {
  SummaryBuilder sb;
  int first_iteration = INT_MAX;
  d.t0_ns = INT64_MAX;
  d.t1_ns = INT64_MIN;
  for (int rank : ranks) {
    const auto ops = r.ops(rank);
    int it = INT_MAX;
    for (const auto& op : ops)
      if (!is_memory_event(op)) it = std::min(it, int(op.iteration));
    const RankFigures f = rank_figures(r, rank, ops, it, sb, d);
    if (it != INT_MAX) first_iteration = std::min(first_iteration, it);
    d.summary.peak_bytes = std::max(d.summary.peak_bytes, f.peak_bytes);
    d.ranks.push_back(f);
  }
  if (d.t1_ns <= d.t0_ns) throw InputError(d.path + ": the trace holds no timed ops");
  d.summary.source = d.source;
  d.summary.ranks = int(ranks.size());
  sb.finish(d.summary, d.iterations);
  for (auto& f : d.ranks) f.bubble_ns = (d.t1_ns - d.t0_ns) - f.busy_ns - f.exposed_comm_ns;
  // Gaps below a quarter pixel of the timeline at its default width (1,400 px for the iteration)
  // are merged: a quarter of a pixel even at 4x zoom.
  d.merge_gap_ns = (d.t1_ns - d.t0_ns) / 5600;
  return first_iteration;
}

// Which ranks to draw: every rank of a small run, else the slowest, the first and the most
// memory-loaded rank of each stage; and those given with --ranks.
void choose_views(const std::vector<int>& ranks, const std::vector<int>& extra_ranks,
                  TraceData& d) {
  std::map<int, size_t> index;
  for (size_t i = 0; i < d.ranks.size(); ++i) index[d.ranks[i].rank] = i;
  const int stages = std::max(1, d.pp);
  std::vector<int> slowest(stages, -1), first(stages, -1), heaviest(stages, -1);
  for (const auto& f : d.ranks) {
    const int s = std::min(f.stage, stages - 1);
    if (first[s] < 0) first[s] = f.rank;
    if (slowest[s] < 0 || f.end_ns > d.ranks[index[slowest[s]]].end_ns) slowest[s] = f.rank;
    if (heaviest[s] < 0 || f.peak_bytes > d.ranks[index[heaviest[s]]].peak_bytes)
      heaviest[s] = f.rank;
  }
  auto present = [](std::vector<int> v) {
    v.erase(std::remove(v.begin(), v.end(), -1), v.end());
    return v;
  };
  if (int(ranks.size()) <= kTimelineAllRanksMax) {
    d.views.push_back({"every rank", ranks});
  } else {
    auto add = [&](const std::string& name, std::vector<int> v) {
      v = present(std::move(v));
      for (const auto& w : d.views)
        if (w.ranks == v) return;
      if (!v.empty()) d.views.push_back({name, v});
    };
    add("the slowest rank of each stage", slowest);
    add("the first rank of each stage", first);
    add("the most memory-loaded rank of each stage", heaviest);
  }
  if (!extra_ranks.empty()) {
    std::vector<int> v;
    for (int x : extra_ranks) {
      if (!index.count(x))
        throw InputError("--ranks: rank " + std::to_string(x) + " is not in " + d.path +
                         " (ranks 0.." + std::to_string(ranks.back()) + ")");
      v.push_back(x);
    }
    d.views.push_back({"ranks given with --ranks", v});
  }
  d.memory_ranks = present(heaviest);
}

// Pass 2: the drawn ranks' first iteration, merged into blocks, and the memory samples.
void read_drawn(const trace::Reader& r, int first_iteration, TraceData& d) {
  std::set<int> drawn;
  for (const auto& v : d.views) drawn.insert(v.ranks.begin(), v.ranks.end());
  for (int rank : drawn) {
    const auto ops = r.ops(rank);
    for (int st = 0; st < kNumStreams; ++st) {
      TimelineRow row;
      row.rank = rank;
      row.stage = d.stage_of(rank);
      row.stream = st;
      row.blocks = blocks_of(ops, st, first_iteration, d.merge_gap_ns);
      if (!row.blocks.empty()) d.rows.push_back(std::move(row));
    }
  }
  for (int rank : d.memory_ranks) d.memory.push_back(r.memory(rank));
}

}  // namespace

TraceData read_trace(const std::string& path, const std::vector<int>& extra_ranks) {
  if (!std::filesystem::exists(path)) throw InputError(path + ": no such file");
  trace::Reader r(path);
  TraceData d;
  const std::vector<int> ranks = read_header(r, path, d);
  const int first_iteration = read_figures(r, ranks, d);
  choose_views(ranks, extra_ranks, d);
  read_drawn(r, first_iteration, d);
  return d;
}

}  // namespace stratagem::report
