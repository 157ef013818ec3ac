#include "stratagem/layout.hpp"

#include <algorithm>
#include <stdexcept>

#include "stratagem/error.hpp"

namespace stratagem {

const char* to_string(GroupKind k) {
  switch (k) {
    case GroupKind::none:
      return "none";
    case GroupKind::tp:
      return "tp";
    case GroupKind::dp:
      return "dp";
    case GroupKind::reshard:
      return "reshard";
    case GroupKind::tied_embedding:
      return "tied_embedding";
    case GroupKind::pp_next:
      return "pp_next";
    case GroupKind::pp_prev:
      return "pp_prev";
    case GroupKind::cp:
      return "cp";
    case GroupKind::ep:
      return "ep";
    case GroupKind::expert_dp:
      return "expert_dp";
    case GroupKind::expert_tp:
      return "expert_tp";
  }
  return "?";
}

Layout::Layout(const Plan& plan, const ClusterSpec& cluster)
    : world_size_(plan.world_size()),
      pp_(plan.pp),
      devices_per_stage_(plan.devices_per_stage()),
      cp_(plan.embedding.cp),
      geometry_{std::max(1, cluster.node.gpus_per_node), plan.devices_per_stage()} {
  if (world_size_ != cluster.world_size())
    throw InputError("layout: plan needs " + std::to_string(world_size_) +
                     " ranks but the cluster has " + std::to_string(cluster.world_size()) +
                     " GPUs");
  collect_tp_degrees(plan);
  const int T = static_cast<int>(tp_degrees_.size());
  tp_base_.assign(pp_, std::vector<int>(T, -1));
  dp_base_.assign(pp_, std::vector<int>(T, -1));
  cp_base_.assign(pp_, std::vector<int>(T, -1));
  reshard_base_.assign(pp_, std::vector<std::vector<int>>(T, std::vector<int>(T, -1)));
  // Group ids in this order, so that a plan without cp, reshards or experts keeps the ids it had.
  for (int s = 0; s < pp_; ++s) {
    for (int ti = 0; ti < T; ++ti) add_dense_groups(s, ti);
    add_reshard_groups(s);
  }
  if (pp_ > 1) {
    tied_base_ = static_cast<int>(groups_.size());
    for (int i = 0; i < devices_per_stage_; ++i)
      add(GroupKind::tied_embedding, 0, 1, {rank_of(0, i), rank_of(pp_ - 1, i)});
  }
  // Expert groups last, so that a dense plan's group ids are as they were.
  for (const auto& l : plan.layers)
    if (l.ep * l.etp > 1) expert_pairs_.emplace_back(l.etp, l.ep);
  std::sort(expert_pairs_.begin(), expert_pairs_.end());
  expert_pairs_.erase(std::unique(expert_pairs_.begin(), expert_pairs_.end()), expert_pairs_.end());
  const int P = static_cast<int>(expert_pairs_.size());
  ep_base_.assign(pp_, std::vector<int>(P, -1));
  edp_base_.assign(pp_, std::vector<int>(P, -1));
  etp_base_.assign(pp_, std::vector<int>(P, -1));
  for (int s = 0; s < pp_; ++s)
    for (int pi = 0; pi < P; ++pi) add_expert_groups(s, pi);
}

// Every tp degree of the plan and, where sequence-parallel layers hold the stream as tp 1 does
// (LayerStrategy::stream_tp) and that differs between strategies, the stream degrees, whose
// reshard groups are needed; sorted, each once.
void Layout::collect_tp_degrees(const Plan& plan) {
  tp_degrees_.push_back(plan.embedding.tp);
  for (const auto& l : plan.layers) tp_degrees_.push_back(l.tp);
  bool streams_differ = false;
  for (const auto& l : plan.layers)
    streams_differ = streams_differ || l.stream_tp() != plan.embedding.stream_tp();
  if (streams_differ) {
    tp_degrees_.push_back(plan.embedding.stream_tp());
    for (const auto& l : plan.layers) tp_degrees_.push_back(l.stream_tp());
  }
  std::sort(tp_degrees_.begin(), tp_degrees_.end());
  tp_degrees_.erase(std::unique(tp_degrees_.begin(), tp_degrees_.end()), tp_degrees_.end());
}

void Layout::add(GroupKind kind, int stage, int tp, std::vector<int> ranks) {
  Group g;
  g.id = static_cast<int>(groups_.size());
  g.kind = kind;
  g.stage = stage;
  g.tp = tp;
  g.ranks = std::move(ranks);
  groups_.push_back(std::move(g));
}

// The tp, dp and cp groups of tp degree tp_degrees_[ti] on stage s, in the rank order
// (rank_geometry.hpp). A tp or dp group's index k runs over the cp x dp ranks of a tp index
// (the dp group with context parallel): dense_local(t, 0, k, tp, 1).
void Layout::add_dense_groups(int s, int ti) {
  using G = RankGeometry;
  const int tp = tp_degrees_[ti], dp = devices_per_stage_ / tp;
  tp_base_[s][ti] = static_cast<int>(groups_.size());
  for (int k = 0; k < dp; ++k) {
    std::vector<int> r;
    for (int j = 0; j < tp; ++j) r.push_back(rank_of(s, G::dense_local(j, 0, k, tp, 1)));
    add(GroupKind::tp, s, tp, std::move(r));
  }
  dp_base_[s][ti] = static_cast<int>(groups_.size());
  for (int j = 0; j < tp; ++j) {
    std::vector<int> r;
    for (int k = 0; k < dp; ++k) r.push_back(rank_of(s, G::dense_local(j, 0, k, tp, 1)));
    add(GroupKind::dp, s, tp, std::move(r));
  }
  // After every group a plan without cp has, so that their ids stay as they were.
  if (cp_ == 1) return;
  cp_base_[s][ti] = static_cast<int>(groups_.size());
  for (int d = 0; d < dp / cp_; ++d)
    for (int j = 0; j < tp; ++j) {
      std::vector<int> r;
      for (int c = 0; c < cp_; ++c) r.push_back(rank_of(s, G::dense_local(j, c, d, tp, cp_)));
      add(GroupKind::cp, s, tp, std::move(r));
    }
}

// A stream of tp tb is held by tb / ta replicas of tp ta: replica x of block blk is the ta
// ranks dense_local(0 .. ta-1, x, blk, ta, tb / ta).
void Layout::add_reshard_groups(int s) {
  const int T = static_cast<int>(tp_degrees_.size());
  for (int a = 0; a < T; ++a)
    for (int b = a + 1; b < T; ++b) {
      const int ta = tp_degrees_[a], tb = tp_degrees_[b];
      if (tb % ta) continue;
      reshard_base_[s][a][b] = static_cast<int>(groups_.size());
      for (int blk = 0; blk < devices_per_stage_ / tb; ++blk)
        for (int j = 0; j < ta; ++j) {
          std::vector<int> r;
          for (int x = 0; x < tb / ta; ++x)
            r.push_back(rank_of(s, RankGeometry::dense_local(j, x, blk, ta, tb / ta)));
          add(GroupKind::reshard, s, tb, std::move(r));
        }
    }
}

// The ep, expert_dp and expert_tp groups of expert pair expert_pairs_[pi] on stage s.
void Layout::add_expert_groups(int s, int pi) {
  const int D = devices_per_stage_;
  // Plain ints, not a structured binding: the lambda below captures them (clang 14, which
  // builds the fuzz targets, cannot capture a binding).
  const int etp = expert_pairs_[pi].first, ep = expert_pairs_[pi].second;
  if (D % (etp * ep))
    throw InputError("layout: etp " + std::to_string(etp) + " x ep " + std::to_string(ep) +
                     " does not divide the stage's " + std::to_string(D) + " ranks");
  const int edp = D / (etp * ep);
  auto local = [&](int et, int e, int ed) {
    return RankGeometry::expert_local(et, e, ed, etp, ep);
  };
  ep_base_[s][pi] = static_cast<int>(groups_.size());
  for (int ed = 0; ed < edp; ++ed)
    for (int et = 0; et < etp; ++et) {
      std::vector<int> r;
      for (int e = 0; e < ep; ++e) r.push_back(rank_of(s, local(et, e, ed)));
      add(GroupKind::ep, s, etp, std::move(r));
    }
  edp_base_[s][pi] = static_cast<int>(groups_.size());
  for (int e = 0; e < ep; ++e)
    for (int et = 0; et < etp; ++et) {
      std::vector<int> r;
      for (int ed = 0; ed < edp; ++ed) r.push_back(rank_of(s, local(et, e, ed)));
      add(GroupKind::expert_dp, s, etp, std::move(r));
    }
  etp_base_[s][pi] = static_cast<int>(groups_.size());
  for (int ed = 0; ed < edp; ++ed)
    for (int e = 0; e < ep; ++e) {
      std::vector<int> r;
      for (int et = 0; et < etp; ++et) r.push_back(rank_of(s, local(et, e, ed)));
      add(GroupKind::expert_tp, s, etp, std::move(r));
    }
}

int Layout::index_of_expert_pair(int etp, int ep) const {
  auto it = std::lower_bound(expert_pairs_.begin(), expert_pairs_.end(), std::pair(etp, ep));
  if (it == expert_pairs_.end() || *it != std::pair(etp, ep))
    throw std::logic_error("layout: no expert groups for etp " + std::to_string(etp) + " ep " +
                           std::to_string(ep));
  return static_cast<int>(it - expert_pairs_.begin());
}

// Group ids are laid out as the constructor adds them: ep groups by (ed, et), expert_dp by
// (e, et), expert_tp by (ed, e).
int Layout::ep_group(int rank, int etp, int ep) const {
  const auto c = coords(rank);
  const int et = RankGeometry::etp_index(c.local, etp);
  const int ed = RankGeometry::edp_index(c.local, etp, ep);
  return ep_base_[c.stage][index_of_expert_pair(etp, ep)] + ed * etp + et;
}

int Layout::expert_dp_group(int rank, int etp, int ep) const {
  const auto c = coords(rank);
  const int et = RankGeometry::etp_index(c.local, etp);
  const int e = RankGeometry::ep_index(c.local, etp, ep);
  return edp_base_[c.stage][index_of_expert_pair(etp, ep)] + e * etp + et;
}

int Layout::expert_tp_group(int rank, int etp, int ep) const {
  const auto c = coords(rank);
  const int e = RankGeometry::ep_index(c.local, etp, ep);
  const int ed = RankGeometry::edp_index(c.local, etp, ep);
  return etp_base_[c.stage][index_of_expert_pair(etp, ep)] + ed * ep + e;
}

RankCoords Layout::coords(int rank) const {
  RankCoords c;
  c.stage = rank / devices_per_stage_;
  c.local = rank % devices_per_stage_;
  c.node = int(geometry_.node_of(rank));
  c.local_gpu = int(rank % geometry_.gpus_per_node);
  return c;
}

int Layout::index_of_tp(int tp) const {
  auto it = std::lower_bound(tp_degrees_.begin(), tp_degrees_.end(), tp);
  if (it == tp_degrees_.end() || *it != tp)
    throw std::logic_error("layout: no groups for tp " + std::to_string(tp));
  return static_cast<int>(it - tp_degrees_.begin());
}

int Layout::tp_group(int rank, int tp) const {
  auto c = coords(rank);
  return tp_base_[c.stage][index_of_tp(tp)] + RankGeometry::dp_cp_index(c.local, tp);
}

int Layout::dp_group(int rank, int tp) const {
  auto c = coords(rank);
  return dp_base_[c.stage][index_of_tp(tp)] + RankGeometry::tp_index(c.local, tp);
}

int Layout::reshard_group(int rank, int tp_small, int tp_big) const {
  auto c = coords(rank);
  int base = reshard_base_[c.stage][index_of_tp(tp_small)][index_of_tp(tp_big)];
  if (base < 0) throw std::logic_error("layout: tp degrees do not divide one another");
  return base + (c.local / tp_big) * tp_small + c.local % tp_small;
}

int Layout::cp_group(int rank, int tp) const {
  if (cp_ == 1) return -1;
  auto c = coords(rank);
  // Groups are laid out [d][t].
  return cp_base_[c.stage][index_of_tp(tp)] + RankGeometry::dp_index(c.local, tp, cp_) * tp +
         RankGeometry::tp_index(c.local, tp);
}

// The rank of cp index i + step (mod cp) with this rank's tp and dp indices.
int Layout::cp_neighbour(int rank, int tp, int step) const {
  if (cp_ == 1) return -1;
  auto c = coords(rank);
  using G = RankGeometry;
  const int i = G::cp_index(c.local, tp, cp_);
  return rank_of(c.stage, G::dense_local(G::tp_index(c.local, tp), (i + step + cp_) % cp_,
                                         G::dp_index(c.local, tp, cp_), tp, cp_));
}

int Layout::cp_next_rank(int rank, int tp) const {
  return cp_neighbour(rank, tp, 1);
}

int Layout::cp_prev_rank(int rank, int tp) const {
  return cp_neighbour(rank, tp, -1);
}

int Layout::tied_embedding_group(int rank) const {
  if (tied_base_ < 0) return -1;
  return tied_base_ + coords(rank).local;
}

int Layout::next_stage_rank(int rank) const {
  auto c = coords(rank);
  return c.stage + 1 < pp_ ? rank_of(c.stage + 1, c.local) : -1;
}

int Layout::prev_stage_rank(int rank) const {
  auto c = coords(rank);
  return c.stage > 0 ? rank_of(c.stage - 1, c.local) : -1;
}

}  // namespace stratagem
