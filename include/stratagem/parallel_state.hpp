// ParallelState: the one owner of this rank's parallel groups (as Megatron-core's
// parallel_state). It holds the Layout, this rank's coordinates, and one communicator per
// distinct group of the Layout that contains this rank, built once, collectively, in the same
// order on every rank. The executor resolves an op's group or peer through the Layout
// (resolve_group / resolve_peer) and asks here for the communicator.
#pragma once
#include <mpi.h>

#include <map>
#include <memory>
#include <vector>

#include "stratagem/comm.hpp"
#include "stratagem/layout.hpp"

namespace stratagem {

// The order communicators are created in: one entry per distinct member list of the Layout's
// groups, in Layout order (a later group with the same members shares the first one's). Every
// rank computes the same list, so collective creation (MPI_Comm_split, NCCL's unique-id
// broadcast) matches across ranks. `position` is this rank's index in `ranks`, or -1.
struct CommToCreate {
  std::vector<int> ranks;
  std::vector<int> group_ids;        // every Layout group with these members
  GroupKind kind = GroupKind::none;  // the first one's (names the communicator)
  int position = -1;
};
std::vector<CommToCreate> communicator_order(const Layout& layout, int rank);

class ParallelState {
 public:
  // Collective over `world`, whose size must be the plan's world size (InputError otherwise).
  // Transfers that wait longer than comm_timeout_s end the job with CommTimeout (<= 0: never).
  // `make_comm` builds each communicator (world first, then the distinct groups in
  // communicator_order); empty: MPI.
  ParallelState(MPI_Comm world, const Plan& plan, const ClusterSpec& cluster, double comm_timeout_s,
                const CommFactory& make_comm = {});
  ~ParallelState();
  ParallelState(const ParallelState&) = delete;
  ParallelState& operator=(const ParallelState&) = delete;

  const Layout& layout() const { return layout_; }
  const ClusterSpec& cluster() const { return cluster_; }
  int rank() const { return rank_; }
  const RankCoords& coords() const { return coords_; }
  int stage() const { return coords_.stage; }
  int tp_index(int tp) const { return RankGeometry::tp_index(coords_.local, tp); }
  int dp_index(int tp) const { return RankGeometry::dp_cp_index(coords_.local, tp); }

  // This rank's communicator of Layout group `id` (throws when the rank is not a member).
  Communicator& group(int id);
  // The whole job: point-to-point between pipeline stages, and the step's scalars.
  Communicator& world() { return *world_comm_; }
  MPI_Comm world_mpi() const { return world_; }

 private:
  MPI_Comm world_;
  ClusterSpec cluster_;
  Layout layout_;
  int rank_ = 0;
  RankCoords coords_;
  std::vector<MPI_Comm> owned_;                            // freed on destruction
  std::map<int, std::shared_ptr<Communicator>> by_group_;  // member groups only
  std::unique_ptr<Communicator> world_comm_;
};

}  // namespace stratagem
