// Trainer: the training loop around the executor. It samples data by the Layout's data index
// (inside the executor), logs, saves and restores checkpoints (full logical tensors, so any
// layout reads any other's), agrees on stop signals at step boundaries, and writes the
// measured trace. `stratagem train` only parses arguments and calls train().
#pragma once
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stratagem/checkpoint.hpp"
#include "stratagem/executor.hpp"

namespace stratagem {

struct TrainerOptions {
  int64_t steps = 1;
  std::optional<std::string> ckpt_dir;
  int ckpt_every = 0;  // 0: only at the end and on a stop signal
  int keep = 3;
  bool resume = false;
  bool overwrite = false;  // remove the checkpoints of another run from ckpt_dir first
  int stop_after = -1;     // stop (with a checkpoint) after this many steps of this run
  std::optional<std::string> trace_path;
  std::optional<std::string> log_json;
  int log_every = 1;
  bool quiet = false;  // no per-step lines on stdout (--json)
  double comm_timeout_s = 600;
  // Steps with a non-finite loss or gradient norm tolerated (their update is skipped); one
  // more stops training with an error, keeping the last good checkpoint.
  int skip_nonfinite = 0;
  ExecutorOptions exec;
  // Builds the parallel groups' communicators (empty: MPI). The CUDA backend passes NCCL's,
  // or MPI staged through host memory.
  CommFactory make_comm;
};

struct TrainSummary {
  int64_t steps_completed = 0;
  StepResult last;
  int64_t high_water_bytes = 0;         // device pool, per rank
  int64_t host_high_water_bytes = 0;    // host pool (offloading)
  double moe_busiest_load = 1.0;        // Executor::moe_busiest_load, this rank's
  Executor::MoeScratchUse moe_scratch;  // Executor::moe_scratch_use, this rank's
  std::string checkpoint;               // the last one written, or empty
};

// Collective over `world`. With a checkpoint folder, rank 0 holds its lock for the run and
// removes half-written files of a killed job; --resume takes the newest verified checkpoint.
// A stop signal (stratagem/stop_signal.hpp) is read at every step boundary: all ranks agree,
// checkpoint, and return.
TrainSummary train(MPI_Comm world, const ModelSpec& model, const ClusterSpec& cluster,
                   const Plan& plan, Backend& backend, const TokenDataset& data,
                   const TrainerOptions& options);

// The checkpoint's view of an executor's state: every logical dataset of the model, and the
// boxes of them this rank writes (one owner per element) or reads (all it holds).
std::vector<CheckpointTensor> checkpoint_tensors(const ModelSpec& model);
std::vector<CheckpointPiece> checkpoint_pieces(Executor& ex, bool for_writing);

}  // namespace stratagem
