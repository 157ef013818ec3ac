// Parallel simulation under MPI: conservative, window-synchronous PDES (YAWNS-like). The
// simulated ranks are partitioned over processes; events that cross processes are messages,
// exchanged once per window. A window runs to the earliest time at which any process could
// affect another (its earliest output time), which latency makes later than the present: a
// transfer's head separates an arrival from the moment bytes start moving, its tail the end of
// the data movement from completion, and a send's whole duration its start from the data's
// arrival. The window loop and the placement of ranks are PdesDriver's (pdes_driver.hpp), the
// protocol's receiving side (applying messages) the system layer's (Matcher::apply).
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "sim/collectives.hpp"
#include "sim/rank_state.hpp"
#include "sim/resources.hpp"
#include "sim/stage_data.hpp"
#include "sim/types.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::sim {

// kMsgArrive: a member arrived at a collective; kMsgFinish: a process's members of a
// collective finished; kMsgJoin: a flow joined a replicated NIC; kMsgDeliver: pipeline data
// arrives at a receiver.
enum MsgType : uint8_t { kMsgArrive, kMsgFinish, kMsgJoin, kMsgDeliver };
struct Msg {
  MsgType type;
  int32_t i0, i1;
  uint64_t u;
  Time t0, t1, effect;  // effect: the earliest time the message can change the receiver's state
  int64_t x, y;
};

// Waits for a non-blocking collective, yielding the core between polls: when processes share
// cores (mpirun --oversubscribe, or a loaded machine), a spinning waiter would otherwise take
// the time slice of the process it waits for.
void wait_yielding(MPI_Request* req);

// Which process simulates each rank, and what that makes cross-process.
struct Partition {
  int me = 0;
  std::vector<int> owner, local_ranks;
  std::vector<std::vector<int>> group_procs;  // processes holding members of each group
  std::vector<std::vector<int>> res_holders;  // NICs split over processes: each holds a replica
  std::vector<uint8_t> group_nic_shared;      // a local member's NIC is replicated
  bool local(int rank) const { return owner[rank] == me; }
};

// Whole pipeline stages per process when procs <= pp (contiguous blocks), otherwise contiguous
// blocks of ranks; mirror: process r simulates rank r; single: process 0 simulates everything.
// Only the ranks that represent themselves (rep_of[r] == r) are simulated, and only they make
// groups and NICs cross processes.
Partition partition_ranks(const Layout& layout, const Network& net, int gpus_per_node, int procs,
                          int me, bool mirror, bool single, const std::vector<int32_t>& rep_of);

// The cross-process events of one window, per destination process.
class Mailbox {
 public:
  void init(int procs) { out_.assign(procs, {}); }
  void send(int proc, const Msg& m) { out_[proc].push_back(m); }
  bool any() const;
  Time earliest_effect() const;
  // Collective over `comm`: sends every process its messages, returns the ones received.
  std::vector<Msg> exchange(MPI_Comm comm);

 private:
  std::vector<std::vector<Msg>> out_;
};

// A process's earliest output time: for each local rank's next op that sends events to other
// processes (a boundary op), a lower bound of its start plus the op's least delay to their
// effect; and for collectives and sends in flight, their earliest possible finish plus tail.
class Lookahead {
 public:
  // Finds the boundary ops of the local ranks. Returns false when one has no latency, i.e. the
  // parallel simulation would have no lookahead.
  bool init(int procs, const Partition& part, const std::vector<RankState>& ranks,
            const std::vector<StageData>& stages, const std::vector<int32_t>& rank_groups,
            const Network& net);
  // No boundary ops (every rank on process 0).
  void clear(size_t local_ranks);
  void track_collective(int32_t id, uint64_t serial) { cross_colls_.push_back({id, serial}); }
  void track_transfer(int32_t id, uint64_t serial) { cross_xfers_.push_back({id, serial}); }
  // glb: the earliest pending event of this process (not kNever).
  Time earliest_output(Time glb, const std::vector<RankState>& ranks,
                       const std::vector<StageData>& stages, int iterations,
                       const CollectiveTable& colls, const TransferPool& xfers);
  size_t boundary_ranks() const { return ranks_with_boundary_ops_.size(); }

 private:
  struct BoundaryOp {
    uint32_t pos, op;
    Time delay;
  };
  std::vector<std::array<std::vector<BoundaryOp>, kStreams>> boundary_ops_;  // per local index
  // Per local index and stream: the next boundary op not yet started (iteration, list index).
  std::vector<std::array<std::pair<uint32_t, uint32_t>, kStreams>> next_boundary_;
  std::vector<int> ranks_with_boundary_ops_;
  std::vector<std::pair<int32_t, uint64_t>> cross_colls_, cross_xfers_;  // (id, serial)
};

}  // namespace stratagem::sim
