// Rank symmetry: which ranks behave identically, so that one representative per class is
// simulated for all of them.
//
// A candidate map rep_of (rank -> representative of the same stage) is accepted only when the
// representatives' run, copied to every rank of their classes, is itself a run of the full
// simulation (the engine being deterministic, it is then the run):
//  - a rank and its representative are in the same rank class (same op costs);
//  - for every rank m and group key k, rep_of maps m's group onto exactly the representatives
//    in its representative's group (so a collective starts when its represented members have
//    arrived and ends when they have finished, as it would with all members);
//  - rep_of of m's pipeline peer is its representative's peer; of m's cp ring peer, the
//    representative of its representative's peer (the engine then points the representative's
//    ring channels at those representatives, itself included: the ring runs in lockstep);
//  - every node's ranks map onto the ranks of one node, with the same count per representative,
//    so that a NIC carries, per representative flow, `nic_mult` identical flows. Under
//    proportional sharing k identical flows of share w progress exactly like one flow of share
//    k w (the rate depends only on the sum of shares), so the representative's NIC flows join
//    with their share multiplied. NVSwitch ports and PCIe links are per GPU: only the rank
//    itself loads them.
// Candidates are rep_of(stage, local) = (stage, local mod q) for the divisors q of the ranks per
// stage, smallest first (q = 1: one representative per stage). When none holds, every rank is
// simulated.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/rank_state.hpp"
#include "sim/stage_data.hpp"
#include "stratagem/layout.hpp"

namespace stratagem::sim {

struct Symmetry {
  bool reduced = false;           // some rank is represented by another
  std::vector<int32_t> rep_of;    // per rank: its representative (itself when simulated)
  std::vector<int32_t> nic_mult;  // per simulated rank: ranks of its node it stands for
  std::vector<int32_t> reps;      // the simulated ranks, ascending
};

// Every rank simulated (the full simulation).
Symmetry no_symmetry(int world_size);

Symmetry find_symmetry(const std::vector<RankState>& ranks, const std::vector<StageData>& stages,
                       const std::vector<int32_t>& rank_groups, const Layout& layout,
                       int gpus_per_node);

}  // namespace stratagem::sim
