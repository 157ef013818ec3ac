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

}  // namespace stratagem
