#include "src/cli/launch.hpp"

#include <cstdlib>

#include "src/cli/command.hpp"
#include "stratagem/error.hpp"

namespace stratagem::cli {

void check_launch(const std::string& command) {
  const char* skip = std::getenv("STRATAGEM_SKIP_SLURM_CHECK");
  if (skip && std::string(skip) == "1") return;
  // srun sets SLURM_STEP_NUM_TASKS for the tasks it launches; ranks that mpirun starts inside
  // an allocation carry OMPI_COMM_WORLD_SIZE and only the job's SLURM_NTASKS, which need not
  // equal the world they were started in. Only an srun step can produce singletons.
  const char* expected = std::getenv("SLURM_STEP_NUM_TASKS");
  if (!expected || std::getenv("OMPI_COMM_WORLD_SIZE")) return;
  const int n = std::atoi(expected);
  if (n <= 0 || n == world_size()) return;
  throw InputError(command + ": Slurm started " + std::to_string(n) +
                   " tasks but the MPI world has " + std::to_string(world_size()) +
                   " rank(s): the tasks did not join one MPI world (launch with srun --mpi=pmix, "
                   "or mpirun inside the allocation; srun --mpi=pmi2 does not work with this Open "
                   "MPI). Set STRATAGEM_SKIP_SLURM_CHECK=1 to run a deliberately smaller world.");
}

}  // namespace stratagem::cli
