// `stratagem report`: one self-contained HTML page (inline SVG and CSS, one small inline script,
// no network, no external files) of a plan's timeline, memory, stage balance, search front and
// forecast against measured. Also the per-op-kind summary of a trace that `stratagem compare`
// prints and the page's forecast-against-measured section shows.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stratagem/trace.hpp"

namespace stratagem::report {

// What `stratagem compare` puts side by side.
struct TraceSummary {
  // Per op kind ("attention.fwd.compute": the op name without layer and micro-batch), seconds
  // per iteration, mean over ranks.
  std::map<std::string, double> seconds_by_kind;
  double iteration_s = 0;  // (last end - first start) / iterations
  int64_t peak_bytes = 0;  // max high-water mark over ranks
  std::string source;      // "simulated" | "measured"
  int ranks = 0;
  // Per pipeline stage: seconds per iteration of compute ops and of communication ops
  // (collectives, sends, receives), mean over the stage's ranks, and the stage's peak.
  struct Stage {
    double compute_s = 0, comm_s = 0;
    int64_t peak_bytes = 0;
    int ranks = 0;
  };
  std::vector<Stage> stages;
};
TraceSummary summarize_trace(const std::string& path);  // throws InputError naming the file

struct ReportInputs {
  std::string trace;       // HDF5 trace, simulated or measured ("" when none)
  std::string measured;    // a measured trace to compare `trace` with ("" when none)
  std::string search;      // `stratagem search --json` output ("" when none)
  std::vector<int> ranks;  // more ranks to draw in the timeline (--ranks)
  std::string date;        // shown in the header (UTC)
};

// Ranks up to which the timeline draws every rank; above it, one rank per pipeline stage (the
// selector offers the slowest, the first and the most memory-loaded rank of each stage).
inline constexpr int kTimelineAllRanksMax = 32;

// The whole page. Throws InputError naming the file and field on bad input (a trace of another
// schema version, a search JSON without evaluated_candidates, ...).
std::string render_html(const ReportInputs& in);

}  // namespace stratagem::report
