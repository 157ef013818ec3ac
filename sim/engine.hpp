// The simulator's core: owns the layers and runs the event loop (see sim/README.md). The parts
// it holds each keep one thing: the event queue (EventQueue), each rank's progress (RankState;
// the rules of its streams in rank_streams.hpp), the network and its shared links (Network),
// the memory ledger (MemoryLedger), the trace's records (TraceRecorder), the system layer that
// matches and runs the communication ops (Matcher) and, under MPI, the driver that places the
// ranks on processes and runs the event loop window by window (PdesDriver). The engine decides
// what starting and completing an op does to a rank.
//
// Layers, top to bottom: the workload (StageData: each stage's Program with its costs), the
// per-rank progress through it (RankState: streams, compute kernel, memory, accounting), the
// system layer (Matcher: collectives matched per group, pipeline sends/recvs matched per
// channel, host copies) and the network (Network: shared links as a fluid model). Under MPI the
// PDES scheme (pdes.hpp) decides how far each window may run.
//
// Same-time completions of a rank are all applied before that rank's streams advance (in
// stream order), so the outcome depends neither on the order in which same-time events are
// popped nor on how ranks are spread over processes.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sim/event_queue.hpp"
#include "sim/interference.hpp"
#include "sim/matcher.hpp"
#include "sim/memory_timeline.hpp"
#include "sim/pdes.hpp"
#include "sim/pdes_driver.hpp"
#include "sim/rank_state.hpp"
#include "sim/rank_streams.hpp"
#include "sim/resources.hpp"
#include "sim/stage_data.hpp"
#include "sim/symmetry.hpp"
#include "sim/trace_recorder.hpp"
#include "sim/types.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::sim {

// The deadlock report from each process's descriptions of its stuck ranks (deadlock.cpp).
std::string deadlock_message(Time last, const std::vector<int>& stuck_ranks, int world,
                             const std::string& desc);

class Engine final : private CommOps, private WindowedSimulation {
 public:
  // `release` (optional, the same Program as `prog`): its stages' ops are freed once indexed
  // (simulate_consuming()).
  Engine(const Program& prog, const Layout& layout, const ClusterSpec& cluster,
         const OpCosts& costs, const SimOptions& opt, Program* release = nullptr)
      : program_(prog),
        layout_(layout),
        cluster_(cluster),
        costs_(costs),
        options_(opt),
        consumed_program_(release),
        matcher_(*this, ranks_, rank_groups_, queue_, network_, pdes_) {}

  SimResult run();

 private:
  // ---- setup and the event loop (engine.cpp) ----
  void setup();
  Time run_until(Time H) override;  // returns the time of the last event
  // The window loop's side of it (PdesDriver::run).
  Time earliest_event() const override {
    return !dirty_ranks_.empty() ? now_ : queue_.empty() ? kNever : queue_.top().t;
  }
  Time earliest_output(Time glb) override {
    return pdes_.lookahead().earliest_output(glb, ranks_, stages_, iterations_,
                                             matcher_.collectives(), matcher_.transfers());
  }
  void receive(const std::vector<Msg>& received, Time horizon) override;
  void handle(const Ev& e);
  void flush_dirty(Time t);
  void mark_dirty(RankState& r) {
    if (!r.dirty) {
      r.dirty = true;
      dirty_ranks_.push_back(r.rank);
    }
  }
  void advance(RankState& r, Time t);
  bool start_op(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  // xfer: how long the op moved data (kMovedSinceStart: since it started); waiting for peers is
  // not counted. inline_: completed while its stream is being advanced, which then goes on by
  // itself.
  void complete_op(RankState& r, int s, Time t, bool inline_,
                   Time xfer = kMovedSinceStart) override {
    const StageData& sd = stages_[r.stage];
    const Step& step = sd.steps[s][r.position[s]];
    trace_.op_done(r.local_index, step.op, r.iteration[s], r.op_start[s], t);
    r.running[s] = 0;
    r.last_done[s] = t;
    r.last_done_cat[s] = step.cat;
    r.last_done_moving_ns[s] = xfer >= 0 ? xfer : t - r.op_start[s];
    r.end_time = std::max(r.end_time, t);
    ++r.ops_done;
    step_past_head(r, sd, s);
    if (sd.host_issue && r.position[s] == 0) host_next_iteration(r, sd, t);
    if (!inline_) mark_dirty(r);
  }
  void start_compute(RankState& r, const Step& step, Time t);
  bool host_issued(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  // Once every stream of r has finished the host's iteration, the host begins the next at t.
  static void host_next_iteration(RankState& r, const StageData& sd, Time t) {
    for (int s = 0; s < kStreams; ++s)
      if (sd.stream_length[s] && r.iteration[s] <= r.host_iteration) return;
    ++r.host_iteration;
    r.host_origin = t;
  }
  void refresh_compute(RankState& r, Time now) {
    if (!r.kernel.running || slowed_rate_ == kS) return;
    kernel_consume(r.kernel, r.moving_since, slowed_rate_, now);
    const Time e = kernel_end(r.kernel, r.moving_since, slowed_rate_);
    if (e != r.kernel.end) {
      r.kernel.end = e;
      queue_.push(e, kEvCompute, uint32_t(r.rank), ++r.kernel.ver);
    }
  }
  // Opens (b = when the bytes start moving) or closes (b = kNever) stream s's window.
  void set_moving_since(RankState& r, int s, Time b, Time now) override {
    r.moving_since[s] = b;
    refresh_compute(r, now);
  }

  // ---- results (results.cpp, deadlock.cpp) ----
  SimResult results(Time last);
  bool unfinished(const RankState& r) const {
    return sim::unfinished(r, stages_[r.stage], iterations_);
  }
  std::string describe_stuck(const RankState& r) const;

  const Program& program_;
  const Layout& layout_;
  const ClusterSpec& cluster_;
  const OpCosts& costs_;
  const SimOptions& options_;
  // Non-null: program_'s ops are freed at setup (op names are then unknown).
  Program* consumed_program_;

  int world_size_ = 0, iterations_ = 1, gpus_per_node_ = 1;
  int64_t slowed_rate_ = kS;  // kernel progress per ns while communication overlaps it
  MemoryLedger memory_;

  std::vector<StageData> stages_;
  std::vector<RankState> ranks_;
  std::vector<int32_t> rank_groups_;
  Symmetry symmetry_;
  Network network_;
  EventQueue queue_;
  std::vector<int> dirty_ranks_, ranks_to_advance_;
  Time now_ = 0;
  Time last_event_ = 0;

  SimStats stats_;
  TraceRecorder trace_;
  PdesDriver pdes_;
  Matcher matcher_;  // after what it refers to
};

}  // namespace stratagem::sim
