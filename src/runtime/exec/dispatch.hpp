// The op loop of one rank (exec/dispatch.cpp): the step's ops in the Program's order, each on
// the handler of its family after the transfers it depends on; a transfer's completion when an
// op needs what it moved (the prefetching streams run ahead while the rank waits); the
// memory samples of each memory event. The handlers complete their transfers here.
#pragma once
#include <cstdint>

#include "src/runtime/exec/handlers.hpp"
#include "stratagem/executor.hpp"
#include "stratagem/program.hpp"

namespace stratagem::exec {

class Dispatcher {
 public:
  Dispatcher(RankContext& rank, RunAhead& run_ahead, ComputeOps& compute, CommOps& comm,
             OffloadOps& offload)
      : rank_(rank), run_ahead_(run_ahead), compute_(compute), comm_(comm), offload_(offload) {}

  StepResult step(int64_t step);
  void run(uint32_t op);        // on its handler
  void run_timed(uint32_t op);  // run(), with its timing entry
  void complete(int op);        // waits for op's transfer and runs its completion (once)
  void complete_all();
  bool deps_landed(uint32_t op);    // every transfer op waits for has landed (tested, not waited)
  void complete_deps(uint32_t op);  // completes every transfer op waits for

 private:
  void run_alloc(const Op& op);
  void run_free(const Op& op);
  void poll_sends();
  void run_pending_free(uint32_t op);    // completes what the free waits for, then runs it
  void drain_frees_before(uint32_t op);  // runs the pending frees the Program puts before op
  void poll_frees();                     // runs the pending frees whose transfers have landed
  int64_t now_ns() const;
  void sample_memory();

  RankContext& rank_;
  RunAhead& run_ahead_;
  ComputeOps& compute_;
  CommOps& comm_;
  OffloadOps& offload_;
};

}  // namespace stratagem::exec
