// Finding the rank symmetry of a plan (see symmetry.hpp for the conditions and why they
// suffice).
#include "sim/symmetry.hpp"

#include <algorithm>
#include <map>

namespace stratagem::sim {
namespace {

// Checks the conditions of symmetry.hpp for `rep_of`; fills nic_mult when they hold.
bool holds(const std::vector<int32_t>& rep_of, std::vector<int32_t>& nic_mult,
           const std::vector<RankState>& ranks, const std::vector<StageData>& stages,
           const std::vector<int32_t>& rank_groups, const Layout& layout, int G) {
  const int W = int(ranks.size());
  auto is_rep = [&](int r) { return rep_of[r] == r; };
  for (int m = 0; m < W; ++m) {
    const RankState& a = ranks[m];
    const RankState& b = ranks[rep_of[m]];
    if (a.stage != b.stage || a.rank_class != b.rank_class) return false;
    for (int ch = 0; ch < 4; ++ch) {
      const int pa = a.channels[ch].peer, pb = b.channels[ch].peer;
      if ((pa < 0) != (pb < 0)) return false;
      // Pipeline peers: m's peer is represented by its representative's peer. cp ring peers
      // (channels 2, 3) may share a representative with the rank itself: the ring's ranks run
      // in lockstep, so the representative sends to the one that stands for its peer (itself
      // when the whole ring is one class) and receives what it sent.
      if (pa >= 0 && rep_of[pa] != (ch < 2 ? pb : rep_of[pb])) return false;
    }
  }
  // Groups: the image of m's group must be the representatives of its representative's group.
  const auto& groups = layout.groups();
  std::vector<std::vector<int32_t>> image(groups.size()), reps_in(groups.size());
  std::vector<uint8_t> have_image(groups.size(), 0), have_reps(groups.size(), 0);
  std::vector<int32_t> partner(groups.size(), -1);
  for (int m = 0; m < W; ++m) {
    const RankState& a = ranks[m];
    const RankState& b = ranks[rep_of[m]];
    const size_t keys = stages[a.stage].group_keys.size();
    for (size_t k = 0; k < keys; ++k) {
      const int g = rank_groups[a.group_row + k], h = rank_groups[b.group_row + k];
      if ((g < 0) != (h < 0)) return false;
      if (g < 0 || partner[g] == h) continue;
      if (!have_image[g]) {
        for (int x : groups[g].ranks) image[g].push_back(rep_of[x]);
        std::sort(image[g].begin(), image[g].end());
        image[g].erase(std::unique(image[g].begin(), image[g].end()), image[g].end());
        have_image[g] = 1;
      }
      if (!have_reps[h]) {
        for (int x : groups[h].ranks)
          if (is_rep(x)) reps_in[h].push_back(x);
        std::sort(reps_in[h].begin(), reps_in[h].end());
        have_reps[h] = 1;
      }
      if (image[g] != reps_in[h]) return false;
      partner[g] = h;
    }
  }
  // Nodes: each node's ranks map onto one node's ranks, the same number per representative.
  const int nodes = (W + G - 1) / G;
  auto census = [&](int n) {
    std::map<int32_t, int32_t> c;
    for (int r = n * G; r < std::min(W, (n + 1) * G); ++r) ++c[rep_of[r]];
    return c;
  };
  std::vector<std::map<int32_t, int32_t>> own(nodes);
  std::vector<uint8_t> have_own(nodes, 0);
  for (int n = 0; n < nodes; ++n) {
    const auto c = census(n);
    const int home = c.begin()->first / G;
    for (const auto& [q, cnt] : c)
      if (q / G != home) return false;
    if (!have_own[home]) {
      own[home] = census(home);
      have_own[home] = 1;
    }
    if (c != own[home]) return false;
  }
  nic_mult.assign(W, 0);
  for (int n = 0; n < nodes; ++n)
    if (have_own[n])
      for (const auto& [q, cnt] : own[n]) nic_mult[q] = cnt;
  return true;
}

}  // namespace

Symmetry no_symmetry(int world_size) {
  Symmetry s;
  s.rep_of.resize(world_size);
  s.reps.resize(world_size);
  for (int r = 0; r < world_size; ++r) s.rep_of[r] = s.reps[r] = r;
  s.nic_mult.assign(world_size, 1);
  return s;
}

Symmetry find_symmetry(const std::vector<RankState>& ranks, const std::vector<StageData>& stages,
                       const std::vector<int32_t>& rank_groups, const Layout& layout,
                       int gpus_per_node) {
  const int W = layout.world_size();
  const int D = layout.devices_per_stage();
  std::vector<int32_t> rep_of(W), mult;
  for (int q = 1; q < D; ++q) {
    if (D % q) continue;
    for (int r = 0; r < W; ++r) rep_of[r] = int32_t(r - r % D + (r % D) % q);
    if (!holds(rep_of, mult, ranks, stages, rank_groups, layout, std::max(1, gpus_per_node)))
      continue;
    Symmetry s;
    s.reduced = true;
    s.rep_of = std::move(rep_of);
    s.nic_mult = std::move(mult);
    for (int r = 0; r < W; ++r)
      if (s.rep_of[r] == r) s.reps.push_back(r);
    return s;
  }
  return no_symmetry(W);
}

}  // namespace stratagem::sim
