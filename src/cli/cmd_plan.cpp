#include <cstdio>
#include <fstream>

#include "src/cli/command.hpp"
#include "src/io/output_file.hpp"
#include "stratagem/layout.hpp"

namespace stratagem::cli {
namespace {

nlohmann::json layout_summary(const Plan& p, const ClusterSpec& c, const Layout& L) {
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < p.pp; ++s) {
    nlohmann::json chunks = nlohmann::json::array();
    for (int ch = s; ch < (int)p.chunks.size(); ch += p.pp)
      chunks.push_back({p.chunks[ch].begin, p.chunks[ch].end});
    int first = L.rank_of(s, 0), last = L.rank_of(s, L.devices_per_stage() - 1);
    stages.push_back({{"stage", s},
                      {"layers", chunks},
                      {"ranks", {first, last}},
                      {"nodes", {L.coords(first).node, L.coords(last).node}}});
  }
  std::map<std::string, int> counts;
  bool tp_in_node = true;
  for (const auto& g : L.groups()) {
    counts[to_string(g.kind)]++;
    if (g.kind == GroupKind::tp) {
      int n0 = L.coords(g.ranks.front()).node;
      for (int r : g.ranks) tp_in_node &= L.coords(r).node == n0;
    }
  }
  return {{"world_size", L.world_size()},
          {"nodes", c.nodes},
          {"gpus_per_node", c.node.gpus_per_node},
          {"pp", p.pp},
          {"devices_per_stage", L.devices_per_stage()},
          {"num_microbatches", p.num_microbatches()},
          {"tp_degrees", L.tp_degrees()},
          {"tp_groups_within_node", tp_in_node},
          {"group_counts", counts},
          {"stages", stages}};
}

int run_plan_check(Args& a) {
  const bool json = a.flag("--json");
  auto out = a.output("-o");
  ModelSpec m = model_from_args(a);
  ClusterSpec c = cluster_from_args(a);
  Plan p = plan_from_args(a, m, c);
  a.finish();
  Layout L(p, c);
  auto summary = layout_summary(p, c, L);
  if (out && world_rank() == 0) io::write_output("-o", *out, to_json(p).dump(2) + "\n");
  if (json) {
    nlohmann::json j;
    j["valid"] = true;
    j["model"] = m.name;
    j["cluster"] = c.name;
    j["layout"] = summary;
    j["plan"] = to_json(p);
    print_json(j);
    return 0;
  }
  if (world_rank() != 0) return 0;
  std::printf("plan OK: %s on %s x %d nodes\n  %s\n", m.name.c_str(), c.name.c_str(), c.nodes,
              p.describe().c_str());
  std::printf("layout: %d ranks = pp %d x %d per stage; %d micro-batches of %d per replica\n",
              L.world_size(), p.pp, L.devices_per_stage(), p.num_microbatches(), p.micro_batch);
  std::printf("  tensor groups inside one node: %s\n",
              summary["tp_groups_within_node"].get<bool>() ? "yes" : "NO (tp crosses nodes)");
  for (const auto& s : summary["stages"])
    std::printf("  stage %3d: layers %s ranks %d-%d nodes %d-%d\n", s["stage"].get<int>(),
                s["layers"].dump().c_str(), s["ranks"][0].get<int>(), s["ranks"][1].get<int>(),
                s["nodes"][0].get<int>(), s["nodes"][1].get<int>());
  for (auto& [k, v] : summary["group_counts"].items())
    std::printf("  %-15s groups: %d\n", k.c_str(), v.get<int>());
  if (out) std::printf("wrote %s\n", out->c_str());
  return 0;
}

Register reg{{"plan check", "validate a plan, print its layout, write the expanded plan",
              std::string("usage: stratagem plan check --model M --cluster C --nodes N "
                          "(--plan FILE | shorthand flags) [-o plan.json] [--json]\n") +
                  kModelHelp + kClusterHelp + kPlanHelp,
              run_plan_check}};

}  // namespace
}  // namespace stratagem::cli
