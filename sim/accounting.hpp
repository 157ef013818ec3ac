// Time accounting of a rank's compute stream: busy time by phase, and each idle gap before a
// kernel charged to what the kernel waited for. The part of a gap during which the awaited op
// moved data is exposed tp/dp/pp/offload/ep communication; the rest (waiting for another rank
// to reach a collective or to send) is bubble. The nine parts sum to the makespan.
#pragma once
#include <array>
#include <cstdint>

#include "sim/rank_state.hpp"
#include "sim/stage_data.hpp"
#include "sim/types.hpp"

namespace stratagem::sim {

using Breakdown = std::array<int64_t, 11>;  // ns by Cat (kCompute .. kHost)

inline void charge_busy(RankState& r, const Step& step, Time busy) {
  r.busy_and_waits[step.busy_cat] += busy;
}

// The compute stream idled until t, when kernel `op` starts.
void charge_gap(RankState& r, const StageData& sd, const Step& step, Time t);

// Charges `gap` to `acc` as waiting for the op that last completed on stream s (s < 0: none).
void charge_wait(const RankState& r, int s, Time gap, Breakdown& acc);

// The rank's breakdown over the whole run (into r.res): after its last kernel, its last
// transfers and then waiting for the others until the makespan.
void finish_accounting(RankState& r, Time makespan);

}  // namespace stratagem::sim
