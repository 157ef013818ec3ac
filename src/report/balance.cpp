// The stage balance section: per stage, the mean over its ranks of compute, exposed
// communication and bubble time (stacked to the iteration), and the stage's peak memory.
#include <algorithm>

#include "src/report/html.hpp"
#include "src/report/sections.hpp"

namespace stratagem::report {

std::string balance_section(const TraceData& d) {
  const int stages = std::max(1, d.pp);
  struct Stage {
    double busy = 0, comm = 0, bubble = 0;
    int64_t peak = 0;
    int ranks = 0, peak_rank = -1;
  };
  std::vector<Stage> st(stages);
  for (const auto& f : d.ranks) {
    Stage& s = st[std::min(f.stage, stages - 1)];
    s.busy += double(f.busy_ns) * 1e-9;
    s.comm += double(f.exposed_comm_ns) * 1e-9;
    s.bubble += double(f.bubble_ns) * 1e-9;
    ++s.ranks;
    if (f.peak_bytes > s.peak) s.peak = f.peak_bytes, s.peak_rank = f.rank;
  }
  for (auto& s : st)
    if (s.ranks) s.busy /= s.ranks, s.comm /= s.ranks, s.bubble /= s.ranks;
  const double iter = d.iteration_s();
  const int64_t capacity = d.cluster ? d.cluster->gpu.hbm_bytes : 0;
  int64_t mem_top = 1;
  for (const auto& s : st) mem_top = std::max(mem_top, s.peak);
  // The capacity sets the scale unless it is far above every peak (then it is only named).
  const bool capacity_shown = capacity > 0 && double(capacity) <= 1.5 * double(mem_top);
  mem_top = capacity_shown ? std::max(mem_top, capacity) : int64_t(double(mem_top) * 1.25);

  constexpr int kLabelW = 90, kTimeW = 560, kGap = 40, kMemW = 340, kRowH = 18;
  const int width = kLabelW + kTimeW + kGap + kMemW + 10;
  const int height = 28 + stages * (kRowH + 6);
  std::string s = "<svg class=\"balance\" width=\"" + std::to_string(width) + "\" height=\"" +
                  std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " +
                  std::to_string(height) + "\">";
  s += "<text class=\"axis-title\" x=\"" + std::to_string(kLabelW) +
       "\" y=\"12\">time per iteration (mean over the stage's ranks), of " + html::seconds(iter) +
       "</text>";
  s += "<text class=\"axis-title\" x=\"" + std::to_string(kLabelW + kTimeW + kGap) +
       "\" y=\"12\">peak memory (max over ranks)" +
       (capacity > 0 && !capacity_shown ? "; capacity " + html::bytes(capacity) : std::string()) +
       "</text>";
  const double mem_x0 = kLabelW + kTimeW + kGap;
  if (capacity_shown) {
    const double cx = mem_x0 + kMemW * double(capacity) / double(mem_top);
    s += "<line class=\"capacity\" x1=\"" + html::num(cx, 1) + "\" x2=\"" + html::num(cx, 1) +
         "\" y1=\"18\" y2=\"" + std::to_string(height) + "\"/>";
  }
  for (int i = 0; i < stages; ++i) {
    const Stage& x = st[i];
    const int y = 22 + i * (kRowH + 6);
    const double parts[3] = {x.busy, x.comm, x.bubble};
    const char* cls[3] = {"b-compute", "b-comm", "b-bubble"};
    const char* names[3] = {"compute", "exposed communication", "bubble"};
    std::string tip = "stage " + std::to_string(i) + " (" + std::to_string(x.ranks) + " ranks): ";
    for (int k = 0; k < 3; ++k)
      tip += std::string(k ? ", " : "") + names[k] + " " + html::seconds(parts[k]) + " (" +
             html::percent(iter > 0 ? parts[k] / iter : 0) + ")";
    tip += "; peak " + html::bytes(x.peak) + " (rank " + std::to_string(x.peak_rank) + ")";
    s += "<g class=\"balance-row\" data-stage=\"" + std::to_string(i) + "\"><title>" +
         html::escape(tip) + "</title>";
    s += "<text class=\"lbl\" x=\"4\" y=\"" + std::to_string(y + 13) + "\">stage " +
         std::to_string(i) + "</text>";
    double at = kLabelW;
    for (int k = 0; k < 3; ++k) {
      const double w = iter > 0 ? kTimeW * parts[k] / iter : 0;
      if (w > 0)
        s += "<rect class=\"" + std::string(cls[k]) + "\" x=\"" + html::num(at, 1) + "\" y=\"" +
             std::to_string(y) + "\" width=\"" + html::num(w, 1) + "\" height=\"" +
             std::to_string(kRowH) + "\"/>";
      at += w;
    }
    const double mw = mem_top > 0 ? kMemW * double(x.peak) / double(mem_top) : 0;
    s += "<rect class=\"b-memory\" x=\"" + html::num(mem_x0, 1) + "\" y=\"" + std::to_string(y) +
         "\" width=\"" + html::num(mw, 1) + "\" height=\"" + std::to_string(kRowH) + "\"/>";
    s += "<text class=\"tick\" x=\"" + html::num(mem_x0 + mw + 4, 1) + "\" y=\"" +
         std::to_string(y + 13) + "\">" + html::bytes(x.peak) + "</text></g>";
  }
  s += "</svg>";
  std::string h =
      "<section id=\"balance\"><h2>Stage balance</h2>\n<p class=\"note\">Compute: the compute "
      "stream's kernels. Exposed communication: the compute stream idle while the rank runs a "
      "collective, a send or an offload copy. Bubble: idle otherwise (waiting in a pipeline recv "
      "included). The three sum to the iteration. The dashed line is the GPU's capacity.</p>\n"
      "<div class=\"legend\">" +
      legend_item("b-compute", "compute") + legend_item("b-comm", "exposed communication") +
      legend_item("b-bubble", "bubble") + legend_item("b-memory", "peak memory") + "</div>\n" + s +
      "</section>\n";
  return h;
}

}  // namespace stratagem::report
