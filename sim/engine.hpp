// The simulator's core: owns the layers and runs the event loop (see sim/README.md). The parts
// it holds each keep one thing: the event queue (EventQueue), each rank's progress (RankState;
// the rules of its streams in rank_streams.hpp), the network and its shared links (Network),
// the memory ledger (MemoryLedger), the trace's records (TraceRecorder), the open collectives
// and transfers (CollectiveTable, TransferPool) and, under MPI, the partition, mailbox and
// lookahead (pdes.hpp). The engine decides what starting and completing an op does to them.
//
// Layers, top to bottom: the workload (StageData: each stage's Program with its costs), the
// per-rank progress through it (RankState: streams, compute kernel, memory, accounting), the
// system layer (collectives matched per group, pipeline sends/recvs matched per channel,
// host copies; collectives.cpp, transfers.cpp, flows.cpp) and the network (Network: shared
// links as a fluid model). Under MPI the PDES scheme (pdes.hpp) decides how far each window may
// run.
//
// Same-time completions of a rank are all applied before that rank's streams advance (in
// stream order), so the outcome depends neither on the order in which same-time events are
// popped nor on how ranks are spread over processes.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "sim/collectives.hpp"
#include "sim/event_queue.hpp"
#include "sim/interference.hpp"
#include "sim/memory_timeline.hpp"
#include "sim/pdes.hpp"
#include "sim/pool.hpp"
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

class Engine final : private FlowOwners {
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
        consumed_program_(release) {}

  SimResult run();

 private:
  // ---- setup and the event loop (engine.cpp) ----
  void setup();
  void partition(bool single);
  void run_until(Time H);
  Time run_windows();  // the PDES loop; returns the time of the last event
  void handle(const Ev& e);
  void apply(const Msg& m);  // an event from another process
  void flush_dirty(Time t);
  void mark_dirty(RankState& r) {
    if (!r.dirty) {
      r.dirty = true;
      dirty_ranks_.push_back(r.rank);
    }
  }
  void advance(RankState& r, Time t);
  bool start_op(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  // xfer: how long the op moved data (-1: since it started); waiting for peers is not counted.
  // inline_: completed while its stream is being advanced, which then goes on by itself.
  void complete_op(RankState& r, int s, Time t, bool inline_, Time xfer = -1) {
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
  // A flow's share of its resource: on a NIC, the rank's flow stands for its node's ranks
  // that it represents (sim/symmetry.hpp).
  static int64_t share_of(const RankState& r, const CommSplit& cp) {
    return cp.link == LinkClass::inter_node ? cp.share * r.nic_mult : cp.share;
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
  void set_moving_since(RankState& r, int s, Time b, Time now) {
    r.moving_since[s] = b;
    refresh_compute(r, now);
  }

  // ---- the system layer (collectives.cpp, transfers.cpp) ----
  void arrive(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  void coll_start(int id, Time now);
  void coll_update(int id);
  void coll_data_done(int id, Time t);  // kEvColl
  void coll_finish(int id, Time t);
  int open_xfer(XKind kind, const RankState& r, int s, Time t, const CommSplit& cp);
  void start_send(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  void start_copy(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  bool start_recv(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  void xfer_data_done(int id, Time t);  // kEvXfer
  void xfer_done(int id, Time t);       // kEvXferDone
  void xfer_update(int id);
  void deliver(int dst, int ch, uint64_t seq, Time a, Time xfer, Time now);
  // A flow joins a resource (and its replicas on other processes when a local op owns it).
  void join_flow(int res, int64_t work, int64_t share, Time join, OwnerKind kind, int owner,
                 int slot);
  void finish_changed(OwnerKind kind, int32_t owner, int32_t slot, Time fin) override;
  void mark_owner(OwnerKind kind, int id);
  void flush_owners();

  // ---- PDES ----
  bool local(int rank) const { return partition_.local(rank); }
  void send_msg(int proc, const Msg& m) {
    mailbox_.send(proc, m);
    ++stats_.messages;
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
  MPI_Comm comm_ = MPI_COMM_NULL;
  int procs_ = 1, my_proc_ = 0;
  int64_t slowed_rate_ = kS;  // kernel progress per ns while communication overlaps it
  MemoryLedger memory_;

  std::vector<StageData> stages_;
  std::vector<RankState> ranks_;
  std::vector<int32_t> rank_groups_;
  Symmetry symmetry_;
  Partition partition_;
  Network network_;
  CollectiveTable collectives_;
  TransferPool transfers_;
  Pool<Delivery> deliveries_;
  std::vector<std::pair<OwnerKind, int32_t>> owners_to_update_;
  EventQueue queue_;
  std::vector<int> dirty_ranks_, ranks_to_advance_;
  Time now_ = 0;
  Time last_event_ = 0;

  Mailbox mailbox_;
  Lookahead lookahead_;

  SimStats stats_;
  TraceRecorder trace_;
};

}  // namespace stratagem::sim
