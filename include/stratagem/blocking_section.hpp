// Calls that may block for ever and cannot poll a timeout themselves (MPI barriers and
// reductions, parallel HDF5 opens and closes, a libhdf5 read of a file it loops on) run inside a
// BlockingSection. A process-wide monitor thread ends the process with one line when a section
// outlasts its bound: a section over a collective is bounded by the process's communication
// timeout (set_blocking_timeout; a training job sets it from --comm-timeout-s), a bounded section
// by its own. The launcher (mpirun, srun) then ends the other ranks, so a stopped or dead peer
// never hangs the job. Nonblocking transfers have their own timeout (Request::wait,
// CommTimeout). A neutral facility below io and the runtime, which both guard calls with it.
#pragma once
#include <mpi.h>

#include <string>

namespace stratagem {

// Process-wide settings: the communication timeout (<= 0 leaves sections over collectives
// unguarded; bounded sections keep their own bound) and the prefix of the monitor's messages
// ("stratagem train: error on rank 3: ").
void set_blocking_timeout(double timeout_s, std::string message_prefix);

// "not arrived: one or more of ranks 0,2,3 (stopped or died)": the other members of `comm`,
// which a blocking collective over it waits for.
std::string not_arrived(MPI_Comm comm);
// The same for process `me` of a group of `size` known without MPI (the launcher's environment
// during MPI's start-up): with two processes it names the other one exactly.
std::string not_arrived(int me, int size);

// A section with its own bound, independent of the communication timeout (a read of an HDF5
// file that libhdf5 may loop on forever: stratagem/hdf5_guard.hpp): past `timeout_s` the process
// prints the prefix and `message` as one line and exits with `exit_code`.
struct SectionBound {
  double timeout_s = 0;
  std::string message;
  int exit_code = 1;
};

// Guards one blocking call; sections nest (the innermost one counts).
class BlockingSection {
 public:
  // `detail` follows the wait in the message (who did not arrive, when the caller knows).
  explicit BlockingSection(std::string what, std::string detail = "a peer stopped or died");
  explicit BlockingSection(SectionBound bound);
  ~BlockingSection();
  BlockingSection(const BlockingSection&) = delete;
  BlockingSection& operator=(const BlockingSection&) = delete;

 private:
  std::string previous_, previous_detail_;
  double previous_start_s_ = 0;
  SectionBound previous_bound_;
  bool active_ = false;
};

}  // namespace stratagem
