// The MPI-parallel driver: which process simulates which ranks, the messages a process sends
// the others, and the window loop of the PDES scheme (pdes.hpp), which runs the engine's events
// window by window and hands it what the other processes sent. With one process it holds every
// rank, sends nothing and runs no windows.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "sim/pdes.hpp"
#include "sim/rank_state.hpp"
#include "sim/resources.hpp"
#include "sim/stage_data.hpp"
#include "sim/types.hpp"
#include "stratagem/layout.hpp"

namespace stratagem::sim {

// What the window loop runs: the engine's side of it.
class WindowedSimulation {
 public:
  // The time of this process's earliest pending event (kNever: none).
  virtual Time earliest_event() const = 0;
  // The earliest time at which this process can affect another, from glb (its earliest event,
  // not kNever) on: Lookahead::earliest_output over its state.
  virtual Time earliest_output(Time glb) = 0;
  // Runs the events before `horizon`; returns the time of the last event run so far.
  virtual Time run_until(Time horizon) = 0;
  // The events the other processes sent during the window that ended at `horizon` (they take
  // effect at or after it).
  virtual void receive(const std::vector<Msg>& received, Time horizon) = 0;

 protected:
  ~WindowedSimulation() = default;
};

class PdesDriver {
 public:
  // comm: the processes that share the simulation (MPI_COMM_NULL: this one alone).
  void init(MPI_Comm comm);
  // Spreads the simulated ranks (rep_of[r] == r) over the processes and sets each rank's
  // local_index; finds the lookahead. When some cross-process op has no latency, process 0
  // simulates every rank (a mirrored run cannot: InputError).
  void distribute(const Layout& layout, const Network& net, int gpus_per_node, bool mirror,
                  const std::vector<int32_t>& rep_of, std::vector<RankState>& ranks,
                  const std::vector<StageData>& stages, const std::vector<int32_t>& rank_groups);
  // The window loop (more than one process); returns the time of the last event.
  Time run(WindowedSimulation& sim);

  MPI_Comm comm() const { return comm_; }
  int procs() const { return procs_; }
  int me() const { return me_; }
  const Partition& partition() const { return partition_; }
  bool local(int rank) const { return partition_.local(rank); }
  Lookahead& lookahead() { return lookahead_; }
  // Sent at the end of the window.
  void send(int proc, const Msg& m) {
    mailbox_.send(proc, m);
    ++messages_;
  }
  uint64_t messages() const { return messages_; }
  uint64_t windows() const { return windows_; }

 private:
  void place(const Layout& layout, const Network& net, int gpus_per_node, bool mirror, bool single,
             const std::vector<int32_t>& rep_of, std::vector<RankState>& ranks);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int procs_ = 1, me_ = 0;
  Partition partition_;
  Mailbox mailbox_;
  Lookahead lookahead_;
  uint64_t messages_ = 0, windows_ = 0;
};

}  // namespace stratagem::sim
