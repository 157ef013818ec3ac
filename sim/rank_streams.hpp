// The streams of a rank: where each stream stands in its stage's Program and whether the op at
// its head may start. Functions of the rank's cursors (RankState) and the stage's index
// (StageData) alone; what starting an op does is the engine's (engine.cpp).
#pragma once
#include <cstdint>

#include "sim/rank_state.hpp"
#include "sim/stage_data.hpp"
#include "sim/types.hpp"

namespace stratagem::sim {

// Stream s has run all its ops of every iteration (or has none).
inline bool stream_done(const RankState& r, const StageData& sd, int s, int iterations) {
  return sd.stream_length[s] == 0 || r.iteration[s] >= uint32_t(iterations);
}

// Some stream of r has ops left.
inline bool unfinished(const RankState& r, const StageData& sd, int iterations) {
  for (int s = 0; s < kStreams; ++s)
    if (!stream_done(r, sd, s, iterations)) return true;
  return false;
}

// Whether `step`, at the head of stream s, may start: its dependencies have completed, and at an
// iteration boundary every stream of the rank has finished the previous iteration.
inline bool head_ready(const RankState& r, const StageData& sd, int s, const Step& step) {
  const uint32_t it = r.iteration[s];
  if (r.position[s] == 0 && it > 0)
    for (int s2 = 0; s2 < kStreams; ++s2)
      if (sd.stream_length[s2] && r.iteration[s2] < it) return false;
  const uint32_t* d = sd.dep_at.data() + step.dep_begin;
  for (uint32_t k = 0; k < step.dep_count; ++k) {
    const uint32_t sdp = dep_stream(d[k]);
    if (r.iteration[sdp] < it || (r.iteration[sdp] == it && r.position[sdp] <= dep_pos(d[k])))
      return false;
  }
  return true;
}

// Whether another stream of r can allocate now, at an op the Program orders before `op` of
// iteration `it` on stream s: a free that follows such an alloc in program order waits for it
// (Engine::advance).
inline bool earlier_alloc_ready(const RankState& r, const StageData& sd, int s, uint32_t it,
                                uint32_t op, int iterations) {
  for (int s2 = 0; s2 < kStreams; ++s2) {
    if (s2 == s || r.running[s2] || stream_done(r, sd, s2, iterations)) continue;
    const Step& head = sd.steps[s2][r.position[s2]];
    if (head.kind == OpKind::alloc &&
        (r.iteration[s2] < it || (r.iteration[s2] == it && head.op < op)) &&
        head_ready(r, sd, s2, head))
      return true;
  }
  return false;
}

// Moves stream s past its head op (to the next iteration after its last op).
inline void step_past_head(RankState& r, const StageData& sd, int s) {
  if (++r.position[s] == sd.stream_length[s]) {
    r.position[s] = 0;
    ++r.iteration[s];
  }
}

}  // namespace stratagem::sim
