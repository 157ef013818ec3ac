// The Program's prefetching streams (h2d, dp) running ahead of the rank's place in the Program
// (exec/run_ahead.cpp): the dispatcher starts them with the step and lets them go on where time
// passes on the rank; they run their ops through it.
#pragma once
#include <cstdint>

#include "src/runtime/exec/handlers.hpp"
#include "src/runtime/exec/streams.hpp"

namespace stratagem::exec {

class RunAhead {
 public:
  RunAhead(RankContext& rank, Dispatcher& dispatcher) : rank_(rank), dispatcher_(dispatcher) {}

  void start();  // at the step's start: each stream at its first op
  bool run();    // runs what may start now; whether anything ran
  // CPU backend, at an alloc: the dp stream's frees that wait only for reductions issued
  // before the rank's computation `compute`.
  void land_reductions_before(int64_t compute);
  bool may_soon_run() const;  // a stream's next op waits only for transfers in flight

 private:
  bool waits_only_on_issued(uint32_t op) const;
  bool may_run(const Streams::Ahead& a, uint32_t op);
  void free_landed_before(uint32_t op);

  RankContext& rank_;
  Dispatcher& dispatcher_;
};

}  // namespace stratagem::exec
