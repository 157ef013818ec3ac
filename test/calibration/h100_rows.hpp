// The published H100 runs (data/calibration/h100-2024.json) as (model, cluster, framework,
// plan) rows. Where a source leaves the micro-batch or the recompute policy unstated, the row
// takes the fastest choice that fits in 80 GB, as its authors tuned it; rows whose software or
// policy the model cannot express are kept with the reason instead of a forecast.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/loaders.hpp"
#include "test/calibration/megatron_rows.hpp"

namespace stratagem::calibration {

struct H100Row {
  Row row;             // model, cluster, plan, published_s; row.framework = the file's name
  std::string reason;  // non-empty: the model cannot express this row (why)
};

inline std::string h100_file() {
  return std::string(STRATAGEM_SOURCE_DIR) + "/data/calibration/h100-2024.json";
}

namespace detail {
inline std::optional<std::pair<Plan, double>> fastest_fitting(
    const ModelSpec& m, const ClusterSpec& c, const FrameworkSpec& fw, PlanShorthand s,
    const std::vector<int>& mbs, const std::vector<std::string>& rcs) {
  std::optional<std::pair<Plan, double>> best;
  for (int mb : mbs) {
    if (*s.global_batch % (mb * *s.dp) != 0) continue;
    for (const std::string& rc : rcs) {
      s.micro_batch = mb;
      s.recompute = rc;
      Plan p = expand_shorthand(s, m, c);
      CostModel cost(m, c, p.dtype, fw);
      const Estimate e = estimate(cost, p);
      if (e.peak_memory_bytes > c.gpu.hbm_bytes) continue;
      if (!best || e.iteration_time_s < best->second) best = {{p, e.iteration_time_s}};
    }
  }
  return best;
}
// A row whose framework places the pipeline stages itself (`stage_layers`: Transformer layers
// per stage, first to last) gets that partition instead of the shorthand's even split; "" when
// the Plan holds it, else why not (a stage the framework leaves without a layer, holding only the
// head or the loss, is not a stage of the Plan).
inline std::string apply_stage_layers(const nlohmann::json& r, Row& row) {
  const auto counts = r.at("stage_layers").get<std::vector<int>>();
  if ((int)counts.size() != row.plan.pp)
    throw InputError(row.id + ": stage_layers has " + std::to_string(counts.size()) +
                     " entries, pp is " + std::to_string(row.plan.pp));
  std::vector<LayerRange> chunks;
  int at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] <= 0)
      return row.framework + "'s stage partition leaves stage " + std::to_string(i) +
             " with no Transformer layer (only the LM head or the loss); every stage of the Plan "
             "holds at least one layer";
    chunks.push_back({at, at + counts[i]});
    at += counts[i];
  }
  row.plan.chunks = chunks;
  validate(row.plan, row.model, row.cluster, row.id);
  return "";
}
}  // namespace detail

inline std::vector<H100Row> load_h100_rows(const std::string& path = h100_file()) {
  std::vector<H100Row> out;
  for (const auto& r : read_rows_file(path)) {
    H100Row h;
    Row& row = h.row;
    row = row_base(r);
    row.framework = r.at("framework").get<std::string>();
    const auto& mj = r.at("model");
    // None of the 2022-2024 runs uses dropout; Megatron-LM 2019 (tp-one-node.json) trained with
    // 0.1.
    read_architecture(mj, row.model);
    // A job on part of a node (tp-one-node.json: 1-8 of a DGX-2H's 16 GPUs) gets its GPUs' share
    // of the node, as --gpus-per-node gives it; every other file fills its nodes.
    const int gpus = r.at("gpus").get<int>();
    if (gpus < row.cluster.nodes * row.cluster.node.gpus_per_node) {
      if (gpus % row.cluster.nodes != 0)
        throw InputError(row.id + ": gpus " + std::to_string(gpus) + " not a multiple of nodes");
      interop::restrict_to_gpus(row.cluster, gpus / row.cluster.nodes, row.id + " gpus");
    }
    out.push_back(h);
    H100Row& o = out.back();
    const std::string rc = r.at("recompute").is_null() ? "" : r.at("recompute").get<std::string>();
    if (mj.at("position") == "alibi") {
      o.reason = "ALiBi positions are not modelled";
      continue;
    }
    try {
      o.row.software = load_framework(row.framework);
    } catch (const InputError&) {
      o.reason = "no framework file for '" + row.framework + "' (NCCLX, Meta's modified schedule)";
      continue;
    }
    if (rc == "selective-op") {
      o.reason =
          "torchtitan's op-level selective checkpointing (recomputes 37% of the linear "
          "FLOPs) is not a recompute policy of the Plan";
      continue;
    }
    PlanShorthand s;
    s.tp = r.at("tp").get<int>(), s.pp = r.at("pp").get<int>(), s.dp = r.at("dp").get<int>();
    s.cp = r.value("cp", 1);  // the long-context rows split the sequence
    if (r.contains("cp_kind")) s.cp_kind = r.at("cp_kind").get<std::string>();
    s.global_batch = r.at("global_batch").get<int>();
    s.zero = r.at("zero_stage").get<int>();
    s.dtype = r.at("dtype").get<std::string>();
    s.flash_attention = r.at("flash_attention").get<bool>();
    s.sequence_parallel = !r.at("sequence_parallel").is_null() && r.at("sequence_parallel");
    s.schedule = "1f1b";  // pp = 1, or "1f1b or interleaved (not stated)"
    // A framework that reduces the gradients only after the last backward says so.
    s.no_overlap_grad_reduce = !r.value("overlap_grad_reduce", true);
    std::vector<int> mbs = {1, 2, 4, 8, 16};
    if (!r.at("micro_batch").is_null()) mbs = {r.at("micro_batch").get<int>()};
    std::vector<std::string> rcs = {"none", "selective", "full"};
    if (!rc.empty()) rcs = {rc};
    auto best = detail::fastest_fitting(o.row.model, o.row.cluster, o.row.software, s, mbs, rcs);
    if (!best) {
      o.reason = "no stated or tunable micro-batch / recompute choice fits in 80 GB in the model";
      continue;
    }
    o.row.plan = best->first;
    if (r.contains("stage_layers")) o.reason = detail::apply_stage_layers(r, o.row);
  }
  return out;
}

// The long-context rows (cp > 1) whose software has no framework file, forecast under the
// stand-in their row names (`forecast_framework`) at the fastest interleaved vpp, micro-batch
// and recompute that fit in 80 GB, as the authors tuned theirs (the rows state none of the
// three). The row keeps its own framework name for the file's MAPE, which lists it with its
// reason; this forecast is reported beside it.
inline std::vector<Row> load_long_context_rows(const std::string& path = h100_file()) {
  std::vector<Row> out;
  const auto rows = read_rows_file(path);
  const auto h100 = load_h100_rows(path);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (r.value("cp", 1) <= 1 || !r.contains("forecast_framework")) continue;
    Row row = h100[i].row;
    row.framework = r.at("forecast_framework").get<std::string>();
    row.software = load_framework(row.framework);
    PlanShorthand s;
    s.tp = r.at("tp").get<int>(), s.pp = r.at("pp").get<int>(), s.dp = r.at("dp").get<int>();
    s.cp = r.at("cp").get<int>();
    s.cp_kind = r.at("cp_kind").get<std::string>();
    s.global_batch = r.at("global_batch").get<int>();
    s.zero = r.at("zero_stage").get<int>();
    s.dtype = r.at("dtype").get<std::string>();
    s.flash_attention = r.at("flash_attention").get<bool>();
    s.sequence_parallel = true;  // Megatron-Core requires it with cp and tp > 1
    std::optional<std::pair<Plan, double>> best;
    for (int v = 2; int64_t(v) * *s.pp <= row.model.layers; ++v) {
      s.schedule = "interleaved";
      s.vpp = v;
      // Megatron-Core's default group of pp micro-batches per virtual stage (these runs set no
      // other) needs the micro-batches to be a multiple of pp.
      std::vector<int> mbs;
      for (int mb : {1, 2, 4, 8, 16}) {
        const int64_t stage_mb = int64_t(mb) * *s.dp;
        if (*s.global_batch % stage_mb == 0 && (*s.global_batch / stage_mb) % *s.pp == 0)
          mbs.push_back(mb);
      }
      auto b = detail::fastest_fitting(row.model, row.cluster, row.software, s, mbs,
                                       {"none", "selective", "full"});
      if (b && (!best || b->second < best->second)) best = b;
    }
    if (!best) continue;
    row.plan = best->first;
    out.push_back(row);
  }
  return out;
}

}  // namespace stratagem::calibration
