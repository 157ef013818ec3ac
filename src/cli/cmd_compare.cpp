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

int run_compare(Args& a) {
  const bool json = a.flag("--json");
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 2) throw InputError(a.command() + ": expected FORECAST.h5 RUN.h5");
  TraceSummary f = report::summarize_trace(pos[0]), m = report::summarize_trace(pos[1]);
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
  for (const auto& k : kinds)
    std::printf("  %-34s %12.6f %12.6f %+8.1f%%\n", k["kind"].get<std::string>().c_str(),
                k["predicted_s"].get<double>(), k["measured_s"].get<double>(),
                100 * k["relative_error"].get<double>());
  for (const auto& st : stages) {
    const std::string name = "stage " + std::to_string(st["stage"].get<size_t>());
    for (const char* what : {"compute_s", "comm_s"})
      std::printf(
          "  %-34s %12.6f %12.6f %+8.1f%%\n",
          (name + (std::string(what) == "compute_s" ? " compute (s)" : " communication (s)"))
              .c_str(),
          st[what]["predicted"].get<double>(), st[what]["measured"].get<double>(),
          100 * st[what]["relative_error"].get<double>());
    std::printf("  %-34s %12.4g %12.4g %+8.1f%%\n", (name + " peak memory (bytes)").c_str(),
                st["peak_memory_bytes"]["predicted"].get<double>(),
                st["peak_memory_bytes"]["measured"].get<double>(),
                100 * st["peak_memory_bytes"]["relative_error"].get<double>());
  }
  std::printf("  %-34s %12.6f %12.6f %+8.1f%%\n", "iteration time (s)", f.iteration_s,
              m.iteration_s, 100 * rel(f.iteration_s, m.iteration_s));
  std::printf("  %-34s %12.4g %12.4g %+8.1f%%\n", "peak memory (bytes, max over ranks)",
              double(f.peak_bytes), double(m.peak_bytes),
              100 * rel(double(f.peak_bytes), double(m.peak_bytes)));
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
