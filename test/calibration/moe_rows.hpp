// The published Mixture-of-Experts training runs (data/calibration/moe.json) as (model, cluster,
// framework, plan) rows in the H100 file's schema. Rows whose software or model the cost model
// cannot express carry the file's `not_expressible` reason instead of a forecast.
#pragma once
#include "stratagem/loaders.hpp"
#include "test/calibration/h100_rows.hpp"

namespace stratagem::calibration {

inline std::string moe_file() {
  return std::string(STRATAGEM_SOURCE_DIR) + "/data/calibration/moe.json";
}

inline std::vector<H100Row> load_moe_rows(const std::string& path = moe_file()) {
  std::vector<H100Row> out;
  for (const auto& r : read_rows_file(path)) {
    H100Row h;
    h.row.id = r.at("id").get<std::string>();
    h.row.framework = r.at("framework").get<std::string>();
    h.row.published_s = r.at("implied_iteration_time_s").get<double>();
    if (r.contains("not_expressible")) {
      h.reason = r.at("not_expressible").get<std::string>();
      out.push_back(std::move(h));
      continue;
    }
    Row& row = h.row;
    const std::string framework = row.framework;
    row = row_base(r);
    row.framework = framework;
    const auto& mj = r.at("model");
    ModelSpec& m = row.model;
    read_architecture(mj, m);
    const auto& e = mj.at("moe");
    m.moe.experts = e.at("experts"), m.moe.top_k = e.at("top_k");
    m.moe.expert_ffn_hidden = e.at("expert_ffn_hidden");
    m.moe.shared_experts = e.at("shared_experts"), m.moe.dense_layers = e.at("dense_layers");
    row.software = load_framework(row.framework);
    PlanShorthand s;
    s.tp = r.at("tp").get<int>(), s.pp = r.at("pp").get<int>(), s.dp = r.at("dp").get<int>();
    s.ep = r.at("ep").get<int>(), s.etp = r.at("etp").get<int>();
    s.micro_batch = r.at("micro_batch").get<int>();
    s.global_batch = r.at("global_batch").get<int>();
    s.zero = r.at("zero_stage").get<int>();
    s.recompute = r.at("recompute").get<std::string>();
    s.dtype = r.at("dtype").get<std::string>();
    s.flash_attention = r.at("flash_attention").get<bool>();
    s.sequence_parallel = r.at("sequence_parallel").get<bool>();
    // Megatron-Core's interleaved 1F1B when the row names a virtual pipeline size (its VP).
    if (r.value("vpp", 1) > 1) s.schedule = "interleaved", s.vpp = r.at("vpp").get<int>();
    row.plan = expand_shorthand(s, m, row.cluster);
    validate(row.plan, m, row.cluster, row.id);
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace stratagem::calibration
