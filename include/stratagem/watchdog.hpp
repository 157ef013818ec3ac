// Watchdog over blocking collective calls (MPI barriers and reductions, parallel HDF5 opens and
// closes) that cannot poll a timeout themselves: a section that waits longer than the job's
// communication timeout ends this process with a message naming what it waited for. The
// launcher (mpirun, srun) then ends the other ranks, so a stopped or dead peer never hangs the
// job. Nonblocking transfers have their own timeout (Request::wait, CommTimeout).
#pragma once
#include <string>

namespace stratagem {

// Process-wide settings: the timeout (<= 0 turns the watchdog off) and the prefix of its
// message ("stratagem train: error on rank 3: ").
void set_watchdog(double timeout_s, std::string message_prefix);

// Guards one blocking call; sections nest (the innermost one counts).
class WatchdogScope {
 public:
  explicit WatchdogScope(std::string what);
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  std::string previous_;
  double previous_start_s_ = 0;
  bool active_ = false;
};

}  // namespace stratagem
