// RankGeometry: where every rank sits, the one statement of the rank orders. Megatron-Core's
// RankGenerator orders, with pp outermost:
//   rank  = stage * devices_per_stage + local, on node rank / gpus_per_node;
//   dense layers ("tp-cp-dp"):  local = t + tp * (c + cp * d);
//   an MoE layer's experts ("etp-ep-edp"): local = et + etp * (e + ep * ed).
// The Layout builds its groups from these, the runtime takes a rank's indices from them, and
// the estimator and the search count the nodes a group spans with them. It needs no Plan and
// no Program: two numbers.
#pragma once
#include <algorithm>
#include <cstdint>

namespace stratagem {

struct RankGeometry {
  int64_t gpus_per_node = 1, devices_per_stage = 1;

  int64_t rank_of(int stage, int local) const { return stage * devices_per_stage + local; }
  // A shift where gpus_per_node is a power of two, as it nearly always is: the estimator asks
  // this per stage and chunk, and a division costs ~40 cycles.
  int64_t node_of(int64_t rank) const {
    const int64_t g = gpus_per_node;
    return (g & (g - 1)) == 0 ? rank >> __builtin_ctzll(uint64_t(g)) : rank / g;
  }

  // ---- dense layers: local = t + tp * (c + cp * d) -------------------------------------------
  static int dense_local(int t, int c, int d, int tp, int cp) { return t + tp * (c + cp * d); }
  static int tp_index(int local, int tp) { return local % tp; }
  static int cp_index(int local, int tp, int cp) { return local / tp % cp; }
  static int dp_index(int local, int tp, int cp) { return local / tp / cp; }
  // The index among the cp x dp ranks of a tp index (the dp group with context parallel).
  static int dp_cp_index(int local, int tp) { return local / tp; }

  // ---- an MoE layer's experts: local = et + etp * (e + ep * ed) ------------------------------
  static int expert_local(int et, int e, int ed, int etp, int ep) {
    return et + etp * (e + ep * ed);
  }
  static int etp_index(int local, int etp) { return local % etp; }
  static int ep_index(int local, int etp, int ep) { return local / etp % ep; }
  static int edp_index(int local, int etp, int ep) { return local / etp / ep; }

  // ---- nodes a group spans, the worst over a stage's groups of a kind ----------------------
  // Nodes spanned by the ranks first .. last of one group.
  int span(int64_t first, int64_t last) const { return int(node_of(last) - node_of(first) + 1); }
  // Nodes holding `count` ranks first, first + stride, ... (ascending: count the node changes).
  int strided_nodes(int64_t first, int count, int64_t stride) const;
  // Tensor-parallel groups of degree tp on stage s.
  int tp_nodes(int s, int tp) const;
  // Data-parallel groups (a stride tp <= gpus_per_node skips no node): under cp the dp group is
  // the cp x dp ranks of a tp index (LayerStrategy::dp_cp).
  int dp_nodes(int s, int tp) const;
  // Context-parallel groups (cp ranks at stride tp).
  int cp_nodes(int s, int tp, int cp) const;
  // The first ep, expert_dp and expert_tp group of an MoE layer's experts on stage s.
  int ep_nodes(int s, int etp, int ep) const;
  int expert_dp_nodes(int s, int etp, int ep) const;
  int expert_tp_nodes(int s, int etp) const;
  // Do the ranks of stages s and t with the same local index share nodes?
  bool same_node(int s, int t) const;
};

// Inline: the estimator asks these per stage and chunk of every plan it prices.

// Group k of degree tp holds locals dense_local(0 .. tp-1, k) (k runs over cp x dp).
inline int RankGeometry::tp_nodes(int s, int tp) const {
  // Without the walk where the stage starts on a node border and tp and the node size divide:
  // each group then fills part of one node, or whole nodes of its own.
  if (rank_of(s, 0) % gpus_per_node == 0) {
    if (gpus_per_node % tp == 0) return 1;
    if (tp % gpus_per_node == 0) return int(tp / gpus_per_node);
  }
  const int64_t groups = devices_per_stage / tp;
  int worst = 1;
  for (int64_t k = 0; k < std::min(groups, gpus_per_node); ++k)
    worst = std::max(worst, span(rank_of(s, dense_local(0, 0, int(k), tp, 1)),
                                 rank_of(s, dense_local(tp - 1, 0, int(k), tp, 1))));
  return worst;
}

// The dp group of tp index j: dense_local(j, 0 .. cp x dp - 1); the first and the last tp index
// show the worst alignment.
inline int RankGeometry::dp_nodes(int s, int tp) const {
  const int dp_cp = int(devices_per_stage / tp);
  int worst = 1;
  for (int j : {0, tp - 1})
    worst = std::max(worst, span(rank_of(s, dense_local(j, 0, 0, tp, 1)),
                                 rank_of(s, dense_local(j, 0, dp_cp - 1, tp, 1))));
  return worst;
}

inline int RankGeometry::cp_nodes(int s, int tp, int cp) const {
  if (cp <= 1) return 1;
  const int64_t outer = devices_per_stage / (int64_t(tp) * cp);
  int worst = 1;
  for (int64_t d = 0; d < std::min(outer, gpus_per_node); ++d)
    worst = std::max(worst, span(rank_of(s, dense_local(0, 0, int(d), tp, cp)),
                                 rank_of(s, dense_local(0, cp - 1, int(d), tp, cp))));
  return worst;
}

inline bool RankGeometry::same_node(int s, int t) const {
  const int last = int(devices_per_stage - 1);
  return node_of(rank_of(s, 0)) == node_of(rank_of(t, 0)) &&
         node_of(rank_of(s, last)) == node_of(rank_of(t, last));
}

}  // namespace stratagem
