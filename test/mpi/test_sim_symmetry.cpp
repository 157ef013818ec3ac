// Rank symmetry (sim/symmetry.hpp): simulating one representative per class of identical ranks
// gives the same iteration time and every rank's peak memory, accounting and op count as
// simulating every rank, on real Programs priced by the cost model: pipelines (gpipe, 1f1b,
// interleaved), tensor, sequence and data parallel, ZeRO 1-3 with offload, recompute, several
// iterations and a heterogeneous per-layer plan. Run alone and under mpirun (the symmetric run
// spread over the world against the full run on one process).
#define BOOST_TEST_MODULE sim_symmetry
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "stratagem/cost.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/simulate.hpp"
#include "test/support/sim_compare.hpp"

using namespace stratagem;
using test::same_rank_results;

namespace {

struct Case {
  std::string name, model, cluster;
  int nodes;
  PlanShorthand s;
  bool symmetric;  // expected mode
  int iterations = 1;
  void (*edit)(Plan&) = nullptr;  // per-layer changes after the shorthand
};

PlanShorthand sh(int tp, int pp, int dp, int mb, int gb, const char* sched = "1f1b") {
  PlanShorthand s;
  s.tp = tp, s.pp = pp, s.dp = dp, s.micro_batch = mb, s.global_batch = gb;
  s.schedule = std::string(sched);
  return s;
}

// Per-layer mixing (Galvatron / H3T): layers differ in tp/dp, ZeRO, recompute and offload.
void heterogeneous(Plan& p) {
  const int n = int(p.layers.size());
  for (int i = 0; i < n; ++i) {
    LayerStrategy& l = p.layers[i];
    if (i % 3 == 0) {
      l.tp = 4, l.dp = 2, l.sequence_parallel = true;
      l.recompute = Recompute::full;
    } else if (i % 3 == 1) {
      l.tp = 2, l.dp = 4, l.zero = 2;
      l.recompute = Recompute::selective;
    } else {
      l.tp = 1, l.dp = 8, l.zero = 3;
      l.offload_optimizer = true;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"1f1b tp2 pp2 dp4", "gpt2-124m", "dgx-a100-80g", 2, sh(2, 2, 4, 1, 16), true});
  v.push_back({"gpipe tp8 pp2", "gpt3-1.3b", "dgx-a100-80g", 2, sh(8, 2, 1, 1, 8, "gpipe"), true});
  {
    PlanShorthand s = sh(2, 4, 2, 1, 16, "interleaved");
    s.vpp = 3;
    v.push_back({"interleaved v3 tp2 pp4 dp2", "gpt2-124m", "dgx-a100-80g", 2, s, true});
  }
  {
    PlanShorthand s = sh(1, 1, 16, 1, 32);
    s.zero = 3;
    s.offload = std::string("optimizer,params");
    v.push_back({"zero3 offload dp16", "gpt2-124m", "dgx-a100-80g", 2, s, true});
  }
  {
    PlanShorthand s = sh(4, 2, 4, 2, 32);
    s.zero = 1;
    s.sequence_parallel = true;
    s.recompute = std::string("selective");
    v.push_back({"tp4 sp pp2 dp4 zero1, 2 iterations", "gpt2-350m", "dgx-a100-80g", 4, s, true, 2});
  }
  {
    PlanShorthand s = sh(2, 2, 4, 1, 16);
    s.zero = 2;
    v.push_back({"llama gqa tp2 pp2 dp4 zero2", "llama2-7b", "dgx-h100", 2, s, true});
  }
  // Two stages per node: the node's NIC carries both stages' flows.
  v.push_back(
      {"2 stages per node pp4 dp2", "gpt2-124m", "dgx-a100-80g", 1, sh(1, 4, 2, 1, 8), true});
  {
    Case c{"heterogeneous per layer pp2", "gpt2-124m", "dgx-a100-80g", 2, sh(4, 2, 2, 1, 16), true};
    c.edit = heterogeneous;
    v.push_back(c);
  }
  {
    PlanShorthand s = sh(8, 4, 8, 1, 64);
    s.zero = 1;
    v.push_back({"gpt3-13b tp8 pp4 dp8 (32 nodes)", "gpt3-13b", "dgx-a100-80g", 32, s, true});
  }
  // 6-GPU stages straddle 8-GPU nodes differently: no symmetry, every rank is simulated.
  v.push_back({"stages straddle nodes", "gpt2-124m", "dgx-a100-80g", 3, sh(2, 4, 3, 1, 12, "gpipe"),
               false});
  return v;
}

}  // namespace

using test::MpiWorld;
BOOST_TEST_GLOBAL_FIXTURE(MpiWorld);

BOOST_AUTO_TEST_CASE(symmetric_equals_full) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int reduced = 0;
  for (const Case& k : cases()) {
    BOOST_TEST_CONTEXT(k.name) {
      const ModelSpec m = load_model(k.model);
      ClusterSpec c = load_cluster(k.cluster);
      c.nodes = k.nodes;
      Plan p = expand_shorthand(k.s, m, c);
      if (k.edit) k.edit(p);
      validate(p, m, c, "test");
      const Layout L(p, c);
      const Program prog = build_program(m, p);
      const CostModel cost(m, c, p.dtype);
      const CostModelCosts costs(cost, p);
      SimOptions o;
      o.iterations = k.iterations;
      o.full = true;
      const SimResult full = simulate(prog, L, c, costs, o);
      o.full = false;
      o.comm = world > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL;
      const SimResult sym = simulate(prog, L, c, costs, o);
      BOOST_TEST(!full.stats.symmetric);
      BOOST_TEST(sym.stats.symmetric == k.symmetric);
      BOOST_TEST(!full.deadlock.deadlocked);
      BOOST_TEST(!sym.deadlock.deadlocked);
      reduced += sym.stats.symmetric && sym.stats.simulated_ranks < L.world_size();
      // Integer nanoseconds: equal, hence equal to 1e-9 relative.
      BOOST_TEST(sym.makespan_ns == full.makespan_ns);
      BOOST_TEST(sym.oom.oom == full.oom.oom);
      if (test::world_rank() == 0) {
        BOOST_TEST(sym.stats.ops_executed == full.stats.ops_executed);
        BOOST_REQUIRE(sym.ranks.size() == full.ranks.size());
        for (size_t i = 0; i < full.ranks.size(); ++i)
          same_rank_results(sym.ranks[i], full.ranks[i]);
        const auto js = to_json(sym, m, c, p, prog), jf = to_json(full, m, c, p, prog);
        BOOST_TEST(js["mode"] == (k.symmetric ? "symmetric" : "full"));
        BOOST_TEST(jf["mode"] == "full");
        BOOST_TEST(js["iteration_time_s"] == jf["iteration_time_s"]);
        BOOST_TEST(js["per_rank"] == jf["per_rank"]);
        BOOST_TEST(js["time_breakdown_s"] == jf["time_breakdown_s"]);
      }
    }
  }
  BOOST_TEST(reduced >= 9);
}
