// The strategy search, end to end. On small cases (4-6 layers, 4-8 GPUs, several memory
// budgets): its best plan is never worse than the best plan of the megatron or the zero space
// under the same scorer (the simulator), and, ranked by the estimator, it equals the best plan
// found by exhaustive enumeration of the whole (narrowed) space. Its plans load and validate,
// and `stratagem search` handles bad input with the promised exit codes.
#define BOOST_TEST_MODULE search
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/search.hpp"
#include "stratagem/spec_json.hpp"
#include "test/support/run.hpp"
#include "test/support/small_models.hpp"

using namespace stratagem;

namespace {

ModelSpec small_model(int layers) {
  return test::small_model(layers, 2048);
}
using test::cluster;

struct Case {
  const char* name;
  int layers, gpus_per_node, nodes, global_batch;
  std::vector<int> tp, pp, micro_batches;
  std::vector<Recompute> recompute;
  std::vector<Schedule> schedules;
  std::vector<double> budgets_gib;
};

// The narrowed space: small enough to enumerate every plan.
SearchOptions options_for(const Case& c, double budget_gib) {
  SearchOptions o;
  o.global_batch = c.global_batch;
  o.memory_budget_bytes = static_cast<int64_t>(budget_gib * double(1LL << 30));
  o.tp_degrees = c.tp;
  o.pp_degrees = c.pp;
  o.micro_batches = c.micro_batches;
  o.recompute = c.recompute;
  o.schedules = c.schedules;
  o.zero_stages = {0, 3};
  o.sequence_parallel_off = false;
  o.offload = false;
  o.vpp_degrees = {2};
  o.top_k = 4;
  o.zero_stages = {0, 3};
  return o;
}

// Budgets from "barely anything fits" (the least reachable is about 2.7 GiB) to loose.
const std::vector<Case>& cases() {
  static const std::vector<Case> cs = {
      {"4 layers, 4 GPUs",
       4,
       4,
       1,
       16,
       {1, 2, 4},
       {},
       {},
       {Recompute::none, Recompute::full},
       {Schedule::one_f_one_b, Schedule::interleaved},
       {2.8, 4, 8, 40}},
      {"4 layers, 8 GPUs",
       4,
       8,
       1,
       32,
       {1, 2, 8},
       {1, 2},
       {},
       {Recompute::none, Recompute::full},
       {Schedule::one_f_one_b},
       {3, 6}},
      {"6 layers, 4 GPUs on 2 nodes",
       6,
       2,
       2,
       16,
       {1},
       {},
       {4, 8, 16},
       {Recompute::none, Recompute::full},
       {Schedule::one_f_one_b, Schedule::gpipe},
       {3, 5, 8}},
  };
  return cs;
}

double exhaustive_best(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o,
                       int64_t* count, std::string* best_plan) {
  double best = INFINITY;
  const int64_t budget = o.memory_budget_bytes;
  for_each_plan(m, c, o, [&](const Plan& p) {
    ++*count;
    CostModel cm(m, c, p.dtype);
    const Estimate e = estimate(cm, p);
    if (e.peak_memory_bytes <= budget && e.iteration_time_s < best) {
      best = e.iteration_time_s;
      *best_plan = p.describe();
    }
  });
  return best;
}

}  // namespace

BOOST_AUTO_TEST_CASE(best_plan_beats_the_baselines_and_matches_exhaustive_enumeration) {
  int compared_megatron = 0, compared_zero = 0, exhaustive = 0, exact = 0;
  double worst_gap = 0;
  for (const Case& cs : cases()) {
    const ModelSpec m = small_model(cs.layers);
    const ClusterSpec c = cluster(cs.gpus_per_node, cs.nodes);
    for (double gib : cs.budgets_gib) {
      BOOST_TEST_CONTEXT(cs.name << ", budget " << gib << " GiB") {
        SearchOptions o = options_for(cs, gib);
        // Exhaustive enumeration of the whole space, scored by the estimator.
        int64_t count = 0;
        std::string where;
        const double truth = exhaustive_best(m, c, o, &count, &where);
        // The search, ranked by the estimator alone.
        SearchOptions oe = o;
        oe.rerank_with_simulator = false;
        std::optional<SearchResult> est;
        try {
          est = search(m, c, oe);
        } catch (const NoFeasiblePlan&) {
        }
        BOOST_TEST(bool(est) == std::isfinite(truth),
                   "feasibility differs from exhaustive enumeration");
        if (!est) continue;
        const double got = est->best.est_iteration_time_s;
        BOOST_TEST_MESSAGE(cs.name << ", " << gib << " GiB: " << count << " plans enumerated, best "
                                   << truth << " s (" << where << "); search " << got << " s ("
                                   << est->best.plan.describe() << ") after "
                                   << est->stats.candidates_evaluated << " plans");
        // The DP is exact for its memory model, which rounds each layer up to a bucket (64 MiB
        // or budget/1024) and bounds transient peaks from above; build() widens a stage's
        // budget by the room the estimator finds, but only once a plan of that configuration
        // fits the DP's model. A configuration whose optimum sits within that rounding of the
        // budget can be missed. Since the runtime's scratch is modelled as what it is
        // (layer_workspace_bytes: the backward kernels' scratch, five token-stream tensors, the
        // ZeRO received shard) rather than 2 x b x s x h, more optima sit near these tight
        // budgets: worst case measured 1.9% (4 layers, 4 GPUs, 2.8 GiB), exact in 2 of 8.
        // Every case must come within 2%.
        const double gap = got / truth - 1;
        BOOST_TEST(gap <= 0.02, "search " << got << " s vs exhaustive " << truth << " s");
        BOOST_TEST(gap >= -1e-9, "search beats exhaustive enumeration: the space differs");
        worst_gap = std::max(worst_gap, gap);
        exact += gap <= 1e-9;
        ++exhaustive;

        // The same scorer for all three spaces: the simulator.
        const SearchResult full = search(m, c, o);
        BOOST_TEST(full.scorer == "simulator");
        for (SearchSpace sp : {SearchSpace::megatron, SearchSpace::zero}) {
          SearchOptions ob = o;
          ob.space = sp;
          try {
            const SearchResult base = search(m, c, ob);
            BOOST_TEST(base.scorer == full.scorer);
            BOOST_TEST(full.best.tokens_per_s() >= base.best.tokens_per_s(),
                       to_string(sp)
                           << " " << base.best.tokens_per_s() << " tokens/s beats the search's "
                           << full.best.tokens_per_s());
            // The full search reports the same baseline.
            const auto& reported = sp == SearchSpace::megatron ? full.megatron : full.zero;
            BOOST_TEST_REQUIRE(bool(reported));
            BOOST_TEST(reported->key == base.best.key);
            (sp == SearchSpace::megatron ? compared_megatron : compared_zero)++;
          } catch (const NoFeasiblePlan&) {
            const auto& reported = sp == SearchSpace::megatron ? full.megatron : full.zero;
            BOOST_TEST(!reported);
          }
        }
        // The best plan is a valid plan, and survives its JSON.
        validate(full.best.plan, m, c, "search");
        const Plan back = plan_from_json(to_json(full.best.plan), m, "round trip");
        validate(back, m, c, "round trip");
        BOOST_TEST(to_json(back).dump() == full.best.key);
        BOOST_TEST(full.best.peak_memory_bytes() <= o.memory_budget_bytes);
      }
    }
  }
  BOOST_TEST_MESSAGE("exhaustive checks: " << exhaustive << ", exact " << exact << ", worst gap "
                                           << 100 * worst_gap << "%");
  BOOST_TEST(exhaustive >= 8);
  BOOST_TEST(compared_megatron >= 4);
  BOOST_TEST(compared_zero >= 2);
}

BOOST_AUTO_TEST_CASE(search_is_deterministic) {
  // The same inputs give the same plans (test/search/np2_equals_np1.sh checks -np 2 vs -np 1).
  const Case& cs = cases()[0];
  const ModelSpec m = small_model(cs.layers);
  const ClusterSpec c = cluster(cs.gpus_per_node, cs.nodes);
  SearchOptions o = options_for(cs, 4);
  o.rerank_with_simulator = false;
  const SearchResult a = search(m, c, o);
  const SearchResult b = search(m, c, o);
  BOOST_TEST(a.best.key == b.best.key);
  BOOST_TEST(a.ranked.size() == b.ranked.size());
}

// The configurations the lower bound skips could not have entered the top K: searching every
// configuration gives the same ranked list (keys and figures), and no plan of any configuration
// scores below its configuration's bound (bound_violations counts those). Small cases of the
// narrowed spaces above and of the whole space (offload, sequence parallelism, interleaving,
// pipelines across nodes), from tight to loose budgets.
BOOST_AUTO_TEST_CASE(pruning_by_the_bound_changes_no_answer) {
  struct Run {
    std::string name;
    ModelSpec m;
    ClusterSpec c;
    SearchOptions o;
  };
  std::vector<Run> runs;
  for (const Case& cs : cases())
    for (double gib : cs.budgets_gib)
      runs.push_back({std::string(cs.name) + ", " + std::to_string(gib) + " GiB",
                      small_model(cs.layers), cluster(cs.gpus_per_node, cs.nodes),
                      options_for(cs, gib)});
  struct Whole {
    int layers, gpus_per_node, nodes, global_batch;
    double gib;
  };
  for (const Whole& w : {Whole{8, 8, 1, 64, 4}, Whole{8, 8, 1, 64, 6}, Whole{8, 8, 1, 64, 16},
                         Whole{8, 4, 2, 32, 3}, Whole{8, 4, 2, 32, 5}, Whole{12, 2, 4, 32, 4}}) {
    SearchOptions o;
    o.global_batch = w.global_batch;
    o.memory_budget_bytes = static_cast<int64_t>(w.gib * double(1LL << 30));
    o.top_k = 4;
    runs.push_back({std::to_string(w.layers) + " layers, " + std::to_string(w.nodes) + " x " +
                        std::to_string(w.gpus_per_node) + " GPUs, " + std::to_string(w.gib) +
                        " GiB, whole space",
                    small_model(w.layers), cluster(w.gpus_per_node, w.nodes), o});
  }
  int64_t pruned = 0, configs = 0, compared = 0;
  for (Run& run : runs) {
    BOOST_TEST_CONTEXT(run.name) {
      run.o.rerank_with_simulator = false;
      auto ranked = [&](bool prune, SearchStats* stats) {
        SearchOptions o = run.o;
        o.prune_configurations = prune;
        std::vector<std::string> out;
        try {
          const SearchResult r = search(run.m, run.c, o);
          *stats = r.stats;
          for (const auto& x : r.ranked) {
            char buf[64];
            std::snprintf(buf, sizeof buf, " %.17g %lld", x.est_iteration_time_s,
                          (long long)x.est_peak_memory_bytes);
            out.push_back(x.key + buf);
          }
        } catch (const NoFeasiblePlan& e) {
          out.push_back(std::string("infeasible: ") + e.what());
        }
        return out;
      };
      SearchStats with{}, without{};
      const auto a = ranked(true, &with);
      const auto b = ranked(false, &without);
      BOOST_TEST(a == b, "pruning changed the ranked list");
      BOOST_TEST(without.bound_violations == 0, "a plan scored below its configuration's bound");
      BOOST_TEST(with.bound_violations == 0);
      BOOST_TEST(without.configs_searched == without.configs);
      BOOST_TEST(without.configs_pruned == 0);
      BOOST_TEST(with.configs_searched + with.configs_pruned + with.configs_unfit == with.configs);
      pruned += with.configs_pruned;
      configs += with.configs;
      ++compared;
    }
  }
  BOOST_TEST_MESSAGE(compared << " cases: " << pruned << " of " << configs
                              << " configurations pruned, same answers");
  // The check means something only if the bound prunes.
  BOOST_TEST(pruned > 0);
}

BOOST_AUTO_TEST_CASE(no_feasible_plan_reports_the_smallest) {
  const ModelSpec m = small_model(4);
  const ClusterSpec c = cluster(4, 1);
  SearchOptions o = options_for(cases()[0], 2.0);
  try {
    search(m, c, o);
    BOOST_FAIL("expected NoFeasiblePlan");
  } catch (const NoFeasiblePlan& e) {
    BOOST_TEST_REQUIRE(bool(e.smallest));
    BOOST_TEST(e.smallest->est_peak_memory_bytes > o.memory_budget_bytes);
    BOOST_TEST(std::string(e.what()).find("smallest peak memory") != std::string::npos);
    // Nothing in the space needs less (exhaustive).
    int64_t least = INT64_MAX;
    for_each_plan(m, c, o, [&](const Plan& p) {
      CostModel cm(m, c, p.dtype);
      least = std::min(least, estimate(cm, p).peak_memory_bytes);
    });
    BOOST_TEST_MESSAGE("smallest reachable " << e.smallest->est_peak_memory_bytes
                                             << " B, exhaustive " << least << " B");
    BOOST_TEST(double(e.smallest->est_peak_memory_bytes) <= 1.05 * double(least));
  }
}

BOOST_AUTO_TEST_CASE(contradictory_options_are_input_errors) {
  const ModelSpec m = small_model(4);
  ClusterSpec c = cluster(4, 1);
  SearchOptions o;
  o.global_batch = 8;
  o.memory_budget_bytes = c.gpu.hbm_bytes + 1;
  BOOST_CHECK_THROW(search(m, c, o), InputError);
  o.memory_budget_bytes = 0;
  o.global_batch = 0;
  BOOST_CHECK_THROW(search(m, c, o), InputError);
  // 64 GPUs, 4 layers: pp <= 4, tp <= 4, so dp >= 4; a batch of 3 divides no dp.
  c.nodes = 16;
  o.global_batch = 3;
  BOOST_CHECK_THROW(search(m, c, o), InputError);
}

// ---- the CLI ------------------------------------------------------------------------------

namespace {
nlohmann::json json_of(const std::string& out) {
  // Progress lines may precede the JSON object on the merged stream.
  const auto at = out.find("\n{");
  return nlohmann::json::parse(out[0] == '{' ? out : out.substr(at + 1));
}
std::string tmp(const char* name) {
  return "/tmp/stratagem-search-test-" + std::to_string(::getpid()) + "-" + name;
}
}  // namespace

BOOST_AUTO_TEST_CASE(cli_writes_a_plan_that_plan_check_accepts) {
  const std::string plan = tmp("plan.json");
  const std::string common = "--model gpt2-124m --cluster dgx-a100-80g --nodes 1";
  auto r = test::run("search " + common + " --global-batch 32 --top 3 --quiet --json -o " + plan);
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.output);
  const auto j = json_of(r.output);
  for (const char* k : {"best", "baselines", "candidates_evaluated", "search_time_s", "candidates"})
    BOOST_TEST(j.contains(k), k);
  for (const char* k : {"plan", "tokens_per_s", "peak_memory_bytes"})
    BOOST_TEST(j["best"].contains(k), k);
  BOOST_TEST(j["baselines"].contains("megatron"));
  BOOST_TEST(j["baselines"].contains("zero"));
  BOOST_TEST(j["candidates_evaluated"].get<int64_t>() > 0);
  BOOST_TEST(j["best"]["tokens_per_s"].get<double>() > 0);
  // The written plan is the best plan, loads with validation, and `plan check` accepts it.
  const ModelSpec m = load_model("gpt2-124m");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 1;
  const Plan p = load_plan(plan, m);
  validate(p, m, c, plan);
  BOOST_TEST(to_json(p) == j["best"]["plan"]);
  auto chk = test::run("plan check " + common + " --plan " + plan);
  BOOST_TEST(chk.exit_code == 0, chk.output);
  auto sim = test::run("simulate " + common + " --plan " + plan);
  BOOST_TEST(sim.exit_code == 0, sim.output);
  // The table: best, candidates, both baselines.
  auto t = test::run("search " + common + " --global-batch 32 --top 3 --quiet");
  BOOST_TEST_REQUIRE(t.exit_code == 0, t.output);
  for (const char* s :
       {"best:", "top candidates", "megatron", "zero-3", "candidate plans evaluated"})
    BOOST_TEST(t.output.find(s) != std::string::npos, s);
  std::remove(plan.c_str());
}

BOOST_AUTO_TEST_CASE(cli_bad_input_and_infeasible_budgets) {
  // A budget larger than the GPU.
  auto r = test::run(
      "search --model gpt2-124m --cluster dgx-a100-40g --nodes 1 --global-batch 8 "
      "--memory-budget-gib 60 --quiet");
  BOOST_TEST(r.exit_code == kExitBadInput, r.output);
  BOOST_TEST(r.output.find("exceeds") != std::string::npos, r.output);
  // A global batch that no dp divides (128 GPUs, 4 layers: dp >= 4).
  r = test::run(
      "search --layers 4 --hidden 256 --heads 4 --cluster dgx-a100-80g --nodes 16 --global-batch 2 "
      "--quiet");
  BOOST_TEST(r.exit_code == kExitBadInput, r.output);
  BOOST_TEST(r.output.find("not divisible by any data-parallel degree") != std::string::npos,
             r.output);
  // --space zero needs the batch divisible by every GPU.
  r = test::run(
      "search --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --global-batch 12 --space zero "
      "--quiet");
  BOOST_TEST(r.exit_code == kExitBadInput, r.output);
  // Missing --global-batch, unknown space.
  r = test::run("search --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --quiet");
  BOOST_TEST(r.exit_code == kExitBadInput, r.output);
  r = test::run("search --model gpt2-124m --nodes 1 --global-batch 8 --space everything --quiet");
  BOOST_TEST(r.exit_code == kExitBadInput, r.output);
  // Nothing fits: exit 3, with the smallest reachable peak and its plan.
  r = test::run(
      "search --model gpt3-175b --cluster dgx-a100-80g --nodes 1 --global-batch 8 "
      "--memory-budget-gib 20 --quiet --rerank estimator");
  BOOST_TEST(r.exit_code == kExitNoFeasiblePlan, r.output);
  BOOST_TEST(r.output.find("smallest peak memory reachable") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("pp") != std::string::npos, r.output);
  r = test::run(
      "search --model gpt3-175b --cluster dgx-a100-80g --nodes 1 --global-batch 8 "
      "--memory-budget-gib 20 --quiet --rerank estimator --json");
  BOOST_TEST(r.exit_code == kExitNoFeasiblePlan, r.output);
  const auto j = json_of(r.output);
  BOOST_TEST(j["feasible"] == false);
  BOOST_TEST(j["smallest_peak_memory_bytes"].get<int64_t>() > (int64_t(20) << 30));
}

// An MLA model's search keeps tp 1 (its attention is not split over tp yet) instead of
// stopping at the first tp > 1 plan: DeepSeek-V3 on 256 H800 nodes answers.
BOOST_AUTO_TEST_CASE(an_mla_model_is_searched_at_tp_1) {
  const test::RunResult r = test::run(
      "search --model deepseek-v3 --cluster hgx-h800 --nodes 256 --global-batch 15360 --quiet "
      "--rerank estimator --json");
  BOOST_TEST(r.exit_code == 0, r.output);
  const auto j = json_of(r.output);
  BOOST_TEST(!j["best"]["plan"]["layers"].empty());
  for (const auto& l : j["best"]["plan"]["layers"]) BOOST_TEST(l["tp"].get<int>() == 1);
}
