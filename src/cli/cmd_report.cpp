// `stratagem report`: one self-contained HTML page of a trace (timeline, memory, stage balance,
// forecast against measured) and/or a search result (search front).
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include "src/cli/command.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/report.hpp"

namespace stratagem::cli {
namespace {

// Now in UTC, or SOURCE_DATE_EPOCH's time (reproducible pages).
std::string utc_date() {
  std::time_t t = std::time(nullptr);
  if (const char* e = std::getenv("SOURCE_DATE_EPOCH")) t = std::time_t(std::atoll(e));
  char buf[64];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::vector<int> rank_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0 || v > (1 << 24))
      throw InputError(flag + ": expected a comma list of rank numbers, got '" + text + "'");
    out.push_back(int(v));
  }
  return out;
}

int run_report(Args& a) {
  const bool json = a.flag("--json");
  report::ReportInputs in;
  in.trace = a.value("--trace").value_or("");
  in.measured = a.value("--measured").value_or("");
  in.search = a.value("--search").value_or("");
  const auto out = a.output("-o");
  if (auto r = a.value("--ranks")) in.ranks = rank_list("--ranks", *r);
  a.finish();
  if (!out) throw InputError(a.command() + ": missing required flag -o report.html");
  in.date = utc_date();
  if (world_rank() != 0) return 0;
  const std::string page = report::render_html(in);
  io::write_output("-o", *out, page);
  if (json)
    print_json({{"output", *out},
                {"bytes", page.size()},
                {"trace", in.trace},
                {"measured", in.measured},
                {"search", in.search}});
  else
    std::printf("report: wrote %s (%.2f MB)\n", out->c_str(), double(page.size()) / 1e6);
  return 0;
}

Register reg{
    {"report", "one self-contained HTML page of a trace and/or a search result",
     "usage: stratagem report (--trace FILE.h5 [--measured RUN.h5] | --search SEARCH.json)\n"
     "       -o report.html [--ranks R1,R2,...] [--json]\n"
     "  writes one HTML file (inline SVG and CSS, one small script, nothing loaded from\n"
     "  elsewhere): header (model, cluster, plan, tokens/s, MFU, peak memory, version, date)\n"
     "  --trace FILE.h5    a simulated or measured trace: timeline of the first iteration\n"
     "                     (every rank up to 32, else one per pipeline stage with a selector),\n"
     "                     memory of each stage's most-loaded rank, stage balance\n"
     "  --measured RUN.h5  a measured trace: forecast against measured, per op kind and stage\n"
     "  --search FILE      `stratagem search --json` output: the search front (may be given\n"
     "                     with --trace: one page for a dry run)\n"
     "  --ranks LIST       also offer these ranks in the timeline\n"
     "  -o FILE            the page to write\n"
     "  SOURCE_DATE_EPOCH  fixes the date in the header\n"
     "exit codes: 0 ok, 2 bad input (a missing file, a trace of another schema version, a\n"
     "search JSON without evaluated_candidates)\n",
     run_report}};

}  // namespace
}  // namespace stratagem::cli
