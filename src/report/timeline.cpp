// The timeline section: block data for the page's script (see page.cpp), which draws one SVG row
// per rank and stream. Blocks are delta-encoded integers in time units of span / 10^6.
#include <algorithm>
#include <cmath>
#include <map>

#include "src/report/html.hpp"
#include "src/report/sections.hpp"
#include "stratagem/program.hpp"

namespace stratagem::report {

std::string legend_item(const std::string& css_class, const std::string& label) {
  return "<span class=\"key\"><svg width=\"12\" height=\"12\"><rect class=\"" + css_class +
         "\" width=\"12\" height=\"12\"/></svg>" + html::escape(label) + "</span>";
}

std::string timeline_section(const TraceData& d) {
  const int64_t span = d.t1_ns - d.t0_ns;
  const int64_t unit = std::max<int64_t>(1, span / 1000000);
  auto units = [&](int64_t t) { return (t - d.t0_ns + unit / 2) / unit; };
  nlohmann::json classes = nlohmann::json::array(), streams = nlohmann::json::array();
  for (int c = 0; c < kNumOpClasses; ++c) classes.push_back(to_string(OpClass(c)));
  for (int s = 0; s < kNumStreams; ++s) streams.push_back(to_string(Stream(s)));
  // One entry per drawn rank: [rank, stage, [[stream, [gap, length, class, mb, ops, ...]], ...]].
  std::map<int, int> entry_of;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& row : d.rows) {
    if (!entry_of.count(row.rank)) {
      entry_of[row.rank] = int(ranks.size());
      ranks.push_back({row.rank, row.stage, nlohmann::json::array()});
    }
    std::vector<int64_t> flat;
    flat.reserve(row.blocks.size() * 5);
    int64_t at = 0;
    for (const auto& b : row.blocks) {
      const int64_t s = units(b.start_ns), e = std::max(s, units(b.end_ns));
      flat.insert(flat.end(), {s - at, e - s, int64_t(b.cls), int64_t(b.microbatch), b.ops});
      at = e;
    }
    ranks[entry_of[row.rank]][2].push_back({row.stream, flat});
  }
  nlohmann::json views = nlohmann::json::array();
  for (const auto& v : d.views) {
    nlohmann::json idx = nlohmann::json::array();
    for (int r : v.ranks)
      if (entry_of.count(r)) idx.push_back(entry_of[r]);
    views.push_back({{"name", v.name}, {"ranks", idx}});
  }
  const nlohmann::json data = {{"unit_ns", unit},    {"span_units", (span + unit - 1) / unit},
                               {"classes", classes}, {"streams", streams},
                               {"views", views},     {"ranks", ranks}};
  std::string json = data.dump();
  // Nothing in it may close the script element.
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 2))
    json.replace(at, 2, "<\\/");

  std::string h = "<section id=\"timeline\"><h2>Timeline of one iteration</h2>\n<p class=\"note\">";
  if (int(d.ranks.size()) <= kTimelineAllRanksMax)
    h += "Every rank, one row per stream it used. ";
  else
    h += "One rank per pipeline stage (" + std::to_string(d.ranks.size()) +
         " ranks in the trace; choose which with the selector, or name ranks with "
         "<code>--ranks</code>). ";
  h += "Ops of one class and micro-batch closer than " +
       html::escape(html::seconds(double(d.merge_gap_ns) * 1e-9)) +
       " on a row are drawn as one block (hover: its op count); labels are micro-batch numbers. "
       "Every op: <code>stratagem trace export " +
       html::escape(d.path) + " --chrome out.json</code> for Perfetto.</p>\n";
  h += "<div class=\"controls\"><label>Ranks: <select id=\"timeline-view\"></select></label> "
       "<button id=\"zoom-out\" type=\"button\">&minus;</button> <span id=\"zoom-label\">1x"
       "</span> <button id=\"zoom-in\" type=\"button\">+</button> (scroll to pan)</div>\n";
  h += "<div class=\"legend\">";
  for (int c = 0; c < kNumOpClasses; ++c) {
    std::string name = to_string(OpClass(c));
    std::replace(name.begin(), name.end(), '_', ' ');
    h += legend_item("k" + std::to_string(c), name);
  }
  h += "</div>\n<div id=\"timeline-host\" class=\"scroll\"></div>\n";
  h += "<script type=\"application/json\" id=\"timeline-data\">" + json + "</script>\n</section>\n";
  return h;
}

}  // namespace stratagem::report
