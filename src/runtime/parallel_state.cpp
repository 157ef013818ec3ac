#include "stratagem/parallel_state.hpp"

#include <exception>
#include <string>

#include "stratagem/error.hpp"

namespace stratagem {

ParallelState::ParallelState(MPI_Comm world, const Plan& plan, const ClusterSpec& cluster,
                             double comm_timeout_s)
    : world_(world), cluster_(cluster), layout_(plan, cluster) {
  int size = 1;
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &size);
  if (size != layout_.world_size())
    throw InputError("the plan needs " + std::to_string(layout_.world_size()) +
                     " MPI ranks (pp x tp x dp) but this job has " + std::to_string(size) +
                     " (check mpirun -np / srun -n against the plan)");
  coords_ = layout_.coords(rank_);
  world_comm_ = make_mpi_communicator(world, "world", comm_timeout_s);
  // Groups with the same members share one communicator; every rank walks the groups in the
  // Layout's order, so the collective MPI_Comm_split calls match.
  std::map<std::vector<int>, std::shared_ptr<Communicator>> by_members;
  for (const Group& g : layout_.groups()) {
    auto it = by_members.find(g.ranks);
    if (it != by_members.end()) {
      if (it->second) by_group_[g.id] = it->second;
      continue;
    }
    int pos = -1;
    for (size_t i = 0; i < g.ranks.size(); ++i)
      if (g.ranks[i] == rank_) pos = static_cast<int>(i);
    MPI_Comm c = MPI_COMM_NULL;
    if (MPI_Comm_split(world, pos >= 0 ? 0 : MPI_UNDEFINED, pos, &c) != MPI_SUCCESS)
      throw std::runtime_error("parallel state: MPI_Comm_split failed for group " +
                               std::to_string(g.id));
    std::shared_ptr<Communicator> comm;
    if (c != MPI_COMM_NULL) {
      owned_.push_back(c);
      std::string name = std::string(to_string(g.kind)) + " group " + std::to_string(g.id) + " [";
      for (size_t i = 0; i < g.ranks.size(); ++i)
        name += (i ? "," : "") + std::to_string(g.ranks[i]);
      comm = make_mpi_communicator(c, name + "]", comm_timeout_s);
      by_group_[g.id] = comm;
    }
    by_members[g.ranks] = comm;
  }
}

ParallelState::~ParallelState() {
  by_group_.clear();
  // While an error unwinds, peers may sit in a collective with us: nothing collective here,
  // the job is about to be aborted.
  if (std::uncaught_exceptions() > 0) return;
  for (MPI_Comm& c : owned_) MPI_Comm_free(&c);
}

Communicator& ParallelState::group(int id) {
  auto it = by_group_.find(id);
  if (it == by_group_.end())
    throw std::logic_error("parallel state: rank " + std::to_string(rank_) +
                           " is not a member of group " + std::to_string(id));
  return *it->second;
}

}  // namespace stratagem
