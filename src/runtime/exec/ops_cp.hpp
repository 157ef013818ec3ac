// A context-parallel attention's ops on this rank (exec/ops_cp.cpp): the pass of the op's
// phase (made at its first op), its core steps, its end (before post in forward, pre in
// backward) and its cp transfers. The compute handler runs pre and post around them.
#pragma once
#include "src/runtime/exec/handlers.hpp"
#include "src/runtime/exec/step_state.hpp"
#include "stratagem/program.hpp"

namespace stratagem::exec {

class CpOps {
 public:
  CpOps(RankContext& rank, Dispatcher& dispatcher) : rank_(rank), dispatcher_(dispatcher) {}

  CpRun& run_of(const Op& op);          // the pass of op's phase, started at its first op
  int work_buffer(const Op& op) const;  // the pass's working buffer in the Program
  void core(const Op& op);
  void finish(const Op& op);
  void transfer(const Op& op, int index);

 private:
  RankContext& rank_;
  Dispatcher& dispatcher_;
};

}  // namespace stratagem::exec
