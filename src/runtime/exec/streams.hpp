// The Program's streams as this rank runs them: its place in the Program, what the
// prefetching streams (h2d, dp) ran ahead of it, and the dp stream's frees that wait for their
// reductions (exec/run_ahead.cpp, exec/dispatch.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "stratagem/comm.hpp"

namespace stratagem::exec {

struct Streams {
  struct Ahead {
    std::vector<uint32_t> ops;  // the stream's ops, in program order
    size_t next = 0;            // the first of them not yet run this step
  };
  std::vector<Ahead> ahead;
  std::vector<char> issued;  // per op: issued this step (at its place, or by a stream ahead)
  std::set<const Communicator*> shared_comms;  // used by streams that do not run ahead
  bool shared_comms_known = false;
  bool collectives_run_ahead = true;    // MPI on the CPU backend
  bool allocs_follow_frees = true;      // CPU backend: an alloc waits for the frees before it
  int64_t reached = -1;                 // the last op run in its place (-1: none yet)
  int64_t last_compute = -1;            // the last computation run in its place (-1: none yet)
  std::vector<uint32_t> pending_frees;  // dp-stream frees waiting for their reduction to land
  bool running_ahead = false;           // inside run_ahead (which does not nest)

  // A free the rank passed, waiting for its reduction.
  bool pending(uint32_t op) const {
    return std::find(pending_frees.begin(), pending_frees.end(), op) != pending_frees.end();
  }
};

}  // namespace stratagem::exec
