// Watchdog over blocking collective calls (MPI barriers and reductions, parallel HDF5 opens and
// closes) that cannot poll a timeout themselves: a section that waits longer than the job's
// communication timeout ends this process with a message naming what it waited for. The
// launcher (mpirun, srun) then ends the other ranks, so a stopped or dead peer never hangs the
// job. Nonblocking transfers have their own timeout (Request::wait, CommTimeout).
#pragma once
#include <mpi.h>

#include <string>

namespace stratagem {

// Process-wide settings: the timeout (<= 0 turns the watchdog off, bounded sections excepted)
// and the prefix of its messages ("stratagem train: error on rank 3: ").
void set_watchdog(double timeout_s, std::string message_prefix);

// "not arrived: one or more of ranks 0,2,3 (stopped or died)": the other members of `comm`,
// which a blocking collective over it waits for.
std::string not_arrived(MPI_Comm comm);

// A section with its own bound, independent of the communication timeout (a read of an HDF5
// file that libhdf5 may loop on forever: src/io/hdf5_guard.hpp): past `timeout_s` the process
// prints the prefix and `message` as one line and exits with `exit_code`.
struct WatchdogBound {
  double timeout_s = 0;
  std::string message;
  int exit_code = 1;
};

// Guards one blocking call; sections nest (the innermost one counts).
class WatchdogScope {
 public:
  // `detail` follows the wait in the message (who did not arrive, when the caller knows).
  explicit WatchdogScope(std::string what, std::string detail = "a peer stopped or died");
  explicit WatchdogScope(WatchdogBound bound);
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  std::string previous_, previous_detail_;
  double previous_start_s_ = 0;
  WatchdogBound previous_bound_;
  bool active_ = false;
};

}  // namespace stratagem
