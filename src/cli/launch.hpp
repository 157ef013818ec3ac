// Launch-mode checks shared by the MPI-parallel subcommands (train, simulate, search).
#pragma once
#include <string>

namespace stratagem::cli {

// Under Slurm, the MPI world must hold every task of the step. `srun` with an MPI plugin that
// does not match this Open MPI starts N singletons (world size 1 each): fail at once with a
// message naming the launch-mode problem. STRATAGEM_SKIP_SLURM_CHECK=1 disables the check.
void check_launch(const std::string& command);

}  // namespace stratagem::cli
