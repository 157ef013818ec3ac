// Per-rank setup: groups, pipeline peers and rank classes (see rank_state.hpp).
#include "sim/rank_state.hpp"

#include <algorithm>

namespace stratagem::sim {

void init_ranks(std::vector<RankState>& ranks, std::vector<StageData>& stages,
                std::vector<int32_t>& rank_groups, const Layout& layout, int gpus_per_node) {
  const int W = layout.world_size();
  const int G = gpus_per_node;
  ranks.resize(W);
  int max_keys = 0;
  for (auto& sd : stages) max_keys = std::max<int>(max_keys, int(sd.group_keys.size()));
  rank_groups.assign(size_t(W) * std::max(1, max_keys), -1);
  std::vector<std::vector<std::vector<int64_t>>> sigs(stages.size());
  // Per group: its size and node span (computed once, not once per member).
  std::vector<int64_t> geometry(layout.groups().size(), -1);
  std::vector<int64_t> sig;
  for (int r = 0; r < W; ++r) {
    RankState& rk = ranks[r];
    const RankCoords c = layout.coords(r);
    rk.rank = r;
    rk.stage = c.stage;
    rk.node = r / G;
    rk.group_row = r * std::max(1, max_keys);
    rk.moving_since.fill(kNever);
    rk.last_done.fill(-1);
    rk.last_done_cat.fill(kNone);
    StageData& sd = stages[rk.stage];
    // The class signature: what comm_cost depends on (group sizes and node spans, and whether
    // each pipeline peer is on this node).
    sig.clear();
    for (size_t k = 0; k < sd.group_keys.size(); ++k) {
      const int g = resolve_group(layout, r, sd.group_keys[k].collective());
      rank_groups[rk.group_row + k] = g;
      if (g < 0) {
        sig.push_back(-1);
        continue;
      }
      if (geometry[g] < 0) {
        const auto& members = layout.group(g).ranks;
        std::vector<int> nodes;
        for (int m : members) nodes.push_back(m / G);
        std::sort(nodes.begin(), nodes.end());
        geometry[g] = int64_t(members.size()) << 32 |
                      int64_t(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
      }
      sig.push_back(geometry[g]);
    }
    for (int ch = 0; ch < 4; ++ch) {
      Op op;
      op.kind = ch == 3 ? OpKind::recv : OpKind::send;
      op.group = ch == 0 ? GroupKind::pp_next : ch == 1 ? GroupKind::pp_prev : GroupKind::cp;
      // A plan with cp > 1 has one tp (validate): its cp ring is the only one.
      op.strategy.tp = layout.tp_degrees().front();
      const int peer = resolve_peer(layout, r, op);
      rk.channels[ch].peer = peer;
      if (ch < 2 || layout.cp() > 1) sig.push_back(peer < 0 ? -1 : (peer / G == rk.node ? 1 : 0));
    }
    if (rk.channels[1].peer == rk.channels[0].peer) rk.channel_of_key[1] = 0;
    if (rk.channels[3].peer == rk.channels[2].peer) rk.channel_of_key[3] = 2;
    auto& list = sigs[rk.stage];
    size_t cls = 0;
    while (cls < list.size() && list[cls] != sig) ++cls;
    if (cls == list.size()) {
      list.push_back(sig);
      sd.class_rep.push_back(r);
    }
    rk.rank_class = int(cls);
  }
}

}  // namespace stratagem::sim
