#include "stratagem/parallel_state.hpp"

#include <exception>
#include <string>

#include "stratagem/error.hpp"

namespace stratagem {

std::vector<CommToCreate> communicator_order(const Layout& layout, int rank) {
  std::vector<CommToCreate> order;
  std::map<std::vector<int>, size_t> index;
  for (const Group& g : layout.groups()) {
    auto it = index.find(g.ranks);
    if (it != index.end()) {
      order[it->second].group_ids.push_back(g.id);
      continue;
    }
    CommToCreate c;
    c.ranks = g.ranks;
    c.group_ids = {g.id};
    c.kind = g.kind;
    for (size_t i = 0; i < g.ranks.size(); ++i)
      if (g.ranks[i] == rank) c.position = static_cast<int>(i);
    index[g.ranks] = order.size();
    order.push_back(std::move(c));
  }
  return order;
}

ParallelState::ParallelState(MPI_Comm world, const Plan& plan, const ClusterSpec& cluster,
                             double comm_timeout_s, const CommFactory& make_comm)
    : world_(world), cluster_(cluster), layout_(plan, cluster) {
  int size = 1;
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &size);
  if (size != layout_.world_size())
    throw InputError("the plan needs " + std::to_string(layout_.world_size()) +
                     " MPI ranks (pp x tp x dp) but this job has " + std::to_string(size) +
                     " (check mpirun -np / srun -n against the plan)");
  coords_ = layout_.coords(rank_);
  const CommFactory make =
      make_comm ? make_comm : [](MPI_Comm c, const std::string& name, double timeout_s) {
        return make_mpi_communicator(c, name, timeout_s);
      };
  world_comm_ = make(world, "world", comm_timeout_s);
  // Groups with the same members share one communicator; every rank walks them in the same
  // order, so the collective MPI_Comm_split calls (and a factory's own collectives) match.
  for (const CommToCreate& g : communicator_order(layout_, rank_)) {
    MPI_Comm c = MPI_COMM_NULL;
    if (MPI_Comm_split(world, g.position >= 0 ? 0 : MPI_UNDEFINED, g.position, &c) != MPI_SUCCESS)
      throw std::runtime_error("parallel state: MPI_Comm_split failed for group " +
                               std::to_string(g.group_ids.front()));
    if (c == MPI_COMM_NULL) continue;
    owned_.push_back(c);
    std::string name =
        std::string(to_string(g.kind)) + " group " + std::to_string(g.group_ids.front()) + " [";
    for (size_t i = 0; i < g.ranks.size(); ++i) name += (i ? "," : "") + std::to_string(g.ranks[i]);
    std::shared_ptr<Communicator> comm = make(c, name + "]", comm_timeout_s);
    for (int id : g.group_ids) by_group_[id] = comm;
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
