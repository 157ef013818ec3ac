// Plan from and to JSON, and loading a plan file (see stratagem/spec_json.hpp).
#include <nlohmann/json.hpp>

#include "stratagem/error.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem {

namespace {
LayerStrategy strategy_from(io::JsonReader r, bool allow_range) {
  LayerStrategy l;
  if (allow_range) r.raw("layers");  // consumed by the caller
  // tp and dp are required: a default would make a deleted field look like a stage-size
  // mismatch blamed on some other layer.
  l.tp = r.get_int("tp", 1, limits::kMaxTp);
  l.dp = r.get_int("dp", 1, limits::kMaxDp);
  l.cp = r.get_int("cp", 1, limits::kMaxTp, 1);
  l.cp_kind =
      cp_kind_from(r.get_enum("cp_kind", {"ring", "allgather", "a2a"}, "ring"), r.where("cp_kind"));
  l.sequence_parallel = r.get_bool("sequence_parallel", false);
  l.zero = r.get_int("zero", 0, 3, 0);
  l.recompute = recompute_from(r.get_enum("recompute", {"none", "selective", "full"}, "none"),
                               r.where("recompute"));
  // Expert parallelism of MoE layers (validate_moe checks them against the model).
  l.ep = r.get_int("ep", 1, limits::kMaxTp, 1);
  l.etp = r.get_int("etp", 1, limits::kMaxTp, 1);
  if (r.has("offload")) {
    auto o = r.object("offload");
    l.offload_optimizer = o.get_bool("optimizer", false);
    l.offload_params = o.get_bool("params", false);
    l.offload_activations = o.get_bool("activations", false);
    o.reject_unknown();
  }
  r.reject_unknown();
  return l;
}

nlohmann::json strategy_json(const LayerStrategy& l) {
  nlohmann::json j = {{"tp", l.tp},
                      {"dp", l.dp},
                      {"sequence_parallel", l.sequence_parallel},
                      {"zero", l.zero},
                      {"recompute", to_string(l.recompute)},
                      {"offload",
                       {{"optimizer", l.offload_optimizer},
                        {"params", l.offload_params},
                        {"activations", l.offload_activations}}}};
  // Written only when the sequence is split, so that a plan without cp reads as before.
  if (l.cp > 1) j["cp"] = l.cp, j["cp_kind"] = to_string(l.cp_kind);
  // Written only where they are not 1, so that a dense plan's file is as before.
  if (l.ep != 1) j["ep"] = l.ep;
  if (l.etp != 1) j["etp"] = l.etp;
  return j;
}
}  // namespace

Plan plan_from_json(const nlohmann::json& j, const ModelSpec& m, const std::string& source) {
  io::JsonReader r(j, source);
  Plan p;
  p.pp = r.get_int("pp", 1, limits::kMaxPp);
  p.schedule = schedule_from(
      r.get_enum("schedule", {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"}, "1f1b"),
      r.where("schedule"));
  p.vpp = r.get_int("vpp", 1, limits::kMaxVpp, 1);
  p.microbatch_group = r.get_int("microbatch_group", 0, limits::kMaxGlobalBatch, 0);
  p.micro_batch = r.get_int("micro_batch", 1, limits::kMaxMicroBatch);
  p.global_batch = r.get_int("global_batch", 1, limits::kMaxGlobalBatch);
  p.dtype = dtype_from_string(r.get_string("dtype", "bf16"), r.where("dtype"));
  p.flash_attention = r.get_bool("flash_attention", false);
  p.overlap_grad_reduce = r.get_bool("overlap_grad_reduce", true);
  p.backward_prefetch = r.get_bool("backward_prefetch", true);
  r.get_string("description", "");
  p.routing_imbalance = r.get_double("routing_imbalance", 1.0, 64.0, 1.0);
  p.capacity_factor = r.get_double("capacity_factor", 0.0, 64.0, 0.0);
  p.moe_node_limit = r.get_int("moe_node_limit", 0, limits::kMaxNodes, 0);
  p.embedding = strategy_from(r.object("embedding"), false);
  // "layers": a list of {"layers": [begin, end], <strategy>} runs covering every layer once.
  p.layers.assign(m.layers, LayerStrategy{});
  std::vector<int> covered(m.layers, 0);
  const auto& runs = r.array("layers");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string at = "layers[" + std::to_string(i) + "]";
    io::JsonReader run(runs[i], source, at);
    const auto& range = run.raw("layers");
    if (!range.is_array() || range.size() != 2 || !range[0].is_number_integer() ||
        !range[1].is_number_integer())
      run.fail("layers", "[first, one_past_last] layer indices");
    const int64_t b = range[0].get<int64_t>(), e = range[1].get<int64_t>();
    if (b < 0 || e > m.layers || b >= e)
      run.fail("layers", "a range inside [0, " + std::to_string(m.layers) + "), got [" +
                             range[0].dump() + ", " + range[1].dump() + "]");
    LayerStrategy l = strategy_from(run, true);
    for (int64_t k = b; k < e; ++k) {
      covered[k]++;
      p.layers[k] = l;
    }
  }
  for (int k = 0; k < m.layers; ++k)
    if (covered[k] != 1)
      throw InputError(source + ": field 'layers': layer " + std::to_string(k) + " is covered " +
                       std::to_string(covered[k]) + " times; every layer needs exactly one run");
  // "chunks": pipeline stage partition (pp*vpp ranges); default is an even split.
  const int64_t nchunks = int64_t(p.pp) * (p.schedule == Schedule::interleaved ? p.vpp : 1);
  if (r.has("chunks")) {
    const auto& ch = r.array("chunks");
    for (size_t i = 0; i < ch.size(); ++i) {
      if (!ch[i].is_array() || ch[i].size() != 2 || !ch[i][0].is_number_integer() ||
          !ch[i][1].is_number_integer())
        throw InputError(source + ": field 'chunks[" + std::to_string(i) +
                         "]': expected [first, one_past_last] layer indices");
      const int64_t b = ch[i][0].get<int64_t>(), e = ch[i][1].get<int64_t>();
      if (b < 0 || e > m.layers || b >= e)
        throw InputError(source + ": field 'chunks[" + std::to_string(i) +
                         "]': expected a non-empty range inside [0, " + std::to_string(m.layers) +
                         "], got [" + ch[i][0].dump() + ", " + ch[i][1].dump() + "]");
      p.chunks.push_back({int(b), int(e)});
    }
  } else if (nchunks <= m.layers) {
    p.chunks = even_chunks(m.layers, int(nchunks));
  }
  r.reject_unknown();
  return p;
}

nlohmann::json to_json(const Plan& p) {
  nlohmann::json runs = nlohmann::json::array();
  size_t i = 0;
  while (i < p.layers.size()) {
    size_t j = i;
    while (j + 1 < p.layers.size() && p.layers[j + 1] == p.layers[i]) ++j;
    nlohmann::json run = strategy_json(p.layers[i]);
    run["layers"] = {i, j + 1};
    runs.push_back(run);
    i = j + 1;
  }
  nlohmann::json chunks = nlohmann::json::array();
  for (const auto& c : p.chunks) chunks.push_back({c.begin, c.end});
  nlohmann::json j = {{"description", p.describe()},
                      {"pp", p.pp},
                      {"schedule", to_string(p.schedule)},
                      {"vpp", p.vpp},
                      {"micro_batch", p.micro_batch},
                      {"global_batch", p.global_batch},
                      {"dtype", to_string(p.dtype)},
                      {"flash_attention", p.flash_attention},
                      {"overlap_grad_reduce", p.overlap_grad_reduce},
                      {"backward_prefetch", p.backward_prefetch},
                      {"chunks", chunks},
                      {"embedding", strategy_json(p.embedding)},
                      {"layers", runs}};
  if (p.routing_imbalance != 1.0) j["routing_imbalance"] = p.routing_imbalance;
  if (p.capacity_factor != 0.0) j["capacity_factor"] = p.capacity_factor;
  if (p.moe_node_limit != 0) j["moe_node_limit"] = p.moe_node_limit;
  if (p.microbatch_group != 0) j["microbatch_group"] = p.microbatch_group;
  return j;
}

Plan load_plan(const std::string& path, const ModelSpec& m) {
  return plan_from_json(io::read_json_file(path), m, path);
}

}  // namespace stratagem
