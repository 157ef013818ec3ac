// The search's building blocks against brute force: the stage DP over layers x memory buckets x
// strategies finds the optimum of its model (every sequence of layer strategies enumerated), on
// small models (4-6 layers) and stages of 4-8 GPUs with real per-layer costs; dominance pruning
// loses no optimum; the partition solver is exact; the per-layer costs add up to the
// estimator's stage figures.
#define BOOST_TEST_MODULE search_dp
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <random>

#include "src/search/layer_costs.hpp"
#include "src/search/stage_dp.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/loaders.hpp"
#include "test/support/small_models.hpp"

using namespace stratagem;
using namespace stratagem::search_detail;
namespace tt = boost::test_tools;

namespace {

ModelSpec small_model(int layers) {
  return test::small_model(layers, 1024);
}
using test::cluster;

struct Case {
  int layers, gpus_per_node, nodes, D, Bm, M;
  double k;
};

// The pruned layer costs of stage 0 of a stage of D devices, as the search builds them.
std::vector<LayerCost> stage_costs(const CostTables& t, const ModelSpec& m, const ClusterSpec& c,
                                   int D, int Bm, bool prune = true) {
  Geometry geo;
  geo.gpus_per_node = c.node.gpus_per_node;
  geo.devices_per_stage = D;
  std::vector<LayerCost> out;
  for (const auto& st : layer_candidates(m, c, D, Bm, SpaceFilter{}))
    out.push_back(t.layer(st, Bm / st.dp, geo.tp_nodes(0, st.tp), geo.dp_nodes(0, st.tp)));
  return prune ? prune_dominated(std::move(out)) : out;
}

// Budgets from "nothing fits" to "everything fits" for n layers.
std::vector<int64_t> budgets_for(const StageDpProblem& p, int n) {
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& it : p.items) {
    lo = std::min(lo, it.w * p.bucket_bytes + it.tr + it.ws);
    hi = std::max(hi, it.w * p.bucket_bytes + it.tr + it.ws);
  }
  std::vector<int64_t> out;
  for (int i = 0; i <= 10; ++i) out.push_back(int64_t(n * (lo + (hi - lo) * i / 10.0)) + i * 12345);
  out.push_back(int64_t(n) * lo / 2);
  return out;
}

// The model cost of a sequence of item ids (kInf when it does not fit).
double model_cost(const StageDpProblem& p, const std::vector<int64_t>& levels,
                  const std::vector<int>& ids, int64_t budget, int64_t xtr, int64_t xws,
                  const std::vector<double>* entry) {
  std::vector<int> idx;
  for (int id : ids)
    for (int i = 0; i < int(p.items.size()); ++i)
      if (p.items[i].id == id) idx.push_back(i);
  BOOST_TEST_REQUIRE(idx.size() == ids.size());
  return stage_model_cost(p, levels, idx, budget, xtr, xws, entry);
}

bool close(double a, double b) {
  if (a == kInf || b == kInf) return a == b;
  return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b));
}

}  // namespace

BOOST_AUTO_TEST_CASE(stage_dp_equals_brute_force) {
  // 4-6 layers, stages of 4 and 8 GPUs (one and two nodes), several micro-batch shapes.
  const Case cases[] = {
      {4, 4, 1, 4, 8, 4, 2.0},  {4, 8, 1, 8, 8, 2, 1.0},  {6, 4, 1, 4, 4, 8, 3.0},
      {5, 4, 2, 8, 16, 2, 1.5}, {6, 8, 1, 8, 16, 4, 4.0},
  };
  int compared = 0, feasible = 0;
  for (const Case& cs : cases) {
    const ModelSpec m = small_model(cs.layers);
    const ClusterSpec c = cluster(cs.gpus_per_node, cs.nodes);
    CostTables t(m, c, Dtype::bf16, false, true);
    const auto costs = stage_costs(t, m, c, cs.D, cs.Bm);
    BOOST_TEST_REQUIRE(!costs.empty());
    const int64_t bucket = 64LL << 20;
    StageDpProblem full =
        stage_problem(t, costs, cs.M, cs.k, cs.layers, bucket, 80LL << 30, 3, 1, true);
    for (int n = 1; n <= cs.layers; ++n) {
      // Brute force enumerates S^n sequences: take a subset of the items for long stages.
      StageDpProblem p = full;
      const size_t cap = n <= 3 ? 40 : n == 4 ? 14 : 8;
      if (p.items.size() > cap) {
        // Spread over the list so that every class keeps members.
        std::vector<DpItem> sub;
        for (size_t i = 0; i < cap; ++i) sub.push_back(p.items[i * p.items.size() / cap]);
        p.items = sub;
      }
      p.n_max = n;
      StageDp dp(p);
      StageDpProblem merged = p;
      merged.exact = false;
      merged.max_tr_classes = 2;
      StageDp dp_merged(merged);
      for (int64_t budget : budgets_for(p, n)) {
        for (int64_t xtr : {int64_t(0), int64_t(300) << 20}) {
          const int64_t xws = xtr / 3;
          // Entry costs per class (as the reshard from an embedding), on every other query.
          std::vector<double> entry_v;
          for (int k = 0; k < p.num_classes; ++k) entry_v.push_back(1e-3 * ((k * 7) % 3));
          const std::vector<double>* entry = xtr ? &entry_v : nullptr;
          std::vector<int> seq;
          const auto& levels = dp.levels();
          const double bf = brute_force_stage(p, levels, n, budget, xtr, xws, entry, &seq);
          const auto a = dp.best(n, budget, xtr, xws, entry);
          BOOST_TEST_INFO("layers " << cs.layers << " D " << cs.D << " n " << n << " budget "
                                    << budget);
          BOOST_TEST(close(a.cost, bf), "DP " << a.cost << " vs brute force " << bf);
          ++compared;
          if (bf == kInf) continue;
          ++feasible;
          // The DP's sequence has the cost it claims and fits.
          const auto ids = dp.reconstruct(n, a);
          BOOST_TEST_REQUIRE(int(ids.size()) == n);
          BOOST_TEST(close(model_cost(p, levels, ids, budget, xtr, xws, entry), a.cost));
          // Merged memory classes are conservative: never better, always fitting.
          const auto b = dp_merged.best(n, budget, xtr, xws, entry);
          BOOST_TEST(b.cost >= bf * (1 - 1e-12));
          if (b.cost < kInf)
            BOOST_TEST(model_cost(p, levels, dp_merged.reconstruct(n, b), budget, xtr, xws, entry) <
                       kInf);
        }
      }
    }
  }
  BOOST_TEST_MESSAGE("stage DP vs brute force: " << compared << " queries, " << feasible
                                                 << " feasible");
  BOOST_TEST(feasible > 50);
}

BOOST_AUTO_TEST_CASE(dominance_pruning_keeps_the_optimum) {
  // Brute force over every raw layer strategy against brute force over the pruned ones.
  const ModelSpec m = small_model(4);
  const ClusterSpec c = cluster(4, 1);
  CostTables t(m, c, Dtype::bf16, false, true);
  const auto raw = stage_costs(t, m, c, 4, 8, false);
  const auto pruned = stage_costs(t, m, c, 4, 8, true);
  BOOST_TEST_MESSAGE("layer strategies: " << raw.size() << " raw, " << pruned.size()
                                          << " after pruning");
  BOOST_TEST(pruned.size() < raw.size());
  const int64_t bucket = 64LL << 20;
  for (double k : {1.0, 3.0}) {
    StageDpProblem pr = stage_problem(t, raw, 4, k, 2, bucket, 80LL << 30, 3, 1, true);
    StageDpProblem pp = stage_problem(t, pruned, 4, k, 2, bucket, 80LL << 30, 3, 1, true);
    // No per-(M,k) pruning on the raw side: every strategy is an item.
    pr.items.clear();
    for (int i = 0; i < int(raw.size()); ++i) {
      const auto& lc = raw[i];
      DpItem d;
      d.id = i;
      d.cls = 0;
      for (const auto& x : pp.items)
        if (pruned[x.id].st.stream_tp() == lc.st.stream_tp()) d.cls = x.cls;
      d.cost = 4 * lc.step_s() + lc.tail_s;
      d.first = 4 * lc.fetch_s + lc.reduce_s;
      d.last = 4 * (lc.fetch_s + lc.act_h2d_s);
      d.w = int64_t(std::ceil((double(lc.states) + k * double(lc.kept)) / double(bucket)));
      d.tr = lc.transient;
      d.kept = lc.kept;
      d.ws = lc.workspace;
      pr.items.push_back(d);
    }
    for (int n = 1; n <= 2; ++n)
      for (int64_t budget : budgets_for(pp, n)) {
        // One set of cover levels for both: those of the raw items.
        const std::vector<int64_t> levels = StageDp(pr).levels();
        const double a = brute_force_stage(pr, levels, n, budget, 0, 0);
        const double b = brute_force_stage(pp, levels, n, budget, 0, 0);
        BOOST_TEST(close(a, b),
                   "raw " << a << " vs pruned " << b << " n " << n << " budget " << budget);
      }
  }
}

BOOST_AUTO_TEST_CASE(partition_solver_is_exact) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(1.0, 10.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int S = 1 + trial % 4, L = S + int(rng() % 6), n_min = 1 + (trial % 7 == 0);
    const double bw = (trial % 3) / 4.0;
    std::vector<std::vector<double>> T(S, std::vector<double>(L + 1, kInf));
    for (auto& row : T) {
      double acc = 0;
      for (int n = 1; n <= L; ++n) {
        acc += u(rng);
        row[n] = (rng() % 9 == 0) ? kInf : acc;  // costs grow with n; some do not fit
      }
    }
    double best = kInf;
    std::vector<int> part(S, 0);
    std::function<void(int, int)> rec = [&](int s, int left) {
      if (s == S) {
        if (left) return;
        double mx = 0, sum = 0;
        for (int i = 0; i < S; ++i) {
          if (T[i][part[i]] == kInf) return;
          mx = std::max(mx, T[i][part[i]]);
          sum += T[i][part[i]];
        }
        best = std::min(best, mx + bw * (sum - mx));
        return;
      }
      for (int n = n_min; n <= left; ++n) part[s] = n, rec(s + 1, left - n);
    };
    rec(0, L);
    double obj = kInf;
    const auto got = solve_partition(T, L, n_min, bw, &obj);
    BOOST_TEST_INFO("trial " << trial);
    BOOST_TEST(close(obj, best));
    if (best < kInf) {
      BOOST_TEST_REQUIRE(int(got.size()) == S);
      int total = 0;
      for (int n : got) {
        total += n;
        BOOST_TEST(n >= n_min);
      }
      BOOST_TEST(total == L);
    } else {
      BOOST_TEST(got.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(layer_costs_add_up_to_the_estimator) {
  // A uniform plan on one stage: the estimator's micro-batch time is the layers' busy time plus
  // the embedding and head (side streams hidden), and its model states are the layers' plus the
  // embedding's; the search's per-layer figures must add up to it.
  const ModelSpec m = small_model(4);
  const ClusterSpec c = cluster(8, 1);
  for (const char* name : {"stratagem", "fsdp-eager", "megatron-core"})
    for (int tp : {1, 2, 8})
      for (int z : {0, 1}) {
        // (A framework's facts reach both through the one CostModel.)
        const FrameworkSpec fw = load_framework(name);
        CostTables t(m, c, Dtype::bf16, false, true, fw);
        PlanShorthand sh;
        sh.tp = tp, sh.pp = 1, sh.micro_batch = 2, sh.global_batch = 16 * 8 / tp;
        sh.zero = tp == 8 ? 0 : z;
        sh.recompute = "selective";
        sh.sequence_parallel = tp > 1;
        Plan p = expand_shorthand(sh, m, c);
        validate(p, m, c, "test");
        CostModel cm(m, c, p.dtype, fw);
        const Estimate e = estimate(cm, p);
        const LayerStrategy& l = p.layers[0];
        const LayerCost lc = t.layer(l, 2, 1, 1);
        const EmbeddingCost ec = t.embedding(p.embedding, 2, cost_detail::Geometry{8, 8}, 1);
        const double expect = m.layers * lc.busy_s + ec.first_busy_s + ec.last_busy_s;
        BOOST_TEST_INFO(name << " tp " << tp << " zero " << z);
        BOOST_TEST(e.stages[0].time_per_microbatch_s == expect, tt::tolerance(1e-9));
        const MemoryBreakdown& mb = e.stages[0].memory;
        BOOST_TEST(mb.weights_bytes + mb.grads_bytes + mb.optimizer_bytes ==
                   m.layers * lc.states + ec.only_states);
      }
}
