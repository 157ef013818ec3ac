// The search front section: every recorded candidate of `stratagem search --json`
// (evaluated_candidates) as the estimator's tokens/s against its peak memory, with the Pareto
// front, the chosen plan, the best Megatron-style and ZeRO-3 baselines and the budget line.
#include <algorithm>
#include <cmath>

#include "src/report/html.hpp"
#include "src/report/sections.hpp"
#include "stratagem/error.hpp"

namespace stratagem::report {
namespace {

constexpr double kW = 900, kH = 470, kL = 70, kR = 20, kT = 16, kB = 44;
constexpr double kClipBudgets = 2.5;  // x axis ends at 2.5x the budget

struct Point {
  double tokens = 0, gib = 0;
  std::string origin, description;
  bool pareto = false;
};

double num_at(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number())
    throw InputError(where + ": expected a number in '" + key + "'");
  return j[key].get<double>();
}

const double kGib = double(int64_t(1) << 30);

// A plan drawn apart from the candidates, at the estimator's figures like every point.
struct Mark {
  const char* label;
  const char* cls;
  nlohmann::json j;
};

// The search's evaluated_candidates, refused with the reason when there is nothing to draw.
const nlohmann::json& evaluated_candidates(const nlohmann::json& s, const std::string& path) {
  if (!s.is_object()) throw InputError(path + ": expected a JSON object");
  if (s.contains("feasible") && s["feasible"] == false)
    throw InputError(path +
                     ": the search found no plan within its budget (\"feasible\": false): "
                     "no candidates to draw");
  if (!s.contains("evaluated_candidates") || !s["evaluated_candidates"].is_object() ||
      !s["evaluated_candidates"].contains("plans") ||
      !s["evaluated_candidates"]["plans"].is_array() || s["evaluated_candidates"]["plans"].empty())
    throw InputError(path +
                     ": no evaluated_candidates.plans (the candidates a search scored, written "
                     "by `stratagem search --json`)");
  return s["evaluated_candidates"];
}

std::vector<Point> read_points(const nlohmann::json& ev, const std::string& path) {
  std::vector<Point> pts;
  for (size_t i = 0; i < ev["plans"].size(); ++i) {
    const auto& p = ev["plans"][i];
    const std::string where = path + ": evaluated_candidates.plans[" + std::to_string(i) + "]";
    if (!p.is_object()) throw InputError(where + ": expected an object");
    Point x;
    x.tokens = num_at(p, "tokens_per_s", where);
    x.gib = num_at(p, "peak_memory_bytes", where) / kGib;
    x.origin = p.value("origin", "dp");
    x.description = p.value("description", "");
    x.pareto = p.value("pareto", false);
    pts.push_back(std::move(x));
  }
  return pts;
}

// The chosen plan and the best baselines, those the search wrote with a plan and an estimate.
std::vector<Mark> read_marks(const nlohmann::json& s) {
  std::vector<Mark> marks;
  auto mark = [&](const char* label, const char* cls, const nlohmann::json* j) {
    if (j && j->is_object() && j->contains("estimate") && j->contains("plan") &&
        !(*j)["plan"].is_null())
      marks.push_back({label, cls, *j});
  };
  if (s.contains("best")) mark("chosen", "chosen", &s["best"]);
  if (s.contains("baselines")) {
    const auto& b = s["baselines"];
    if (b.contains("megatron")) mark("best Megatron-style", "megatron", &b["megatron"]);
    if (b.contains("zero")) mark("best ZeRO-3", "zero", &b["zero"]);
  }
  return marks;
}

// The plot's scales: peak memory (GiB) across, tokens/s up.
struct Axes {
  double max_gib = 0, max_tokens_per_s = 0;
  bool clipped = false;  // the memory axis ends at kClipBudgets budgets, short of some plans
  double plot_w = kW - kL - kR, plot_h = kH - kT - kB;
  double x(double gib) const { return kL + plot_w * std::min(gib, max_gib) / max_gib; }
  double y(double tokens) const { return kT + plot_h * (1 - tokens / max_tokens_per_s); }
};

Axes axes_for(const std::vector<Point>& pts, const std::vector<Mark>& marks, double budget) {
  Axes a;
  double xmax = budget, ymax = 0;
  for (const auto& p : pts) xmax = std::max(xmax, p.gib), ymax = std::max(ymax, p.tokens);
  for (const auto& m : marks)
    ymax = std::max(ymax, m.j["estimate"].value("tokens_per_s", 0.0)),
    xmax = std::max(xmax, m.j["estimate"].value("peak_memory_bytes", 0.0) / kGib);
  a.clipped = budget > 0 && xmax > kClipBudgets * budget;
  if (a.clipped) xmax = kClipBudgets * budget;
  xmax *= 1.05;
  ymax = std::max(ymax * 1.08, 1.0);
  a.max_gib = xmax, a.max_tokens_per_s = ymax;
  return a;
}

// The <svg> element's opening, the grid with its ticks, the axis titles and the budget line.
std::string svg_frame(const Axes& a, double budget) {
  const double xmax = a.max_gib, ymax = a.max_tokens_per_s, pw = a.plot_w, ph = a.plot_h;
  std::string g = "<svg id=\"front\" class=\"front\" width=\"" + html::num(kW, 0) + "\" height=\"" +
                  html::num(kH, 0) + "\" viewBox=\"0 0 " + html::num(kW, 0) + " " +
                  html::num(kH, 0) + "\">";
  const double xs = html::nice_step(xmax, 8), ys = html::nice_step(ymax, 6);
  for (double v = 0; v <= xmax; v += xs)
    g += "<line class=\"grid\" x1=\"" + html::num(a.x(v), 1) + "\" x2=\"" + html::num(a.x(v), 1) +
         "\" y1=\"" + html::num(kT, 1) + "\" y2=\"" + html::num(kT + ph, 1) +
         "\"/><text class=\"tick\" x=\"" + html::num(a.x(v), 1) + "\" y=\"" +
         html::num(kT + ph + 14, 1) + "\" text-anchor=\"middle\">" + html::tick(v, xs) + "</text>";
  for (double v = 0; v <= ymax; v += ys)
    g += "<line class=\"grid\" x1=\"" + html::num(kL, 1) + "\" x2=\"" + html::num(kL + pw, 1) +
         "\" y1=\"" + html::num(a.y(v), 1) + "\" y2=\"" + html::num(a.y(v), 1) +
         "\"/><text class=\"tick\" x=\"" + html::num(kL - 4, 1) + "\" y=\"" +
         html::num(a.y(v) + 3, 1) + "\" text-anchor=\"end\">" + html::rate(v) + "</text>";
  g += "<text class=\"axis-title\" x=\"" + html::num(kL + pw / 2, 1) + "\" y=\"" +
       html::num(kH - 6, 1) +
       "\" text-anchor=\"middle\">peak memory per GPU (GiB)</text><text class=\"axis-title\" "
       "transform=\"translate(14 " +
       html::num(kT + ph / 2, 1) + ") rotate(-90)\" text-anchor=\"middle\">tokens/s</text>";
  if (budget > 0)
    g += "<line class=\"budget\" x1=\"" + html::num(a.x(budget), 1) + "\" x2=\"" +
         html::num(a.x(budget), 1) + "\" y1=\"" + html::num(kT, 1) + "\" y2=\"" +
         html::num(kT + ph, 1) + "\"/><text class=\"budget-label\" x=\"" +
         html::num(a.x(budget) - 4, 1) + "\" y=\"" + html::num(kT + 12, 1) +
         "\" text-anchor=\"end\">budget " + html::num(budget, 1) + " GiB</text>";
  return g;
}

// Every candidate as a point (hollow over the budget), then the Pareto front's staircase.
std::string svg_points(const std::vector<Point>& pts, const Axes& a, double budget) {
  std::string g;
  for (const auto& p : pts) {
    const bool fits = budget <= 0 || p.gib <= budget;
    std::string cls = "cand o-" + html::escape(p.origin) + (fits ? "" : " over");
    if (a.clipped && p.gib > a.max_gib) cls += " clipped";
    g += "<circle class=\"" + cls + "\" cx=\"" + html::num(a.x(p.gib), 1) + "\" cy=\"" +
         html::num(a.y(p.tokens), 1) + "\" r=\"3\"><title>" + html::escape(p.description) + "\n" +
         html::rate(p.tokens) + " tokens/s, peak " + html::num(p.gib, 2) + " GiB (" +
         html::escape(p.origin) + (p.pareto ? ", Pareto front" : "") + ")</title></circle>";
  }
  std::vector<const Point*> front;
  for (const auto& p : pts)
    if (p.pareto) front.push_back(&p);
  std::sort(front.begin(), front.end(), [](auto* l, auto* r) { return l->gib < r->gib; });
  if (!front.empty()) {
    std::string d =
        "M" + html::num(a.x(front[0]->gib), 1) + " " + html::num(a.y(front[0]->tokens), 1);
    for (size_t i = 1; i < front.size(); ++i)
      d += "H" + html::num(a.x(front[i]->gib), 1) + "V" + html::num(a.y(front[i]->tokens), 1);
    g += "<path class=\"pareto\" d=\"" + d + "\"/>";
  }
  return g;
}

// The marks (a star for the chosen plan, squares for the baselines) with their labels.
std::string svg_marks(const std::vector<Mark>& marks, const Axes& a) {
  std::string g;
  for (const auto& m : marks) {
    const double t = m.j["estimate"].value("tokens_per_s", 0.0);
    const double mg = m.j["estimate"].value("peak_memory_bytes", 0.0) / kGib;
    const std::string desc = m.j.value("description", "");
    const double cx = a.x(mg), cy = a.y(t);
    const std::string tip = std::string(m.label) + ": " + desc + "\n" + html::rate(t) +
                            " tokens/s (estimator), peak " + html::num(mg, 2) + " GiB";
    if (std::string(m.cls) == "chosen")
      g += "<path class=\"mark chosen\" d=\"M" + html::num(cx, 1) + " " + html::num(cy - 9, 1) +
           "l2.6 6.2 6.6.4-5 4.3 1.6 6.5-5.8-3.5-5.8 3.5 1.6-6.5-5-4.3 6.6-.4z\"><title>" +
           html::escape(tip) + "</title></path>";
    else
      g += "<rect class=\"mark " + std::string(m.cls) + "\" x=\"" + html::num(cx - 5, 1) +
           "\" y=\"" + html::num(cy - 5, 1) + "\" width=\"10\" height=\"10\"><title>" +
           html::escape(tip) + "</title></rect>";
    // Labels in three directions, so that close marks keep readable labels.
    const std::string cls = m.cls;
    const double lx = cls == "zero" ? cx - 10 : cx + 10;
    const double ly = cls == "chosen" ? cy - 12 : cls == "megatron" ? cy + 18 : cy + 18;
    g += "<text class=\"mark-label\" x=\"" + html::num(lx, 1) + "\" y=\"" + html::num(ly, 1) +
         "\"" + (cls == "zero" ? " text-anchor=\"end\"" : "") + ">" + m.label + "</text>";
  }
  return g;
}

// The marked plans side by side: as scored by the search and by the estimator.
std::string marks_table(const std::vector<Mark>& marks) {
  std::string table =
      "<table class=\"cmp\"><tr><th></th><th>tokens/s</th><th>scored by</th><th>estimator "
      "tokens/s</th><th>peak memory</th><th>plan</th></tr>\n";
  for (const auto& m : marks) {
    const double t = m.j["estimate"].value("tokens_per_s", 0.0);
    const std::string desc = m.j.value("description", "");
    table += "<tr><td>" + std::string(m.label) + "</td><td class=\"n\">" +
             html::rate(m.j.value("tokens_per_s", 0.0)) + "</td><td>" +
             html::escape(m.j.value("scored_by", "")) + "</td><td class=\"n\">" + html::rate(t) +
             "</td><td class=\"n\">" + html::bytes(m.j.value("peak_memory_bytes", int64_t(0))) +
             "</td><td>" + html::escape(desc) + "</td></tr>\n";
  }
  table += "</table>\n";
  return table;
}

}  // namespace

std::string search_section(const nlohmann::json& s, const std::string& path) {
  const auto& ev = evaluated_candidates(s, path);
  std::vector<Point> pts = read_points(ev, path);
  const double budget = s.value("memory_budget_bytes", 0.0) / kGib;
  const std::vector<Mark> marks = read_marks(s);
  const Axes axes = axes_for(pts, marks, budget);

  std::string g = svg_frame(axes, budget);
  // Points (the per-layer search's on top of the baselines'), then the front, then the marks.
  std::stable_sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) {
    return (a.origin == "dp") < (b.origin == "dp");
  });
  g += svg_points(pts, axes, budget);
  g += svg_marks(marks, axes);
  g += "</svg>";

  const int64_t evaluated = ev.value("evaluated", int64_t(pts.size()));
  std::string h = "<section id=\"search\"><h2>Search front</h2>\n<p class=\"note\">" +
                  std::to_string(pts.size()) + " plans drawn of " + std::to_string(evaluated) +
                  " evaluated (" + html::escape(ev.value("sample", std::string("all"))) +
                  "), each at the " +
                  html::escape(ev.value("scored_by", std::string("estimator"))) +
                  "'s tokens/s and peak memory per GPU; hover a point for its plan. The line is "
                  "the Pareto front of every plan scored; hollow points exceed the budget.";
  if (axes.clipped)
    h += " Plans above " + html::num(kClipBudgets, 1) + "x the budget are drawn at the right edge.";
  h += "</p>\n<div class=\"legend\">" + legend_item("o-dp", "per-layer search") +
       legend_item("o-megatron", "Megatron-style") + legend_item("o-zero", "ZeRO-3") +
       legend_item("chosen", "chosen plan") + "</div>\n" + g + marks_table(marks) + "</section>\n";
  return h;
}

}  // namespace stratagem::report
