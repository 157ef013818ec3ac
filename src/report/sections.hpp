// The report's sections, one file each; every function returns an HTML fragment.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "src/report/trace_data.hpp"

namespace stratagem::report {

// Gantt chart of the first iteration: compact block data that the page's script draws as SVG
// (so that zoom and the rank selector cost no extra bytes).
std::string timeline_section(const TraceData& d);
// Bytes over time of the most-loaded rank of each stage, stacked by category.
std::string memory_section(const TraceData& d);
// Per stage: compute, exposed communication and bubble time, and peak memory.
std::string balance_section(const TraceData& d);
// Forecast against a measured run: op kinds, stages, iteration time, peak memory.
std::string compare_section(const TraceData& forecast, const TraceData& measured);
// Every evaluated candidate as tokens/s against peak memory. `search` is the search's JSON.
std::string search_section(const nlohmann::json& search, const std::string& path);

// Legend entries (a coloured square per class), shared by the charts.
std::string legend_item(const std::string& css_class, const std::string& label);

}  // namespace stratagem::report
