// The strategy search's public entry points and JSON (see search.hpp; the internals are in
// searcher.hpp).
#include "stratagem/search.hpp"

#include <nlohmann/json.hpp>
#include <set>

#include "src/search/searcher.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

const char* to_string(SearchSpace s) {
  switch (s) {
    case SearchSpace::full:
      return "full";
    case SearchSpace::megatron:
      return "megatron";
    case SearchSpace::zero:
      return "zero";
  }
  return "?";
}

SearchSpace search_space_from_string(const std::string& s, const std::string& where) {
  if (s == "full") return SearchSpace::full;
  if (s == "megatron") return SearchSpace::megatron;
  if (s == "zero") return SearchSpace::zero;
  throw InputError(where + ": expected full|megatron|zero, got '" + s + "'");
}

namespace search_detail {

int64_t resolve_budget(const ClusterSpec& c, const SearchOptions& o) {
  const int64_t hbm = c.gpu.hbm_bytes;
  if (o.memory_budget_bytes < 0) throw InputError("--memory-budget-gib: expected a positive size");
  const int64_t b = o.memory_budget_bytes == 0 ? hbm : o.memory_budget_bytes;
  if (b > hbm)
    throw InputError("--memory-budget-gib: " + fmt_gib(b) + " exceeds the " + fmt_gib(hbm) +
                     " of the cluster's GPU (" + c.gpu.name + "); give at most the GPU's memory");
  const int64_t fixed = c.gpu.process.cuda_context_bytes + c.gpu.process.cublas_workspace_bytes;
  if (b <= fixed)
    throw InputError("--memory-budget-gib: " + fmt_gib(b) +
                     " leaves nothing after the GPU's CUDA context and cuBLAS workspace of " +
                     fmt_gib(fixed));
  return b;
}

void check_options(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o) {
  if (o.global_batch < 1) throw InputError("--global-batch: expected a positive number of samples");
  if (o.top_k < 1 || o.top_k > 1000) throw InputError("--top: expected 1..1000");
  if (o.memory_resolution_bytes != 0 && o.memory_resolution_bytes < (1 << 20))
    throw InputError("memory resolution: expected 0 (auto) or >= 1 MiB");
  if (c.world_size() < 1) throw InputError("--nodes: the cluster has no GPUs");
  (void)m;
}

}  // namespace search_detail

using namespace search_detail;

SearchResult search(const ModelSpec& model, const ClusterSpec& cluster,
                    const SearchOptions& options) {
  check_options(model, cluster, options);
  const int64_t budget = resolve_budget(cluster, options);
  Searcher s(model, cluster, options, budget);
  // A global batch that no data-parallel degree of the space divides.
  {
    bool any = false;
    const int world = cluster.world_size();
    std::set<int> dps;
    for (int pp : divisors(world)) {
      if (pp > model.layers) continue;
      if (!options.pp_degrees.empty() && !contains(options.pp_degrees, pp)) continue;
      const int D = world / pp;
      const int max_tp = options.allow_cross_node_tp ? D : std::max(1, cluster.node.gpus_per_node);
      for (int tp = 1; tp <= max_tp && tp <= D; tp *= 2)
        if (D % tp == 0) {
          dps.insert(D / tp);
          any |= options.global_batch % (D / tp) == 0;
        }
    }
    if (!any) {
      std::string list;
      for (int d : dps) list += (list.empty() ? "" : ", ") + std::to_string(d);
      throw InputError("--global-batch " + std::to_string(options.global_batch) +
                       " is not divisible by any data-parallel degree this cluster allows (" +
                       list + " for " + std::to_string(world) + " GPUs, tp up to " +
                       std::to_string(cluster.node.gpus_per_node) + ", pp up to the " +
                       std::to_string(model.layers) + " layers)");
    }
    if (options.space == SearchSpace::zero && options.global_batch % world)
      throw InputError("--space zero: the global batch " + std::to_string(options.global_batch) +
                       " is not divisible by the data-parallel degree " + std::to_string(world) +
                       " (pp 1, tp 1: every GPU is a replica)");
  }
  return s.run();
}

void for_each_plan(const ModelSpec& model, const ClusterSpec& cluster, const SearchOptions& options,
                   const std::function<void(const Plan&)>& visit) {
  check_options(model, cluster, options);
  Searcher s(model, cluster, options, resolve_budget(cluster, options));
  s.enumerate(visit);
}

// ---- JSON --------------------------------------------------------------------------------------

nlohmann::json to_json(const SearchCandidate& c) {
  nlohmann::json j = {{"plan", to_json(c.plan)},
                      {"description", c.plan.describe()},
                      {"origin", c.origin},
                      {"scored_by", c.simulated ? "simulator" : "estimator"},
                      {"tokens_per_s", c.tokens_per_s()},
                      {"iteration_time_s", c.iteration_time_s()},
                      {"peak_memory_bytes", c.peak_memory_bytes()},
                      {"stage_peak_memory_bytes", c.stage_peak_bytes()},
                      {"estimate",
                       {{"tokens_per_s", c.est_tokens_per_s},
                        {"iteration_time_s", c.est_iteration_time_s},
                        {"peak_memory_bytes", c.est_peak_memory_bytes},
                        {"stage_peak_memory_bytes", c.est_stage_peak_bytes}}}};
  if (c.simulated)
    j["simulation"] = {{"tokens_per_s", c.sim_tokens_per_s},
                       {"iteration_time_s", c.sim_iteration_time_s},
                       {"peak_memory_bytes", c.sim_peak_memory_bytes},
                       {"stage_peak_memory_bytes", c.sim_stage_peak_bytes},
                       {"fits", c.sim_fits}};
  return j;
}

nlohmann::json to_json(const SearchResult& r) {
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : r.ranked) cands.push_back(to_json(c));
  auto baseline = [](const std::optional<SearchCandidate>& c, const std::string& note) {
    if (c) return to_json(*c);
    return nlohmann::json{{"plan", nullptr}, {"note", note}};
  };
  const SearchStats& s = r.stats;
  nlohmann::json evaluated = nlohmann::json::array();
  for (const auto& e : r.evaluated)
    evaluated.push_back({{"tokens_per_s", e.tokens_per_s},
                         {"iteration_time_s", e.iteration_time_s},
                         {"peak_memory_bytes", e.peak_memory_bytes},
                         {"origin", e.origin},
                         {"pareto", e.pareto},
                         {"description", e.description}});
  const bool all = s.candidates_evaluated <= kEvaluatedSampleCap;
  return {{"space", to_string(r.space)},
          {"scorer", r.scorer},
          {"scorer_note", r.scorer_note},
          {"memory_budget_bytes", r.memory_budget_bytes},
          {"best", to_json(r.best)},
          {"baselines",
           {{"megatron", baseline(r.megatron, r.megatron_note)},
            {"zero", baseline(r.zero, r.zero_note)}}},
          {"candidates", cands},
          {"candidates_evaluated", s.candidates_evaluated},
          {"evaluated_candidates",
           {{"evaluated", s.candidates_evaluated},
            {"recorded", r.evaluated.size()},
            {"sample_cap", kEvaluatedSampleCap},
            {"scored_by", "estimator"},
            {"sample", all ? "every plan scored (plans with identical figures once)"
                           : "a uniform sample of " + std::to_string(kEvaluatedSampleCap) +
                                 " plans (smallest hash of their figures) plus the Pareto front "
                                 "of tokens/s against peak memory"},
            {"plans", evaluated}}},
          {"search_time_s", s.search_time_s},
          {"stats",
           {{"plans_simulated", s.plans_simulated},
            {"configs", s.configs},
            {"configs_searched", s.configs_searched},
            {"configs_pruned", s.configs_pruned},
            {"configs_unfit", s.configs_unfit},
            {"layer_strategies_costed", s.layer_strategies_costed},
            {"layer_strategies_kept", s.layer_strategies_kept},
            {"dp_cells", s.dp_cells},
            {"bound_violations", s.bound_violations},
            {"processes", s.processes},
            {"estimate_phase_s", s.estimate_phase_s},
            {"rerank_phase_s", s.rerank_phase_s},
            {"rerank_overlapped_s", s.rerank_overlapped_s},
            {"plans_simulated_overlapped", s.plans_simulated_overlapped}}}};
}

}  // namespace stratagem
