// The system layer: the communication ops of the ranks, matched and run. The members of a
// collective meet (collectives.cpp), pipeline sends meet their recvs in order per channel and
// host copies run (transfers.cpp); their bytes are flows on the network's shared links
// (flows.cpp). Under MPI their cross-process parts go to the other processes as messages and
// come back through apply(). The records it keeps are in collectives.hpp.
//
// The rank streams above it (CommOps, the engine) start the ops and are told when an op's data
// starts or stops moving and when the op completes.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "sim/collectives.hpp"
#include "sim/event_queue.hpp"
#include "sim/pdes.hpp"
#include "sim/pdes_driver.hpp"
#include "sim/pool.hpp"
#include "sim/rank_state.hpp"
#include "sim/resources.hpp"
#include "sim/stage_data.hpp"
#include "sim/types.hpp"

namespace stratagem::sim {

// The complete_op() xfer of an op that moved data from its start on.
constexpr Time kMovedSinceStart = -1;

// The layer above: the streams of the ranks.
class CommOps {
 public:
  // Opens (b = when the bytes start moving) or closes (b = kNever) the data-movement window of
  // stream s of r, `now` being the present.
  virtual void set_moving_since(RankState& r, int s, Time b, Time now) = 0;
  // The op at the head of stream s of r completed at t. xfer: how long it moved data
  // (kMovedSinceStart: since it started); inline_: while its stream is being advanced.
  virtual void complete_op(RankState& r, int s, Time t, bool inline_, Time xfer) = 0;

 protected:
  ~CommOps() = default;
};

// A flow's share of its resource: on a NIC, the rank's flow stands for its node's ranks that it
// represents (sim/symmetry.hpp).
inline int64_t flow_share(const RankState& r, const CommSplit& cp) {
  return cp.link == LinkClass::inter_node ? cp.share * r.nic_mult : cp.share;
}

class Matcher final : public FlowOwners {
 public:
  Matcher(CommOps& ops, std::vector<RankState>& ranks, const std::vector<int32_t>& rank_groups,
          EventQueue& queue, Network& network, PdesDriver& pdes)
      : ops_(ops),
        ranks_(ranks),
        rank_groups_(rank_groups),
        queue_(queue),
        network_(network),
        pdes_(pdes) {}

  // group_sizes: the simulated members of each group, which its collectives wait for.
  void init(const std::vector<int32_t>& group_sizes) { collectives_.init(group_sizes); }

  // The op at the head of stream s of r starts at t, the present (sends and copies start moving
  // data; a recv completes at once when its data is there, which it returns).
  void arrive(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  void start_send(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  void start_copy(RankState& r, const StageData& sd, int s, const Step& step, Time t);
  bool start_recv(RankState& r, int s, const Step& step, Time t);

  // kEvColl, kEvCollDone, kEvXfer, kEvXferDone, kEvDeliver (other events are not its own).
  void handle(const Ev& e);
  // A message from another process, received at `now`.
  void apply(const Msg& m, Time now);
  // Re-schedules the completion events of the owners whose flows' predictions changed.
  void flush_owners();

  const CollectiveTable& collectives() const { return collectives_; }
  const TransferPool& transfers() const { return transfers_; }

 private:
  // ---- collectives (collectives.cpp) ----
  void coll_start(int id, Time now);
  void coll_update(int id);
  void coll_data_done(int id, Time t);  // kEvColl
  void coll_finish(int id, Time t);
  // ---- transfers (transfers.cpp) ----
  int open_xfer(XKind kind, const RankState& r, int s, Time t, const CommSplit& cp);
  void xfer_data_done(int id, Time t);  // kEvXfer
  void xfer_done(int id, Time t);       // kEvXferDone
  void xfer_update(int id);
  void deliver(int dst, int ch, uint64_t seq, Time a, Time xfer, Time now);
  // ---- flows (flows.cpp) ----
  // A flow joins a resource (and its replicas on other processes when a local op owns it).
  void join_flow(int res, int64_t work, int64_t share, Time join, OwnerKind kind, int owner,
                 int slot, Time now);
  void finish_changed(OwnerKind kind, int32_t owner, int32_t slot, Time fin) override;
  void mark_owner(OwnerKind kind, int id);

  CommOps& ops_;
  std::vector<RankState>& ranks_;
  const std::vector<int32_t>& rank_groups_;
  EventQueue& queue_;
  Network& network_;
  PdesDriver& pdes_;
  CollectiveTable collectives_;
  TransferPool transfers_;
  Pool<Delivery> deliveries_;
  std::vector<std::pair<OwnerKind, int32_t>> owners_to_update_;
};

}  // namespace stratagem::sim
