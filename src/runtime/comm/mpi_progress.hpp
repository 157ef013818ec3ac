// Asynchronous progress for the MPI communicator (the CPU backend's): Open MPI moves a
// nonblocking collective on only inside MPI calls, so a reduce-scatter issued before a long
// computation stood still until the rank's next op boundary, and a ring's every round waited for
// every member's. A device's network moves on by itself, and so do the Program's streams in
// the simulator; gloo runs its collectives on threads of their own. While any request is in
// flight, one thread per process drives MPI's progress engine (MPI_Iprobe on a private
// communicator: no request of the runtime is touched, so no two threads ever share one).
// Needs MPI_THREAD_MULTIPLE; without it nothing changes.
#pragma once
#include <cstdint>

namespace stratagem::comm_detail {

// A request went in flight (MpiRequest): a ticket, 0 when no thread runs. Its completion hands
// the ticket back; one of a thread stopped since is ignored, so that the count in flight stays
// exact across a stop and a start.
uint64_t progress_begin();
void progress_end(uint64_t ticket);

}  // namespace stratagem::comm_detail
