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

class ParallelState {
 public:
  // Collective over `world`, whose size must be the plan's world size (InputError otherwise).
  // Transfers that wait longer than comm_timeout_s end the job with CommTimeout (<= 0: never).
  ParallelState(MPI_Comm world, const Plan& plan, const ClusterSpec& cluster,
                double comm_timeout_s);
  ~ParallelState();
  ParallelState(const ParallelState&) = delete;
  ParallelState& operator=(const ParallelState&) = delete;

  const Layout& layout() const { return layout_; }
  const ClusterSpec& cluster() const { return cluster_; }
  int rank() const { return rank_; }
  const RankCoords& coords() const { return coords_; }
  int stage() const { return coords_.stage; }
  int tp_index(int tp) const { return Layout::tp_index(coords_.local, tp); }
  int dp_index(int tp) const { return Layout::dp_index(coords_.local, tp); }

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
