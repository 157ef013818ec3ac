// The report page: header, the sections the inputs allow, the stylesheet and the script.
#include <fstream>
#include <sstream>

#include "src/report/html.hpp"
#include "src/report/page_assets.hpp"
#include "src/report/sections.hpp"
#include "stratagem/error.hpp"
#include "stratagem/input_file.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/report.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/version.hpp"
#include "stratagem/workload.hpp"

namespace stratagem::report {
namespace {

using Rows = std::vector<std::pair<std::string, std::string>>;

std::string header_table(const Rows& rows) {
  std::string h = "<table class=\"header\">";
  for (const auto& [k, v] : rows) h += "<tr><td>" + k + "</td><td>" + v + "</td></tr>";
  return h + "</table>\n";
}

std::string cluster_text(const ClusterSpec& c) {
  return html::escape(c.name) + " &times; " + std::to_string(c.nodes) + " nodes (" +
         std::to_string(c.world_size()) + " GPUs, " + html::escape(c.gpu.name) + ", " +
         html::bytes(c.gpu.hbm_bytes) + ")";
}

double mfu_of(const ModelSpec& m, const ClusterSpec& c, const Plan& p, double iteration_s) {
  const double peak = c.gpu.peak_flops(p.dtype);
  if (!(iteration_s > 0) || !(peak > 0)) return NAN;
  return model_flops_per_iteration(m, p.global_batch) / (iteration_s * p.world_size() * peak);
}

Rows trace_rows(const TraceData& d) {
  Rows r;
  r.push_back({"model", d.model ? html::escape(d.model->name) : "(not in the trace)"});
  r.push_back({"cluster", d.cluster ? cluster_text(*d.cluster) : "(not in the trace)"});
  r.push_back({"plan", d.plan ? html::escape(d.plan->describe()) : "(not in the trace)"});
  r.push_back({"trace", html::escape(d.path) + " (" + html::escape(d.source) + ", " +
                            std::to_string(d.ranks.size()) + " ranks, " +
                            std::to_string(d.iterations) + " iteration" +
                            (d.iterations > 1 ? "s, the first drawn" : "") + ")"});
  const double it = d.iteration_s();
  r.push_back({"iteration", html::seconds(it)});
  if (d.model && d.plan) {
    const double tokens = double(d.plan->global_batch) * d.model->seq_len;
    r.push_back({"tokens/s", html::rate(it > 0 ? tokens / it : 0)});
    if (d.cluster) r.push_back({"MFU", html::percent(mfu_of(*d.model, *d.cluster, *d.plan, it))});
  }
  std::string peak = html::bytes(d.summary.peak_bytes);
  if (d.cluster)
    peak += " of " + html::bytes(d.cluster->gpu.hbm_bytes) + " (" +
            html::percent(double(d.summary.peak_bytes) / double(d.cluster->gpu.hbm_bytes)) + ")";
  r.push_back({"peak memory per GPU", peak});
  return r;
}

Rows search_rows(const nlohmann::json& s, const std::string& path) {
  Rows r;
  const std::string model = s.value("model", ""), cluster = s.value("cluster", "");
  const int nodes = s.value("nodes", 0);
  std::optional<ModelSpec> m;
  std::optional<ClusterSpec> c;
  try {  // the names the search ran with; an inline model is not in the file
    if (!model.empty()) m = load_model(model);
    if (!cluster.empty()) {
      c = load_cluster(cluster);
      c->nodes = nodes;
    }
  } catch (const std::exception&) {
  }
  r.push_back({"model", html::escape(model.empty() ? "(inline)" : model)});
  r.push_back(
      {"cluster", c ? cluster_text(*c)
                    : html::escape(cluster) + " &times; " + std::to_string(nodes) + " nodes"});
  r.push_back({"search", html::escape(path) + " (space " + html::escape(s.value("space", "")) +
                             ", global batch " + std::to_string(s.value("global_batch", 0)) + ", " +
                             std::to_string(s.value("candidates_evaluated", 0)) +
                             " plans scored in " + html::seconds(s.value("search_time_s", 0.0)) +
                             ")"});
  if (s.contains("best") && s["best"].is_object()) {
    const auto& b = s["best"];
    r.push_back({"chosen plan", html::escape(b.value("description", ""))});
    const double tok = b.value("tokens_per_s", 0.0);
    r.push_back(
        {"tokens/s", html::rate(tok) + " (" + html::escape(b.value("scored_by", "")) + ")"});
    if (m && c && b.contains("plan")) {
      try {
        const Plan p = plan_from_json(b["plan"], *m, path);
        const double it = tok > 0 ? double(p.global_batch) * m->seq_len / tok : 0;
        r.push_back({"MFU", html::percent(mfu_of(*m, *c, p, it))});
      } catch (const std::exception&) {
      }
    }
    r.push_back({"peak memory per GPU",
                 html::bytes(b.value("peak_memory_bytes", int64_t(0))) + " (budget " +
                     html::bytes(s.value("memory_budget_bytes", int64_t(0))) + ")"});
  }
  return r;
}

}  // namespace

std::string render_html(const ReportInputs& in) {
  if (in.trace.empty() && in.search.empty())
    throw InputError("give --trace FILE.h5 or --search SEARCH.json");
  if (!in.measured.empty() && in.trace.empty())
    throw InputError("--measured needs --trace (the forecast to compare it with)");
  for (const auto& [flag, file] : {std::pair<const char*, const std::string&>{"--trace", in.trace},
                                   {"--measured", in.measured},
                                   {"--search", in.search}})
    if (!file.empty())
      io::check_input_file(file, std::string(flag) + " " + file,
                           flag == std::string("--search") ? "a search JSON" : "an HDF5 trace");
  std::optional<TraceData> forecast, measured;
  nlohmann::json search;
  if (!in.trace.empty()) forecast = read_trace(in.trace, in.ranks);
  if (!in.measured.empty()) measured = read_trace(in.measured, {});
  if (!in.search.empty()) search = io::read_json_file(in.search);

  Rows rows;
  std::string title = "stratagem report";
  if (forecast) {
    rows = trace_rows(*forecast);
    if (forecast->model) title += ": " + forecast->model->name;
  } else {
    rows = search_rows(search, in.search);
    title += ": " + search.value("model", std::string("search"));
  }
  if (forecast && !in.search.empty()) {
    auto more = search_rows(search, in.search);
    for (auto& r : more)
      if (r.first == "search" || r.first == "chosen plan") rows.push_back(r);
  }
  std::string version = "stratagem " + std::string(kVersion);
  if (forecast && !forecast->tool_version.empty() && forecast->tool_version != kVersion)
    version += " (trace written by " + html::escape(forecast->tool_version) + ")";
  rows.push_back({"version", version});
  rows.push_back({"date", html::escape(in.date)});

  std::string body, nav;
  auto add = [&](const char* id, const char* name, std::string html_text) {
    nav += std::string("<a href=\"#") + id + "\">" + name + "</a>";
    body += html_text;
  };
  if (forecast) {
    add("timeline", "Timeline", timeline_section(*forecast));
    add("memory", "Memory", memory_section(*forecast));
    add("balance", "Stage balance", balance_section(*forecast));
  }
  if (!in.search.empty()) add("search", "Search front", search_section(search, in.search));
  if (measured) add("compare", "Forecast vs measured", compare_section(*forecast, *measured));

  std::string page =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"viewport\" "
      "content=\"width=device-width\">\n<title>" +
      html::escape(title) + "</title>\n<style>" + kPageCss + "</style></head>\n<body>\n<h1>" +
      html::escape(title) + "</h1>\n" + header_table(rows) + "<nav>" + nav + "</nav>\n" + body +
      "<div id=\"tip\"></div>\n<script>" + kPageScript + "</script>\n</body></html>\n";
  return page;
}

}  // namespace stratagem::report
