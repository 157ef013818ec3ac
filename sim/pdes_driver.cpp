// The MPI-parallel driver: the ranks' placement over the processes and the window loop (see
// pdes_driver.hpp).
#include "sim/pdes_driver.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "stratagem/error.hpp"

namespace stratagem::sim {

void PdesDriver::init(MPI_Comm comm) {
  comm_ = comm;
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_size(comm_, &procs_);
    MPI_Comm_rank(comm_, &me_);
  }
}

void PdesDriver::place(const Layout& layout, const Network& net, int gpus_per_node, bool mirror,
                       bool single, const std::vector<int32_t>& rep_of,
                       std::vector<RankState>& ranks) {
  partition_ = partition_ranks(layout, net, gpus_per_node, procs_, me_, mirror, single, rep_of);
  for (RankState& r : ranks) r.local_index = -1;
  for (size_t i = 0; i < partition_.local_ranks.size(); ++i)
    ranks[partition_.local_ranks[i]].local_index = int(i);
}

void PdesDriver::distribute(const Layout& layout, const Network& net, int gpus_per_node,
                            bool mirror, const std::vector<int32_t>& rep_of,
                            std::vector<RankState>& ranks, const std::vector<StageData>& stages,
                            const std::vector<int32_t>& rank_groups) {
  place(layout, net, gpus_per_node, mirror, false, rep_of, ranks);
  const bool safe = lookahead_.init(procs_, partition_, ranks, stages, rank_groups, net);
  if (procs_ > 1) {
    int u = !safe, any = 0;
    MPI_Allreduce(&u, &any, 1, MPI_INT, MPI_MAX, comm_);
    if (any) {
      if (mirror)
        throw InputError(
            "simulate --mirror: a communication op without latency leaves the "
            "parallel simulation no lookahead");
      // Zero-latency communication: no lookahead; process 0 simulates every rank.
      place(layout, net, gpus_per_node, mirror, true, rep_of, ranks);
      lookahead_.clear(partition_.local_ranks.size());
    }
  }
  mailbox_.init(procs_);
}

Time PdesDriver::run(WindowedSimulation& sim) {
  Time last = 0;
  double t_eot = 0, t_red = 0, t_run = 0, t_x = 0;
  auto tick = [] { return std::chrono::steady_clock::now(); };
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  for (;;) {
    const Time glb = sim.earliest_event();
    const bool out = mailbox_.any();
    auto q0 = tick();
    const Time eot =
        std::min(mailbox_.earliest_effect(), glb == kNever ? kNever : sim.earliest_output(glb));
    int64_t loc[3] = {glb, eot, out ? -1 : 0}, glo[3];
    auto q1 = tick();
    MPI_Request req;
    MPI_Iallreduce(loc, glo, 3, MPI_INT64_T, MPI_MIN, comm_, &req);
    wait_yielding(&req);
    auto q2 = tick();
    t_eot += secs(q0, q1);
    t_red += secs(q1, q2);
    if (glo[0] == kNever && glo[2] == 0) break;
    const Time H = glo[1];
    // With messages waiting to go out the window may be empty: they are sent at its end.
    if (glo[0] != kNever && H <= glo[0] && glo[2] == 0)
      throw std::logic_error("simulate: the parallel simulation made no progress at t=" +
                             std::to_string(H));
    ++windows_;
    auto q3 = tick();
    last = sim.run_until(H);
    auto q4 = tick();
    sim.receive(mailbox_.exchange(comm_), H);
    t_run += secs(q3, q4);
    t_x += secs(q4, tick());
  }
  if (std::getenv("STRATAGEM_SIM_PROFILE"))
    std::fprintf(stderr,
                 "process %d: eot %.3f s, allreduce %.3f s, events %.3f s, exchange %.3f s, %zu "
                 "boundary ranks\n",
                 me_, t_eot, t_red, t_run, t_x, lookahead_.boundary_ranks());
  return last;
}

}  // namespace stratagem::sim
