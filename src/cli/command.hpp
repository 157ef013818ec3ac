// Subcommand registry: each src/cli/cmd_*.cpp registers itself, so adding a subcommand touches
// one file.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/cli/args.hpp"
#include "stratagem/error.hpp"

namespace stratagem::cli {

struct Command {
  std::string name;     // "model show", "plan check", "simulate", ...
  std::string summary;  // one line for `stratagem --help`
  std::string usage;    // full --help text
  std::function<int(Args&)> run;
};

std::vector<Command>& registry();
struct Register {
  explicit Register(Command c) { registry().push_back(std::move(c)); }
};

// MPI rank and size of this process (the CLI initializes MPI before running a command).
int world_rank();
int world_size();
// Rank among the processes of this node (picks the GPU on GPU nodes).
int local_rank();
// Once ranks work together (training), an error on one rank must end the whole job: main then
// prints it with the rank and calls MPI_Abort instead of waiting in MPI_Finalize. Entering the
// phase is an agreement over all ranks (waiting at most `wait_s`): when a peer failed before
// it (bad input on one rank only), this throws PeerFailed and the job ends with the peer's
// message and exit code.
void begin_collective_phase(double wait_s);
bool collective_phase();
struct PeerFailed : std::exception {
  explicit PeerFailed(int c) : code(c) {}
  int code;
  const char* what() const noexcept override { return "a peer rank failed"; }
};
// Called by main after a command that never entered the collective phase.
void finish_agreement();
int local_size();  // processes on this node
// --comm-timeout-s, which every command takes (main parses it once, before the command runs):
// the longest any rank waits for another. Without it, MPI's start-up (MPI_Init and the first
// collective) waits kStartUpTimeoutS and a command's collectives (a training step's transfers)
// kCollectiveTimeoutS.
// - Start-up: a healthy launch passes MPI_Init's exchange in seconds, even over thousands of
//   ranks; a minute is ten times that, and a rank stopped or dead before MPI_Init then costs a
//   minute, not ten.
// - Collectives: a peer may legitimately be busy a long while between two of them (a CPU
//   training step of a large layer, a checkpoint written by every rank), so their bound stays
//   at ten minutes; a job with longer steps raises it with the flag.
inline constexpr double kStartUpTimeoutS = 60;
inline constexpr double kCollectiveTimeoutS = 600;
std::optional<double> comm_timeout_flag_s();
double comm_timeout_s();  // the flag's value, else kCollectiveTimeoutS
// The help of the flags every command takes, printed after each command's own.
extern const char* kCommonHelp;
// Prints JSON on rank 0 only.
void print_json(const nlohmann::json& j);

}  // namespace stratagem::cli
