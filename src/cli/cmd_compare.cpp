// `stratagem compare forecast.h5 run.h5`: the simulator's forecast against a measured run, op
// kind by op kind, then iteration time and peak memory, each with its relative error.
#include <cmath>
#include <cstdio>
#include <map>

#include "src/cli/command.hpp"
#include "stratagem/report.hpp"

namespace stratagem::cli {
namespace {

using report::TraceSummary;

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
  TraceSummary f = report::summarize_trace(pos[0]), m = report::summarize_trace(pos[1]);
  // Nothing timed means nothing to compare: a damaged or empty trace, not a 100% error.
  for (const auto* s : {&f, &m})
    if (s->seconds_by_kind.empty())
      throw InputError("compare: " + (s == &f ? pos[0] : pos[1]) +
                       " holds no timed ops (empty or damaged trace)");
  if (world_rank() != 0) return 0;
  nlohmann::json kinds = nlohmann::json::array();
  std::map<std::string, int> all;
  for (auto& [k, v] : f.seconds_by_kind) all[k] = 1;
  for (auto& [k, v] : m.seconds_by_kind) all[k] = 1;
  for (auto& [k, unused] : all) {
    (void)unused;
    double p = f.seconds_by_kind.count(k) ? f.seconds_by_kind[k] : 0;
    double q = m.seconds_by_kind.count(k) ? m.seconds_by_kind[k] : 0;
    kinds.push_back(
        {{"kind", k}, {"predicted_s", p}, {"measured_s", q}, {"relative_error", rel(p, q)}});
  }
  nlohmann::json stages = nlohmann::json::array();
  const size_t ns = std::min(f.stages.size(), m.stages.size());
  for (size_t i = 0; i < ns; ++i) {
    const auto &p = f.stages[i], &q = m.stages[i];
    stages.push_back({{"stage", i},
                      {"compute_s",
                       {{"predicted", p.compute_s},
                        {"measured", q.compute_s},
                        {"relative_error", rel(p.compute_s, q.compute_s)}}},
                      {"comm_s",
                       {{"predicted", p.comm_s},
                        {"measured", q.comm_s},
                        {"relative_error", rel(p.comm_s, q.comm_s)}}},
                      {"peak_memory_bytes",
                       {{"predicted", p.peak_bytes},
                        {"measured", q.peak_bytes},
                        {"relative_error", rel(double(p.peak_bytes), double(q.peak_bytes))}}}});
  }
  nlohmann::json out = {{"forecast", pos[0]},
                        {"run", pos[1]},
                        {"forecast_source", f.source},
                        {"run_source", m.source},
                        {"op_kinds", kinds},
                        {"stages", stages},
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
  auto line = [](const std::string& what, double p, double q, bool bytes) {
    std::printf(bytes ? "  %-34s %12.4g %12.4g %s\n" : "  %-34s %12.6f %12.6f %s\n", what.c_str(),
                p, q, percent(rel(p, q)).c_str());
  };
  for (const auto& st : stages) {
    const std::string name = "stage " + std::to_string(st["stage"].get<size_t>());
    line(name + " compute (s)", st["compute_s"]["predicted"], st["compute_s"]["measured"], false);
    line(name + " communication (s)", st["comm_s"]["predicted"], st["comm_s"]["measured"], false);
    line(name + " peak memory (bytes)", st["peak_memory_bytes"]["predicted"],
         st["peak_memory_bytes"]["measured"], true);
  }
  line("iteration time (s)", f.iteration_s, m.iteration_s, false);
  line("peak memory (bytes, max over ranks)", double(f.peak_bytes), double(m.peak_bytes), true);
  return 0;
}

Register reg{
    {"compare", "a forecast trace against a measured one, op kind by op kind",
     "usage: stratagem compare FORECAST.h5 RUN.h5 [--json]\n"
     "  FORECAST.h5 from `stratagem simulate --trace`, RUN.h5 from `stratagem train --trace`.\n"
     "  Prints predicted and measured seconds per op kind, per pipeline stage (compute,\n"
     "  communication, peak memory), iteration time and peak memory, each with its relative\n"
     "  error (predicted - measured) / measured.\n",
     run_compare}};

}  // namespace
}  // namespace stratagem::cli
