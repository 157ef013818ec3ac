// The forecast-against-measured section: the figures of `stratagem compare` (seconds per op
// kind, iteration time, peak memory) plus each stage's compute, exposed communication and
// bubble, side by side with relative errors (predicted - measured) / measured.
#include <algorithm>
#include <cmath>
#include <set>

#include "src/report/html.hpp"
#include "src/report/sections.hpp"

namespace stratagem::report {
namespace {

double rel(double predicted, double measured) {
  return measured != 0 ? (predicted - measured) / measured : NAN;
}

std::string error_cell(double e) {
  const char* cls = !std::isfinite(e) ? "err" : std::fabs(e) <= 0.1 ? "err ok" : "err bad";
  return "<td class=\"" + std::string(cls) + "\">" + html::signed_percent(e) + "</td>";
}

// A row with paired bars: predicted above, measured below, on a common scale.
std::string row(const std::string& name, double p, double m, double scale, bool bytes) {
  auto fmt = [&](double v) { return bytes ? html::bytes(int64_t(v)) : html::seconds(v); };
  auto bar = [&](double v, const char* cls) {
    const double w = scale > 0 ? 160 * v / scale : 0;
    return "<svg class=\"pair\" width=\"164\" height=\"7\"><rect class=\"" + std::string(cls) +
           "\" width=\"" + html::num(std::max(0.0, w), 1) + "\" height=\"7\"/></svg>";
  };
  return "<tr><td>" + html::escape(name) + "</td><td class=\"n\">" + fmt(p) +
         "</td><td class=\"n\">" + fmt(m) + "</td>" + error_cell(rel(p, m)) + "<td>" +
         bar(p, "predicted") + "<br>" + bar(m, "measured") + "</td></tr>\n";
}

std::string table_head(const char* what) {
  return "<table class=\"cmp\"><tr><th>" + std::string(what) +
         "</th><th>predicted</th><th>measured</th><th>error</th><th></th></tr>\n";
}

struct StageTimes {
  double busy = 0, comm = 0, bubble = 0;
  int ranks = 0;
};
std::vector<StageTimes> stage_times(const TraceData& d) {
  std::vector<StageTimes> out(std::max(1, d.pp));
  for (const auto& f : d.ranks) {
    auto& s = out[std::min<size_t>(f.stage, out.size() - 1)];
    s.busy += double(f.busy_ns) * 1e-9, s.comm += double(f.exposed_comm_ns) * 1e-9;
    s.bubble += double(f.bubble_ns) * 1e-9, ++s.ranks;
  }
  for (auto& s : out)
    if (s.ranks) s.busy /= s.ranks, s.comm /= s.ranks, s.bubble /= s.ranks;
  return out;
}

}  // namespace

std::string compare_section(const TraceData& f, const TraceData& m) {
  std::string h =
      "<section id=\"compare\"><h2>Forecast against measured</h2>\n<p class=\"note\">Predicted: " +
      html::escape(f.path) + " (" + html::escape(f.source) + ", " +
      std::to_string(f.summary.ranks) + " ranks). Measured: " + html::escape(m.path) + " (" +
      html::escape(m.source) + ", " + std::to_string(m.summary.ranks) +
      " ranks). Error = (predicted &minus; measured) / measured; within &plusmn;10% in green. "
      "Bars: predicted (top) and measured (bottom) on one scale per table.</p>\n";
  // Totals.
  const double iter_scale = std::max(f.summary.iteration_s, m.summary.iteration_s);
  const double mem_scale = double(std::max(f.summary.peak_bytes, m.summary.peak_bytes));
  h += table_head("run");
  h += row("iteration time", f.summary.iteration_s, m.summary.iteration_s, iter_scale, false);
  h += row("peak memory (max over ranks)", double(f.summary.peak_bytes),
           double(m.summary.peak_bytes), mem_scale, true);
  h += "</table>\n";
  // Per op kind: seconds per iteration, mean over ranks.
  std::set<std::string> kinds;
  double kind_scale = 0;
  for (const auto& [k, v] : f.summary.seconds_by_kind)
    kinds.insert(k), kind_scale = std::max(kind_scale, v);
  for (const auto& [k, v] : m.summary.seconds_by_kind)
    kinds.insert(k), kind_scale = std::max(kind_scale, v);
  h += "<h3>Per op kind (seconds per iteration, mean over ranks)</h3>\n" + table_head("op kind");
  for (const auto& k : kinds) {
    const auto pf = f.summary.seconds_by_kind.find(k), pm = m.summary.seconds_by_kind.find(k);
    h += row(k, pf == f.summary.seconds_by_kind.end() ? 0 : pf->second,
             pm == m.summary.seconds_by_kind.end() ? 0 : pm->second, kind_scale, false);
  }
  h += "</table>\n";
  // Per stage.
  h += "<h3>Per stage (mean over the stage's ranks; definitions as in Stage balance)</h3>\n";
  const auto sf = stage_times(f), sm = stage_times(m);
  if (sf.size() != sm.size()) {
    h += "<p class=\"note\">The forecast has " + std::to_string(sf.size()) +
         " pipeline stages and the measured run " + std::to_string(sm.size()) +
         ": no stage-by-stage comparison.</p>\n";
  } else {
    double scale = 0;
    for (const auto& v : {sf, sm})
      for (const auto& s : v) scale = std::max({scale, s.busy, s.comm, s.bubble});
    h += table_head("stage");
    for (size_t i = 0; i < sf.size(); ++i) {
      const std::string st = "stage " + std::to_string(i) + ": ";
      h += row(st + "compute", sf[i].busy, sm[i].busy, scale, false);
      h += row(st + "exposed communication", sf[i].comm, sm[i].comm, scale, false);
      h += row(st + "bubble", sf[i].bubble, sm[i].bubble, scale, false);
    }
    h += "</table>\n";
  }
  h += "</section>\n";
  return h;
}

}  // namespace stratagem::report
