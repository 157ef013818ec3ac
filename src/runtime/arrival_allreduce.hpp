// The step boundary's agreement, with a timeout that names who is late. A blocking all-reduce
// under the watchdog can only list every other member as a suspect ("one or more of ranks
// 0,1,3"); here each rank also reports its arrival to rank 0, so that rank 0 names exactly the
// ranks that never came.
#pragma once
#include <mpi.h>

#include <string>

namespace stratagem {

// MPI_MAX of `value` over `comm` (a communicator of its own: its tags are not the job's).
// Past `timeout_s` it throws std::runtime_error "<what> waited N s (--comm-timeout-s): not
// arrived: rank 2 (stopped or died)" (rank 0; the others name rank 0, which names the rest).
int allreduce_max_naming_late(MPI_Comm comm, int value, const std::string& what, double timeout_s);

}  // namespace stratagem
