// `stratagem compare forecast.h5 run.h5`: the simulator's forecast against a measured run, op
// kind by op kind, then iteration time and peak memory, each with its relative error.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "src/cli/command.hpp"
#include "stratagem/trace.hpp"

namespace stratagem::cli {
namespace {

// "L3.attention.fwd.compute mb0" -> "attention.fwd.compute": one kind of op, all layers.
std::string op_kind(const trace::OpRecord& r) {
  std::string n(r.name, strnlen(r.name, trace::kNameBytes));
  if (n.size() > 1 && n[0] == 'L' && std::isdigit(static_cast<unsigned char>(n[1])))
    n = n.substr(n.find('.') + 1);
  if (auto at = n.rfind(" mb"); at != std::string::npos) n.resize(at);
  return n;
}

struct Summary {
  std::map<std::string, std::pair<double, int>> seconds_by_kind;  // per iteration, mean over ranks
  double iteration_s = 0;
  int64_t peak_bytes = 0;
  std::string source;
  int ranks = 0;
};

Summary summarize(const std::string& path) {
  trace::Reader r(path);
  Summary s;
  s.source = r.attribute("source");
  const int64_t iters =
      std::max<int64_t>(1, r.has_attribute("iterations") ? r.int_attribute("iterations") : 1);
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (int rank : r.ranks()) {
    ++s.ranks;
    for (const auto& op : r.ops(rank)) {
      if (op.kind == static_cast<uint8_t>(OpKind::alloc) ||
          op.kind == static_cast<uint8_t>(OpKind::free))
        continue;
      auto& [sec, n] = s.seconds_by_kind[op_kind(op)];
      sec += double(op.end_ns - op.start_ns) * 1e-9;
      ++n;
      t0 = std::min(t0, op.start_ns);
      t1 = std::max(t1, op.end_ns);
    }
    for (const auto& m : r.memory(rank)) s.peak_bytes = std::max(s.peak_bytes, m.high_water_bytes);
  }
  // Nothing timed means nothing to compare: a damaged or empty trace, not a 100% error.
  if (s.seconds_by_kind.empty())
    throw InputError("compare: " + path + " holds no timed ops (empty or damaged trace)");
  for (auto& [k, v] : s.seconds_by_kind) v.first /= double(s.ranks) * double(iters);
  s.iteration_s = t1 > t0 ? double(t1 - t0) * 1e-9 / double(iters) : 0;
  return s;
}

double rel(double predicted, double measured) {
  return measured != 0 ? (predicted - measured) / measured : NAN;
}

// "+12.3%", or "n/a" where nothing was measured (an op kind only one side has).
std::string percent(double r) {
  if (!std::isfinite(r)) return "      n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+8.1f%%", 100 * r);
  return buf;
}

int run_compare(Args& a) {
  const bool json = a.flag("--json");
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 2) throw InputError(a.command() + ": expected FORECAST.h5 RUN.h5");
  Summary f = summarize(pos[0]), m = summarize(pos[1]);
  if (world_rank() != 0) return 0;
  nlohmann::json kinds = nlohmann::json::array();
  std::map<std::string, int> all;
  for (auto& [k, v] : f.seconds_by_kind) all[k] = 1;
  for (auto& [k, v] : m.seconds_by_kind) all[k] = 1;
  for (auto& [k, unused] : all) {
    (void)unused;
    double p = f.seconds_by_kind.count(k) ? f.seconds_by_kind[k].first : 0;
    double q = m.seconds_by_kind.count(k) ? m.seconds_by_kind[k].first : 0;
    kinds.push_back(
        {{"kind", k}, {"predicted_s", p}, {"measured_s", q}, {"relative_error", rel(p, q)}});
  }
  nlohmann::json out = {{"forecast", pos[0]},
                        {"run", pos[1]},
                        {"forecast_source", f.source},
                        {"run_source", m.source},
                        {"op_kinds", kinds},
                        {"iteration_time_s",
                         {{"predicted", f.iteration_s},
                          {"measured", m.iteration_s},
                          {"relative_error", rel(f.iteration_s, m.iteration_s)}}},
                        {"peak_memory_bytes",
                         {{"predicted", f.peak_bytes},
                          {"measured", m.peak_bytes},
                          {"relative_error", rel(double(f.peak_bytes), double(m.peak_bytes))}}}};
  if (json) {
    print_json(out);
    return 0;
  }
  std::printf("compare: %s (%s, %d ranks) against %s (%s, %d ranks)\n", pos[0].c_str(),
              f.source.c_str(), f.ranks, pos[1].c_str(), m.source.c_str(), m.ranks);
  std::printf("  %-34s %12s %12s %9s   (seconds per iteration, mean over ranks)\n", "op kind",
              "predicted", "measured", "error");
  for (const auto& k : kinds) {
    const double p = k["predicted_s"].get<double>(), q = k["measured_s"].get<double>();
    std::printf("  %-34s %12.6f %12.6f %s\n", k["kind"].get<std::string>().c_str(), p, q,
                percent(rel(p, q)).c_str());
  }
  std::printf("  %-34s %12.6f %12.6f %s\n", "iteration time (s)", f.iteration_s, m.iteration_s,
              percent(rel(f.iteration_s, m.iteration_s)).c_str());
  std::printf("  %-34s %12.4g %12.4g %s\n", "peak memory (bytes, max over ranks)",
              double(f.peak_bytes), double(m.peak_bytes),
              percent(rel(double(f.peak_bytes), double(m.peak_bytes))).c_str());
  return 0;
}

Register reg{
    {"compare", "a forecast trace against a measured one, op kind by op kind",
     "usage: stratagem compare FORECAST.h5 RUN.h5 [--json]\n"
     "  FORECAST.h5 from `stratagem simulate --trace`, RUN.h5 from `stratagem train --trace`.\n"
     "  Prints predicted and measured seconds per op kind, iteration time and peak memory,\n"
     "  each with its relative error (predicted - measured) / measured.\n",
     run_compare}};

}  // namespace
}  // namespace stratagem::cli
