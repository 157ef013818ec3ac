// Layout: which rank does what. Maps a world rank to (stage, data index, tensor index) and
// gives the communicator groups of every layer. tp is innermost (tensor groups stay inside a
// node), pp outermost. Groups depend only on (stage, tp), so layers with the same (tp, dp)
// share them. The simulator and the runtime both take their groups from here.
// Context parallelism (one cp per plan, validated) sits between tp and dp, as Megatron-Core's
// "tp-cp-ep-dp-pp" order: local = t + tp * (c + cp * d). The cp group of a rank is its cp
// ranks of equal (t, d); its dp group is every rank of equal t, cp x dp of them, which is
// Megatron-Core's data-parallel group with context parallel: every weight's gradient is
// reduced, and its ZeRO shards spread, over it (LayerStrategy::dp_cp). No new group kind is
// needed for that: at cp 1 it is the plain dp group.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/rank_geometry.hpp"

namespace stratagem {

enum class GroupKind : uint8_t {
  none,
  tp,              // tensor-parallel group of a layer
  dp,              // data-parallel group of a layer
  reshard,         // ranks exchanging samples when dp shrinks between consecutive layers
  tied_embedding,  // first and last stage, same local index: ties wte and the LM head
  pp_next,         // peer: same local index on the next stage
  pp_prev,         // peer: same local index on the previous stage
  cp,              // context-parallel group of a layer (ranks sharing a sequence)
  ep,              // expert-parallel group of an MoE layer (the all-to-all's ranks)
  expert_dp,       // expert data-parallel group: ranks holding the same experts
  expert_tp,       // expert tensor-parallel group: ranks holding shards of the same experts
};
const char* to_string(GroupKind k);

struct Group {
  int id = 0;
  GroupKind kind = GroupKind::none;
  int stage = 0;
  int tp = 1;  // the tp degree the group belongs to (reshard: the larger one)
  std::vector<int> ranks;
};

struct RankCoords {
  int stage = 0;
  int local = 0;  // index inside the stage, 0 .. devices_per_stage-1
  int node = 0;
  int local_gpu = 0;  // GPU index inside the node
};

// About 30 methods: the one owner of the parallel groups (Megatron-Core's parallel_state) has a
// lookup per group kind (tp, dp, cp and its ring neighbours, reshard, ep, expert_dp, expert_tp,
// pipeline peers, tied embedding) beside the few that build them.
class Layout {
 public:
  Layout(const Plan& plan, const ClusterSpec& cluster);

  int world_size() const { return world_size_; }
  int pp() const { return pp_; }
  int devices_per_stage() const { return devices_per_stage_; }
  RankCoords coords(int rank) const;
  int rank_of(int stage, int local) const { return int(geometry_.rank_of(stage, local)); }
  // The rank orders every group is built from (and what a rank's indices are).
  const RankGeometry& geometry() const { return geometry_; }
  // Context parallelism (cp 1: no cp groups, every cp index 0).
  int cp() const { return cp_; }
  int cp_index(int local, int tp) const { return RankGeometry::cp_index(local, tp, cp_); }

  // Group ids for `rank` under tensor degree `tp` (dp = devices_per_stage / tp).
  int tp_group(int rank, int tp) const;
  int dp_group(int rank, int tp) const;
  // Group of ranks that all-gather samples when going from tp_small to tp_big (dp shrinks).
  int reshard_group(int rank, int tp_small, int tp_big) const;
  // The ranks of equal (t, d) that split a sequence, in cp index order; -1 when cp == 1.
  int cp_group(int rank, int tp) const;
  // Ring neighbours inside that group: cp index + 1 and - 1 (mod cp); -1 when cp == 1.
  int cp_next_rank(int rank, int tp) const;
  int cp_prev_rank(int rank, int tp) const;
  int tied_embedding_group(int rank) const;  // -1 when pp == 1
  // Expert groups of MoE layers with expert tensor degree etp and expert degree ep (etp x ep
  // > 1), as Megatron-Core's expert RankGenerator ("tp-cp-ep-dp-pp" with tp = etp, cp = 1):
  // a stage's local index is et + etp * (e + ep * ed). The all-to-all's group (same et, ed),
  // the ranks holding the same experts (same et, e) and those sharding them (same e, ed).
  int ep_group(int rank, int etp, int ep) const;
  int expert_dp_group(int rank, int etp, int ep) const;
  int expert_tp_group(int rank, int etp, int ep) const;
  int next_stage_rank(int rank) const;  // -1 on the last stage
  int prev_stage_rank(int rank) const;  // -1 on the first stage

  const Group& group(int id) const { return groups_.at(id); }
  const std::vector<Group>& groups() const { return groups_; }
  // Distinct tp degrees that have groups (every value used by the plan).
  const std::vector<int>& tp_degrees() const { return tp_degrees_; }

 private:
  // The constructor's steps (layout.cpp), in the order that fixes the group ids.
  void collect_tp_degrees(const Plan& plan);
  void add(GroupKind kind, int stage, int tp, std::vector<int> ranks);
  void add_dense_groups(int stage, int tp_index);
  void add_reshard_groups(int stage);
  void add_expert_groups(int stage, int pair_index);
  int index_of_tp(int tp) const;
  int cp_neighbour(int rank, int tp, int step) const;
  int world_size_ = 0, pp_ = 0, devices_per_stage_ = 0, cp_ = 1;
  RankGeometry geometry_;
  std::vector<int> tp_degrees_;
  // base ids, indexed [stage][tp index]
  std::vector<std::vector<int>> tp_base_, dp_base_, cp_base_;
  // reshard base ids, indexed [stage][small][big]
  std::vector<std::vector<std::vector<int>>> reshard_base_;
  int tied_base_ = -1;
  // (etp, ep) pairs with expert groups, and their base ids [stage][pair index]
  std::vector<std::pair<int, int>> expert_pairs_;
  std::vector<std::vector<int>> ep_base_, edp_base_, etp_base_;
  int index_of_expert_pair(int etp, int ep) const;
  std::vector<Group> groups_;
};

}  // namespace stratagem
