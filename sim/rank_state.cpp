// Per-rank setup: groups, pipeline peers and rank classes (see rank_state.hpp).
#include "sim/rank_state.hpp"

#include <algorithm>

namespace stratagem::sim {

void init_ranks(std::vector<RankSt>& ranks, std::vector<StageData>& stages,
                std::vector<int32_t>& rank_groups, const Layout& layout, int gpus_per_node) {
  const int W = layout.world_size();
  const int G = gpus_per_node;
  ranks.resize(W);
  int max_keys = 0;
  for (auto& sd : stages) max_keys = std::max<int>(max_keys, int(sd.keys.size()));
  rank_groups.assign(size_t(W) * std::max(1, max_keys), -1);
  std::vector<std::vector<std::vector<int64_t>>> sigs(stages.size());
  // A group's (size, node span) once per group, not once per member: a dp group of a million
  // ranks would otherwise be sorted a million times.
  std::vector<int64_t> group_sig(layout.groups().size(), -1);
  auto sig_of = [&](int g) {
    if (group_sig[g] < 0) {
      const auto& members = layout.group(g).ranks;
      std::vector<int> nodes;
      nodes.reserve(members.size());
      for (int m : members) nodes.push_back(m / G);
      std::sort(nodes.begin(), nodes.end());
      group_sig[g] = int64_t(members.size()) << 32 |
                     int64_t(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
    }
    return group_sig[g];
  };
  for (int r = 0; r < W; ++r) {
    RankSt& rk = ranks[r];
    const RankCoords c = layout.coords(r);
    rk.rank = r;
    rk.stage = c.stage;
    rk.node = r / G;
    rk.gbase = r * std::max(1, max_keys);
    rk.act_b.fill(kNever);
    rk.wake.fill(-1);
    rk.wake_cat.fill(kNone);
    StageData& sd = stages[rk.stage];
    // The class signature: what comm_cost depends on (group sizes and node spans, and whether
    // each pipeline peer is on this node).
    std::vector<int64_t> sig;
    for (size_t k = 0; k < sd.keys.size(); ++k) {
      Op op;
      op.kind = OpKind::collective;
      op.group = sd.keys[k].kind;
      op.tp = sd.keys[k].tp;
      op.tp_big = sd.keys[k].tp_big;
      const int g = resolve_group(layout, r, op);
      rank_groups[rk.gbase + k] = g;
      if (g < 0) {
        sig.push_back(-1);
        continue;
      }
      sig.push_back(sig_of(g));
    }
    for (int ch = 0; ch < 2; ++ch) {
      Op op;
      op.kind = OpKind::send;
      op.group = ch == 0 ? GroupKind::pp_next : GroupKind::pp_prev;
      const int peer = resolve_peer(layout, r, op);
      rk.ch[ch].peer = peer;
      sig.push_back(peer < 0 ? -1 : (peer / G == rk.node ? 1 : 0));
    }
    if (rk.ch[1].peer == rk.ch[0].peer) rk.chmap[1] = 0;
    auto& list = sigs[rk.stage];
    size_t cls = 0;
    while (cls < list.size() && list[cls] != sig) ++cls;
    if (cls == list.size()) {
      list.push_back(sig);
      sd.rep.push_back(r);
    }
    rk.cls = int(cls);
  }
}

}  // namespace stratagem::sim
