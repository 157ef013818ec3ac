// The simulator's core: owns the layers and runs the event loop (see sim/README.md).
//
// Layers, top to bottom: the workload (StageData: each stage's Program with its costs), the
// per-rank progress through it (RankSt: streams, compute kernel, memory, accounting), the
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
#include "sim/resources.hpp"
#include "sim/stage_data.hpp"
#include "sim/symmetry.hpp"
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
      : prog_(prog), L_(layout), C_(cluster), costs_(costs), opt_(opt), release_(release) {}

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
  void mark_dirty(RankSt& r) {
    if (!r.dirty) {
      r.dirty = true;
      dirty_.push_back(r.rank);
    }
  }
  void advance(RankSt& r, Time t);
  bool earlier_alloc_ready(RankSt& r, const StageData& sd, int s, uint32_t it, uint32_t op);
  bool ready(const RankSt& r, const StageData& sd, int s, const Step& step) const;
  bool start_op(RankSt& r, const StageData& sd, int s, const Step& step, Time t);
  // xfer: how long the op moved data (-1: since it started); waiting for peers is not counted.
  // inline_: completed while its stream is being advanced, which then goes on by itself.
  void complete_op(RankSt& r, int s, Time t, bool inline_, Time xfer = -1) {
    const StageData& sd = stages_[r.stage];
    const Step& step = sd.steps[s][r.pos[s]];
    if (trace_) spans_[r.li].push_back({step.op, r.it[s], r.start[s], t});
    r.running[s] = 0;
    r.wake[s] = t;
    r.wake_cat[s] = step.cat;
    r.wake_dur[s] = xfer >= 0 ? xfer : t - r.start[s];
    r.end = std::max(r.end, t);
    ++r.ops;
    if (++r.pos[s] == sd.len[s]) {
      r.pos[s] = 0;
      ++r.it[s];
    }
    if (!inline_) mark_dirty(r);
  }
  void start_compute(RankSt& r, const Step& step, Time t);
  // A flow's share of its resource: on a NIC, the rank's flow stands for its node's ranks
  // that it represents (sim/symmetry.hpp).
  static int64_t share_of(const RankSt& r, const CommP& cp) {
    return cp.link == LinkClass::inter_node ? cp.w * r.nic_mult : cp.w;
  }
  void refresh_compute(RankSt& r, Time now) {
    if (!r.kernel.running || q_slow_ == kS) return;
    kernel_consume(r.kernel, r.act_b, q_slow_, now);
    const Time e = kernel_end(r.kernel, r.act_b, q_slow_);
    if (e != r.kernel.end) {
      r.kernel.end = e;
      queue_.push(e, kEvCompute, uint32_t(r.rank), ++r.kernel.ver);
    }
  }
  // Opens (b = when the bytes start moving) or closes (b = kNever) stream s's window.
  void set_act(RankSt& r, int s, Time b, Time now) {
    r.act_b[s] = b;
    refresh_compute(r, now);
  }

  // ---- the system layer (collectives.cpp, transfers.cpp) ----
  void arrive(RankSt& r, const StageData& sd, int s, const Step& step, Time t);
  void coll_start(int id, Time now);
  void coll_update(int id);
  void coll_data_done(int id, Time t);  // kEvColl
  void coll_finish(int id, Time t);
  int open_xfer(XKind kind, const RankSt& r, int s, Time t, const CommP& cp);
  void start_send(RankSt& r, const StageData& sd, int s, const Step& step, Time t);
  void start_copy(RankSt& r, const StageData& sd, int s, const Step& step, Time t);
  bool start_recv(RankSt& r, const StageData& sd, int s, const Step& step, Time t);
  void xfer_data_done(int id, Time t);  // kEvXfer
  void xfer_done(int id, Time t);       // kEvXferDone
  void xfer_update(int id);
  void deliver(int dst, int ch, uint64_t seq, Time a, Time xfer, Time now);
  // A flow joins a resource (and its replicas on other processes when a local op owns it).
  void join_flow(int res, int64_t work, int64_t w, Time join, OwnerKind kind, int owner, int slot);
  void finish_changed(OwnerKind kind, int32_t owner, int32_t slot, Time fin) override;
  void mark_owner(OwnerKind kind, int id);
  void flush_owners();

  // ---- PDES ----
  bool local(int rank) const { return part_.local(rank); }
  void send_msg(int proc, const Msg& m) {
    mail_.send(proc, m);
    ++stats_.messages;
  }

  // ---- results (results.cpp, deadlock.cpp) ----
  SimResult results(Time last);
  bool unfinished(const RankSt& r) const {
    const StageData& sd = stages_[r.stage];
    for (int s = 0; s < kStreams; ++s)
      if (sd.len[s] && r.it[s] < uint32_t(K_)) return true;
    return false;
  }
  std::string describe_stuck(const RankSt& r) const;

  const Program& prog_;
  const Layout& L_;
  const ClusterSpec& C_;
  const OpCosts& costs_;
  const SimOptions& opt_;
  Program* release_;  // non-null: prog_'s ops are freed at setup (op names are then unknown)

  int W_ = 0, K_ = 1, G_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int P_ = 1, me_ = 0;
  bool trace_ = false;
  int64_t q_slow_ = kS;  // kernel progress per ns while communication overlaps it
  MemoryModel memory_;

  std::vector<StageData> stages_;
  std::vector<RankSt> ranks_;
  std::vector<int32_t> rank_groups_;
  Symmetry sym_;
  Partition part_;
  Network net_;
  CollectiveTable colls_;
  TransferPool xfers_;
  Pool<Delivery> deliveries_;
  std::vector<std::pair<OwnerKind, int32_t>> dirty_owners_;
  EventQueue queue_;
  std::vector<int> dirty_, work_;
  Time now_ = 0;
  Time last_event_ = 0;

  Mailbox mail_;
  Lookahead lookahead_;

  SimStats stats_;
  SimOom oom_;
  std::vector<std::vector<SimOpSpan>> spans_;
  std::vector<std::vector<trace::MemorySample>> samples_;
};

}  // namespace stratagem::sim
