// The parallel engine (run under mpirun -np 2..4): every configuration is simulated once on this
// process alone and once spread over MPI_COMM_WORLD; the two must agree bit for bit. Covers
// transfers sharing a NIC whose GPUs live in different processes, collectives spanning
// processes, several iterations, zero-latency links (no lookahead), and deadlocks.
#define BOOST_TEST_MODULE sim_pdes
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <cstring>
#include <functional>

#include "stratagem/cost.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/simulate.hpp"
#include "test/support/sim_compare.hpp"

using namespace stratagem;

namespace {

using test::MpiWorld;
int me() {
  return test::world_rank();
}

struct Injected : OpCosts {
  std::function<double(const Op&)> compute = [](const Op&) { return 0.0; };
  std::function<CommCost(const Op&)> comm = [](const Op&) { return CommCost{}; };
  double compute_time_s(const Op& op) const override { return compute(op); }
  CommCost comm_cost(const Op& op, const Layout&, int) const override { return comm(op); }
};

CommCost inter(double lat, double bytes, double gbps) {
  CommCost cc;
  cc.latency_s = lat;
  cc.link_bytes = bytes;
  cc.bandwidth_gbps = gbps;
  cc.link = LinkClass::inter_node;
  return cc;
}

ClusterSpec cluster(int gpn, int nodes) {
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.node.gpus_per_node = gpn;
  c.nodes = nodes;
  c.node.nic_count = 1;
  c.node.nic.bandwidth_gbps = 25;
  c.node.nic.bus_efficiency = 1.0;
  return c;
}

Plan plan(const ModelSpec& m, const ClusterSpec& c, int tp, int pp, int dp, int gb,
          const char* sched = "1f1b") {
  PlanShorthand s;
  s.tp = tp, s.pp = pp, s.dp = dp, s.micro_batch = 1, s.global_batch = gb;
  s.schedule = std::string(sched);
  Plan p = expand_shorthand(s, m, c);
  validate(p, m, c, "test");
  return p;
}

ModelSpec tiny(int layers) {
  ModelSpec m;
  m.name = "tiny";
  m.layers = layers, m.hidden = 64, m.heads = 2, m.kv_heads = 2, m.ffn_hidden = 256, m.vocab = 128;
  m.seq_len = 32;
  return m;
}

void same(const SimRankResult& a, const SimRankResult& b) {
  test::same_rank_results(a, b);
}

// Simulates alone and over the world, every rank (full) and one per class of symmetric ranks;
// compares on every process (makespan) and on process 0 (every rank's results).
SimResult compare(const Program& prog, const Layout& L, const ClusterSpec& c, const OpCosts& costs,
                  SimOptions o = {}) {
  SimResult first, par;
  for (bool full : {true, false}) {
    o.full = full;
    o.comm = MPI_COMM_NULL;
    const SimResult alone = simulate(prog, L, c, costs, o);
    o.comm = MPI_COMM_WORLD;
    par = simulate(prog, L, c, costs, o);
    BOOST_TEST(par.makespan_ns == alone.makespan_ns);
    BOOST_TEST(par.deadlock.deadlocked == alone.deadlock.deadlocked);
    BOOST_TEST(par.oom.oom == alone.oom.oom);
    if (full) first = par;
    BOOST_TEST(par.makespan_ns == first.makespan_ns);
    if (me() == 0) {
      BOOST_TEST(par.ranks.size() == alone.ranks.size());
      for (size_t i = 0; i < std::min(par.ranks.size(), alone.ranks.size()); ++i) {
        same(par.ranks[i], alone.ranks[i]);
        if (i < first.ranks.size()) same(par.ranks[i], first.ranks[i]);
      }
      BOOST_TEST(par.stats.ops_executed == alone.stats.ops_executed);
      BOOST_TEST(par.deadlock.ranks == alone.deadlock.ranks);
    }
  }
  return par;
}

uint32_t add(StageProgram& sp, Op op, std::vector<uint32_t> deps = {}) {
  op.dep_begin = uint32_t(sp.deps.size());
  for (uint32_t d : deps) sp.deps.push_back(d);
  op.dep_count = uint32_t(deps.size());
  sp.ops.push_back(op);
  return uint32_t(sp.ops.size() - 1);
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(MpiWorld);

BOOST_AUTO_TEST_CASE(real_programs_with_the_cost_model) {
  const ModelSpec m = load_model("gpt2-124m");
  for (int nodes : {1, 3}) {
    ClusterSpec c = load_cluster("dgx-a100-80g");
    c.nodes = nodes;
    // With 3 nodes the 6-GPU stages straddle nodes (NICs shared by processes).
    const Plan p = nodes == 1 ? plan(m, c, 2, 2, 2, 8) : plan(m, c, 2, 4, 3, 12, "gpipe");
    const Layout L(p, c);
    const CostModel cost(m, c, p.dtype);
    SimOptions o;
    o.iterations = 2;
    BOOST_TEST_CONTEXT("nodes " << nodes) {
      compare(build_program(m, p), L, c, CostModelCosts(cost, p), o);
    }
  }
}

BOOST_AUTO_TEST_CASE(transfers_sharing_a_nic_across_processes) {
  // 4 GPUs per node, stage 0 = node 0: with 3 or 4 processes its GPUs live in different ones.
  const ModelSpec m = tiny(2);
  const ClusterSpec c = cluster(4, 2);
  const Plan p = plan(m, c, 1, 2, 4, 4);
  const Layout L(p, c);
  Injected costs;
  costs.comm = [](const Op&) { return inter(6e-6, 12.5e6, 12.5); };
  costs.compute = [](const Op&) { return 200e-6; };
  Program prog;
  prog.stages.resize(2);
  for (int s = 0; s < 2; ++s) {
    Op comp;
    comp.kind = OpKind::compute;
    const uint32_t c0 = add(prog.stages[s], comp);
    Op ar;
    ar.kind = OpKind::collective;
    ar.stream = Stream::dp_comm;
    ar.collective = Collective::all_reduce;
    ar.group = GroupKind::tied_embedding;
    ar.bytes = 1000;
    add(prog.stages[s], ar, s == 0 ? std::vector<uint32_t>{} : std::vector<uint32_t>{c0});
    Op pp;
    pp.kind = s == 0 ? OpKind::send : OpKind::recv;
    pp.stream = Stream::pp_comm;
    pp.group = s == 0 ? GroupKind::pp_next : GroupKind::pp_prev;
    add(prog.stages[s], pp, {c0});
    add(prog.stages[s], comp, {c0});
  }
  SimOptions o;
  o.interference = 1.15;
  const SimResult r = compare(prog, L, c, costs, o);
  BOOST_TEST(!r.deadlock.deadlocked);
}

BOOST_AUTO_TEST_CASE(textbook_pipeline_over_processes) {
  const ModelSpec m = tiny(4);
  const ClusterSpec c = cluster(2, 2);
  for (const char* sched : {"gpipe", "1f1b"}) {
    const Plan p = plan(m, c, 1, 4, 1, 8, sched);
    const Layout L(p, c);
    Injected costs;
    costs.compute = [](const Op& op) {
      return op.block != Block::attention ? 0.0 : op.phase == Phase::forward ? 1e-3 : 2e-3;
    };
    costs.comm = [](const Op& op) { return inter(5e-6, double(op.bytes), 25); };
    const SimResult r = compare(build_program(m, p), L, c, costs);
    BOOST_TEST(r.makespan_ns >= (8 + 4 - 1) * 3000000);
  }
}

BOOST_AUTO_TEST_CASE(zero_latency_falls_back_and_agrees) {
  const ModelSpec m = tiny(2);
  const ClusterSpec c = cluster(2, 1);
  const Plan p = plan(m, c, 1, 2, 1, 4);
  const Layout L(p, c);
  Injected costs;
  costs.compute = [](const Op& op) { return op.block == Block::attention ? 1e-3 : 0.0; };
  const SimResult r = compare(build_program(m, p), L, c, costs);
  BOOST_TEST(r.makespan_ns == (4 + 1) * 2000000);
}

BOOST_AUTO_TEST_CASE(deadlock_is_detected_by_every_process) {
  const ModelSpec m = tiny(2);
  const ClusterSpec c = cluster(2, 2);
  const Plan p = plan(m, c, 1, 2, 2, 2);
  const Layout L(p, c);
  Injected costs;
  costs.comm = [](const Op&) { return inter(5e-6, 1e3, 25); };
  Program prog;
  prog.stages.resize(2);
  for (int s = 0; s < 2; ++s) {
    Op recv;
    recv.kind = OpKind::recv;
    recv.stream = Stream::pp_comm;
    recv.group = s == 0 ? GroupKind::pp_next : GroupKind::pp_prev;
    const uint32_t r0 = add(prog.stages[s], recv);
    Op send = recv;
    send.kind = OpKind::send;
    add(prog.stages[s], send, {r0});
  }
  const SimResult r = compare(prog, L, c, costs);
  BOOST_TEST(r.deadlock.deadlocked);
  if (me() == 0) {
    BOOST_TEST(r.deadlock.ranks == std::vector<int>({0, 1, 2, 3}));
    BOOST_TEST(r.deadlock.message.find("rank 0 (stage 0)") != std::string::npos,
               r.deadlock.message);
  }
}
