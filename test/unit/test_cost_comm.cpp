// Communication costs: alpha-beta collectives on the NVSwitch/NIC topology, hand-computed, and
// the bus bandwidths nccl-tests reports on DGX A100.
#define BOOST_TEST_MODULE cost_comm
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <ostream>
#include <set>

#include "stratagem/cost.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"

using namespace stratagem;

namespace stratagem {
std::ostream& operator<<(std::ostream& o, CollectiveAlgo a) {
  return o << to_string(a);
}
std::ostream& operator<<(std::ostream& o, LinkClass l) {
  return o << to_string(l);
}
}  // namespace stratagem

namespace {
struct Fixture {
  ModelSpec model = load_model("gpt3-175b");
  ClusterSpec cluster = load_cluster("dgx-a100-80g");
  Plan plan;
  Fixture() {
    cluster.nodes = 16;
    PlanShorthand s;
    s.tp = 8, s.pp = 2, s.micro_batch = 1, s.global_batch = 64;
    plan = expand_shorthand(s, model, cluster);
  }
};

const double kGiB = 1073741824.0, kMiB = 1048576.0;

// nccl-tests' bus bandwidth: algorithm bandwidth times the bytes each rank must move.
double busbw_gbps(Collective c, double bytes, int p, double t) {
  const double factor = c == Collective::all_reduce ? 2.0 * (p - 1) / p : double(p - 1) / p;
  return factor * bytes / t / 1e9;
}
}  // namespace

BOOST_FIXTURE_TEST_CASE(ring_allreduce_1gib_on_8_gpus_is_8_2_ms, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  const CommCost c = cm.fabric().collective_cost(Collective::all_reduce, int64_t(kGiB), 8, 1);
  // 2 (p-1)/p S / busbw = 1.75 * 2^30 / 230e9 = 8.17 ms.
  BOOST_TEST(c.algo == CollectiveAlgo::ring);
  BOOST_TEST(c.link == LinkClass::intra_node);
  BOOST_TEST(c.time_s() == 8.17e-3, boost::test_tools::tolerance(0.03));
  // The parts, by hand: 2(p-1) = 14 steps of 3 us; 1.75 S bytes per rank at 300 GB/s x 0.78
  // scaled by S / (S + 4 MiB).
  BOOST_TEST(c.latency_s == 14 * 3e-6, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(c.link_bytes == 1.75 * kGiB, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(c.bandwidth_gbps == 234.0 * kGiB / (kGiB + 4 * kMiB),
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(c.time_s() == c.latency_s + c.link_bytes / (c.bandwidth_gbps * 1e9),
             boost::test_tools::tolerance(1e-12));
}

BOOST_FIXTURE_TEST_CASE(nccl_tests_bus_bandwidths_on_dgx_a100, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  // 8x A100 on NVSwitch: ~230 GB/s at 1 GiB, ~20 GB/s at 1 MiB.
  double t = cm.fabric().collective_cost(Collective::all_reduce, int64_t(kGiB), 8, 1).time_s();
  BOOST_TEST(busbw_gbps(Collective::all_reduce, kGiB, 8, t) == 230.0,
             boost::test_tools::tolerance(0.03));
  t = cm.fabric().collective_cost(Collective::all_reduce, int64_t(kMiB), 8, 1).time_s();
  BOOST_TEST(busbw_gbps(Collective::all_reduce, kMiB, 8, t) == 20.0,
             boost::test_tools::tolerance(0.2));
  // Across DGX A100 nodes, 8x HDR per node: ~190 GB/s at large sizes (2 and 16 nodes).
  for (int nodes : {2, 16}) {
    const int p = 8 * nodes;
    t = cm.fabric().collective_cost(Collective::all_reduce, int64_t(8 * kGiB), p, nodes).time_s();
    BOOST_TEST_INFO("nodes " << nodes);
    BOOST_TEST(busbw_gbps(Collective::all_reduce, 8 * kGiB, p, t) == 190.0,
               boost::test_tools::tolerance(0.03));
  }
  // Bus bandwidth grows with message size.
  double prev = 0;
  for (double s = 64e3; s < 4e9; s *= 4) {
    t = cm.fabric().collective_cost(Collective::all_reduce, int64_t(s), 8, 1).time_s();
    const double bw = busbw_gbps(Collective::all_reduce, s, 8, t);
    BOOST_TEST(bw > prev);
    prev = bw;
  }
}

BOOST_FIXTURE_TEST_CASE(inter_node_ring_by_hand, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  // 16 ranks on 2 nodes: 2(N-1) = 2 steps cross the network (5 us NIC + 3 switch hops x 0.2 us),
  // the other 28 are NVSwitch steps. Each node's 8 ranks spread the ring over 8 NICs, so one
  // NIC carries 1/8 of the 2 (p-1)/p S every rank sends, at 25 GB/s x 0.95.
  const double S = 256 * kMiB;
  const CommCost c =
      cm.fabric().collective_cost(Collective::all_reduce, int64_t(S), 16, 2, CollectiveAlgo::ring);
  BOOST_TEST(c.latency_s == 2 * 5.6e-6 + 28 * 3e-6, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(c.link == LinkClass::inter_node);
  BOOST_TEST(c.link_bytes == 2.0 * 15 / 16 * S / 8, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(c.bandwidth_gbps == 23.75 * S / (S + 8 * kMiB), boost::test_tools::tolerance(1e-12));
  // A data-parallel group with one rank per node gets only its own NIC share: 8x slower.
  const CommCost dp =
      cm.fabric().collective_cost(Collective::all_reduce, int64_t(S), 16, 16, CollectiveAlgo::ring);
  BOOST_TEST(dp.link_bytes == 2.0 * 15 / 16 * S, boost::test_tools::tolerance(1e-12));
}

BOOST_FIXTURE_TEST_CASE(gather_scatter_alltoall_tree_hierarchical_by_hand, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  const double S = 64 * kMiB;
  // All-gather / reduce-scatter: p-1 steps, (p-1)/p S per rank.
  for (Collective k : {Collective::all_gather, Collective::reduce_scatter}) {
    const CommCost c = cm.fabric().collective_cost(k, int64_t(S), 8, 1);
    BOOST_TEST(c.algo == CollectiveAlgo::ring);
    BOOST_TEST(c.latency_s == 7 * 3e-6, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(c.link_bytes == 7.0 / 8 * S, boost::test_tools::tolerance(1e-12));
  }
  // All-to-all on 2 nodes x 8: a rank sends S/p to each peer, 8/16 of S through its own NIC.
  const CommCost a2a = cm.fabric().collective_cost(Collective::all_to_all, int64_t(S), 16, 2);
  BOOST_TEST(a2a.algo == CollectiveAlgo::direct);
  BOOST_TEST(a2a.link == LinkClass::inter_node);
  BOOST_TEST(a2a.link_bytes == S * 8 / 16, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(a2a.bandwidth_gbps == 23.75 * (S / 16) / (S / 16 + 8 * kMiB),
             boost::test_tools::tolerance(1e-12));
  // Tree over 128 nodes x 8: 2 ((k-1) NVSwitch steps + log2(128) = 7 network steps).
  const CommCost tree =
      cm.fabric().collective_cost(Collective::all_reduce, 65536, 1024, 128, CollectiveAlgo::tree);
  BOOST_TEST(tree.latency_s == 2 * (7 * 3e-6 + 7 * 5.6e-6), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(tree.link_bytes == 2.0 * 65536 / 8, boost::test_tools::tolerance(1e-12));
  // Small messages across many nodes are latency bound: the tree wins, as in NCCL.
  BOOST_TEST(cm.fabric().collective_cost(Collective::all_reduce, 65536, 1024, 128).algo ==
             CollectiveAlgo::tree);
  // Large messages: the ring (it moves (p-1)/p of what the tree moves).
  BOOST_TEST(cm.fabric().collective_cost(Collective::all_reduce, int64_t(8 * kGiB), 16, 2).algo ==
             CollectiveAlgo::ring);
  // Hierarchical: reduce-scatter in the node, ring all-reduce of S/8 across nodes, all-gather.
  const CommCost h = cm.fabric().collective_cost(Collective::all_reduce, int64_t(S), 64, 8,
                                                 CollectiveAlgo::hierarchical);
  const double t_bw = 2.0 * 7 / 8 * S / (234e9 * S / (S + 4 * kMiB)) +
                      2.0 * 7 / 8 * (S / 8) / (23.75e9 * (S / 8) / (S / 8 + 8 * kMiB));
  BOOST_TEST(h.latency_s == 2 * 7 * 3e-6 + 2 * 7 * 5.6e-6, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(h.time_s() - h.latency_s == t_bw, boost::test_tools::tolerance(1e-9));
  // The choice is the fastest candidate.
  for (double s : {4e3, 1e6, 3e7, 1e9}) {
    const CommCost best = cm.fabric().collective_cost(Collective::all_reduce, int64_t(s), 64, 8);
    for (CollectiveAlgo al :
         {CollectiveAlgo::ring, CollectiveAlgo::tree, CollectiveAlgo::hierarchical})
      BOOST_TEST(
          best.time_s() <=
          cm.fabric().collective_cost(Collective::all_reduce, int64_t(s), 64, 8, al).time_s());
  }
  // Algorithms that do not apply cost infinity; a group of one costs nothing.
  BOOST_TEST(
      std::isinf(cm.fabric()
                     .collective_cost(Collective::all_gather, 1000, 8, 1, CollectiveAlgo::tree)
                     .time_s()));
  BOOST_TEST(cm.fabric().collective_cost(Collective::all_reduce, 1000, 1, 1).time_s() == 0);
}

BOOST_FIXTURE_TEST_CASE(p2p_and_pcie, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  const double S = 48 * kMiB;
  // Ranks 0 and 8 are on nodes 0 and 1: NIC; ranks 0 and 3 share node 0: NVSwitch.
  const CommCost inter = cm.fabric().p2p_cost(int64_t(S), 0, 8);
  BOOST_TEST(inter.link == LinkClass::inter_node);
  BOOST_TEST(inter.latency_s == 5.6e-6, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(inter.bandwidth_gbps == 23.75 * S / (S + 8 * kMiB),
             boost::test_tools::tolerance(1e-12));
  const CommCost intra = cm.fabric().p2p_cost(int64_t(S), 0, 3);
  BOOST_TEST(intra.link == LinkClass::intra_node);
  BOOST_TEST(intra.bandwidth_gbps == 234.0 * S / (S + 4 * kMiB),
             boost::test_tools::tolerance(1e-12));
  const CommCost pcie = cm.fabric().copy_cost(int64_t(1e9));
  BOOST_TEST(pcie.link == LinkClass::pcie);
  // DGX A100: two GPUs share each PCIe switch's uplink, 25 GB/s achieved.
  BOOST_TEST(pcie.time_s() == 2e-6 + 1e9 / (25e9 / 2), boost::test_tools::tolerance(1e-12));
  // A GPU alone on its switch gets the whole link.
  cluster.node.gpus_per_pcie_switch = 1;
  const CostModel alone(model, cluster, plan.dtype);
  BOOST_TEST(alone.fabric().copy_cost(int64_t(1e9)).time_s() == 2e-6 + 1e9 / 25e9,
             boost::test_tools::tolerance(1e-12));
}

BOOST_FIXTURE_TEST_CASE(program_ops_resolve_to_the_same_costs, Fixture) {
  // Every communication op of a Program: the Layout-resolved cost equals the (size, nodes)
  // cost the estimator uses, and the CommCost adds up.
  cluster.nodes = 4;
  PlanShorthand s;
  s.tp = 4, s.pp = 2, s.micro_batch = 1, s.global_batch = 16, s.zero = 1;
  plan = expand_shorthand(s, model, cluster);
  validate(plan, model, cluster, "test");
  CostModel cm(model, cluster, plan.dtype);
  Layout layout(plan, cluster);
  Program prog = build_program(model, plan);
  int checked = 0;
  for (const auto& st : prog.stages) {
    const int rank = layout.rank_of(st.stage, 5);
    for (const Op& op : st.ops) {
      if (op.kind != OpKind::collective && op.kind != OpKind::send && op.kind != OpKind::recv)
        continue;
      const CommCost c = cm.comm_cost(op, layout, rank);
      BOOST_TEST(cm.op_time_s(op, layout, rank) == c.time_s());
      if (op.kind == OpKind::collective) {
        const auto& ranks = layout.group(resolve_group(layout, rank, op)).ranks;
        std::set<int> nodes;
        for (int r : ranks) nodes.insert(cm.fabric().node_of(r));
        const CommCost d = cm.fabric().collective_cost(op.collective, op.bytes, int(ranks.size()),
                                                       int(nodes.size()));
        BOOST_TEST(c.time_s() == d.time_s(), boost::test_tools::tolerance(1e-12));
        if (op.group == GroupKind::tp) BOOST_TEST(c.link == LinkClass::intra_node);
        if (op.group == GroupKind::dp) BOOST_TEST(c.link == LinkClass::inter_node);
      } else {
        // Stages are 16 ranks = 2 nodes apart: always the NIC.
        BOOST_TEST(c.link == LinkClass::inter_node);
      }
      ++checked;
    }
  }
  BOOST_TEST(checked > 10);
}
