// RankGeometry states the rank orders once: its indices invert its local formulas, the Layout's
// groups are exactly the ranks that share the other indices, and the node counts the estimator
// takes from it are those of the Layout's groups.
#define BOOST_TEST_MODULE rank_geometry
#include <boost/test/unit_test.hpp>
#include <set>

#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"

using namespace stratagem;
using G = RankGeometry;

namespace {

int distinct_nodes(const RankGeometry& geo, const std::vector<int>& ranks) {
  std::set<int64_t> nodes;
  for (int r : ranks) nodes.insert(geo.node_of(r));
  return int(nodes.size());
}

// A plan of one stage strategy over `nodes` nodes of `gpus` GPUs, pp 2.
Layout layout_of(int nodes, int gpus, int tp, int cp, int ep, int etp) {
  ModelSpec m = load_model("mixtral-8x7b");
  m.layers = 4;
  m.seq_len = 3072;  // a ring over cp 3 cuts it into 2 x 3 chunks
  ClusterSpec c = load_cluster("dgx-h100");
  c.nodes = nodes;
  c.node.gpus_per_node = gpus;
  PlanShorthand s;
  s.tp = tp, s.pp = 2, s.cp = cp, s.ep = ep, s.etp = etp;
  s.micro_batch = 1;
  s.global_batch = 64;
  s.sequence_parallel = tp > 1;
  return Layout(expand_shorthand(s, m, c), c);
}

}  // namespace

BOOST_AUTO_TEST_CASE(indices_invert_the_local_formulas) {
  for (int tp : {1, 2, 4})
    for (int cp : {1, 2, 3})
      for (int d = 0; d < 3; ++d)
        for (int c = 0; c < cp; ++c)
          for (int t = 0; t < tp; ++t) {
            const int local = G::dense_local(t, c, d, tp, cp);
            BOOST_TEST(G::tp_index(local, tp) == t);
            BOOST_TEST(G::cp_index(local, tp, cp) == c);
            BOOST_TEST(G::dp_index(local, tp, cp) == d);
            BOOST_TEST(G::dp_cp_index(local, tp) == c + cp * d);
          }
  for (int etp : {1, 2})
    for (int ep : {1, 4})
      for (int ed = 0; ed < 3; ++ed)
        for (int e = 0; e < ep; ++e)
          for (int et = 0; et < etp; ++et) {
            const int local = G::expert_local(et, e, ed, etp, ep);
            BOOST_TEST(G::etp_index(local, etp) == et);
            BOOST_TEST(G::ep_index(local, etp, ep) == e);
            BOOST_TEST(G::edp_index(local, etp, ep) == ed);
          }
}

BOOST_AUTO_TEST_CASE(layout_groups_share_the_other_indices_and_the_estimators_node_counts) {
  struct Shape {
    int nodes, gpus, tp, cp, ep, etp;
  };
  // Groups inside a node, across nodes, and with a node size the degrees do not divide.
  for (const Shape& x : {Shape{2, 8, 2, 2, 4, 1}, Shape{4, 4, 2, 1, 4, 2}, Shape{4, 8, 4, 2, 4, 2},
                         Shape{3, 4, 2, 3, 2, 1}}) {
    BOOST_TEST_CONTEXT("nodes " << x.nodes << " gpus " << x.gpus << " tp " << x.tp << " cp " << x.cp
                                << " ep " << x.ep << " etp " << x.etp) {
      const Layout L = layout_of(x.nodes, x.gpus, x.tp, x.cp, x.ep, x.etp);
      const RankGeometry& geo = L.geometry();
      const int D = L.devices_per_stage();
      int worst_tp = 1, worst_cp = 1;
      for (const Group& g : L.groups()) {
        const int stage = L.coords(g.ranks.front()).stage;
        std::set<std::vector<int>> keys;  // the indices the members share
        for (int r : g.ranks) {
          const int local = L.coords(r).local;
          switch (g.kind) {
            case GroupKind::tp:
              keys.insert({G::dp_cp_index(local, x.tp)});
              break;
            case GroupKind::dp:
              keys.insert({G::tp_index(local, x.tp)});
              break;
            case GroupKind::cp:
              keys.insert({G::tp_index(local, x.tp), G::dp_index(local, x.tp, x.cp)});
              break;
            case GroupKind::ep:
              keys.insert({G::etp_index(local, x.etp), G::edp_index(local, x.etp, x.ep)});
              break;
            case GroupKind::expert_dp:
              keys.insert({G::etp_index(local, x.etp), G::ep_index(local, x.etp, x.ep)});
              break;
            case GroupKind::expert_tp:
              keys.insert({G::ep_index(local, x.etp, x.ep), G::edp_index(local, x.etp, x.ep)});
              break;
            default:
              keys.insert({0});
          }
        }
        BOOST_TEST(keys.size() == 1u);
        if (g.kind == GroupKind::tp && g.tp == x.tp && stage == 0)
          worst_tp = std::max(worst_tp, distinct_nodes(geo, g.ranks));
        if (g.kind == GroupKind::cp && stage == 0)
          worst_cp = std::max(worst_cp, distinct_nodes(geo, g.ranks));
        // The first expert group of each kind is what the MoE node count reads.
        const int first = g.ranks.front() - stage * D;
        if (first == 0 && stage == 0) {
          if (g.kind == GroupKind::ep)
            BOOST_TEST(geo.ep_nodes(0, x.etp, x.ep) == distinct_nodes(geo, g.ranks));
          if (g.kind == GroupKind::expert_dp)
            BOOST_TEST(geo.expert_dp_nodes(0, x.etp, x.ep) == distinct_nodes(geo, g.ranks));
          if (g.kind == GroupKind::expert_tp)
            BOOST_TEST(geo.expert_tp_nodes(0, x.etp) == distinct_nodes(geo, g.ranks));
        }
      }
      // Contiguous groups: the estimator's worst span is the worst group's node count.
      BOOST_TEST(geo.tp_nodes(0, x.tp) == worst_tp);
      BOOST_TEST(geo.cp_nodes(0, x.tp, x.cp) == worst_cp);
      // The cp ring's neighbours: the next cp index, the same tp and dp indices.
      if (x.cp > 1)
        for (int r = 0; r < D; ++r) {
          const int local = L.coords(r).local, next = L.coords(L.cp_next_rank(r, x.tp)).local;
          BOOST_TEST(G::cp_index(next, x.tp, x.cp) == (G::cp_index(local, x.tp, x.cp) + 1) % x.cp);
          BOOST_TEST(G::tp_index(next, x.tp) == G::tp_index(local, x.tp));
          BOOST_TEST(G::dp_index(next, x.tp, x.cp) == G::dp_index(local, x.tp, x.cp));
          BOOST_TEST(L.cp_prev_rank(L.cp_next_rank(r, x.tp), x.tp) == r);
        }
    }
  }
}
