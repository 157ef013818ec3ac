// Node spans of groups in the rank orders (rank_geometry.hpp). The worst group of a kind on a
// stage: the first gpus_per_node groups show every phase of the groups against node borders.
#include "stratagem/rank_geometry.hpp"

namespace stratagem {

int RankGeometry::strided_nodes(int64_t first, int count, int64_t stride) const {
  if (count <= 1) return 1;
  // Without a walk where the stride and the node size divide: a stride of whole nodes puts each
  // rank on a node of its own; a stride dividing the node size skips no node.
  if (stride % gpus_per_node == 0) return count;
  if (gpus_per_node % stride == 0) return span(first, first + (count - 1) * stride);
  int nodes = 1;
  for (int i = 1; i < count; ++i)
    nodes += node_of(first + i * stride) != node_of(first + (i - 1) * stride);
  return nodes;
}

// Group k of degree tp holds locals dense_local(0 .. tp-1, k) (k runs over cp x dp).
int RankGeometry::tp_nodes(int s, int tp) const {
  const int64_t groups = devices_per_stage / tp;
  int worst = 1;
  for (int64_t k = 0; k < std::min(groups, gpus_per_node); ++k)
    worst = std::max(worst, span(rank_of(s, dense_local(0, 0, int(k), tp, 1)),
                                 rank_of(s, dense_local(tp - 1, 0, int(k), tp, 1))));
  return worst;
}

// The dp group of tp index j: dense_local(j, 0 .. cp x dp - 1); the first and the last tp index
// show the worst alignment.
int RankGeometry::dp_nodes(int s, int tp) const {
  const int dp_cp = int(devices_per_stage / tp);
  int worst = 1;
  for (int j : {0, tp - 1})
    worst = std::max(worst, span(rank_of(s, dense_local(j, 0, 0, tp, 1)),
                                 rank_of(s, dense_local(j, 0, dp_cp - 1, tp, 1))));
  return worst;
}

int RankGeometry::cp_nodes(int s, int tp, int cp) const {
  if (cp <= 1) return 1;
  const int64_t outer = devices_per_stage / (int64_t(tp) * cp);
  int worst = 1;
  for (int64_t d = 0; d < std::min(outer, gpus_per_node); ++d)
    worst = std::max(worst, span(rank_of(s, dense_local(0, 0, int(d), tp, cp)),
                                 rank_of(s, dense_local(0, cp - 1, int(d), tp, cp))));
  return worst;
}

int RankGeometry::ep_nodes(int s, int etp, int ep) const {
  return strided_nodes(rank_of(s, 0), ep, expert_local(0, 1, 0, etp, ep));
}

int RankGeometry::expert_dp_nodes(int s, int etp, int ep) const {
  const int edp = int(devices_per_stage / (int64_t(etp) * ep));
  return strided_nodes(rank_of(s, 0), edp, expert_local(0, 0, 1, etp, ep));
}

int RankGeometry::expert_tp_nodes(int s, int etp) const {
  return strided_nodes(rank_of(s, 0), etp, expert_local(1, 0, 0, etp, 1));
}

bool RankGeometry::same_node(int s, int t) const {
  const int last = int(devices_per_stage - 1);
  return node_of(rank_of(s, 0)) == node_of(rank_of(t, 0)) &&
         node_of(rank_of(s, last)) == node_of(rank_of(t, last));
}

}  // namespace stratagem
