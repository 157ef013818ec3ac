// HDF5 checkpoints written with parallel HDF5 and collective I/O: one dataset per logical
// tensor in its full shape, every rank writing its shard. A checkpoint appears under its final
// name only once complete (temporary name, barrier, digest, rename), so a crash never damages
// the previous one; the last K are kept. The file's HDF5 user block holds a digest of its
// bytes (src/io/file_digest.hpp), checked before libhdf5 opens the file on resume.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace stratagem {

// One logical tensor of the checkpoint: a dataset such as "params/wte" in its full shape.
struct CheckpointTensor {
  std::string dataset;
  std::vector<int64_t> shape;  // 1-D or 2-D
  int64_t numel() const;
};
// A box of a logical tensor that this rank writes or reads: rows [row, row + rows) and columns
// [col, col + cols) (1-D tensors: col 0, cols 1). `data` points at the box's first element in
// this rank's memory, whose rows are `ld` floats apart.
struct CheckpointPiece {
  std::string dataset;
  int64_t row = 0, rows = 0, col = 0, cols = 1;
  float* data = nullptr;
  int64_t ld = 1;
};
struct CheckpointMeta {
  int64_t step = 0;  // optimizer steps completed
  uint64_t seed = 0;
  int64_t data_position = 0;  // samples consumed (the sampler is a pure function of seed, step)
  nlohmann::json model, plan, layout, extra;
};

// Collective over `comm`: every rank passes the same `tensors` (all datasets, created
// collectively) and its own `pieces` (written independently; one writer per element). Each
// dataset gets a "checksum" attribute, computed from the pieces in memory before the write;
// non-finite values are refused. Once the file is closed, its digest is written into its user
// block (its chunks hashed by all ranks), then the file is renamed into place. Writes
// <dir>/step-<step>.h5 and keeps the newest `keep`.
void save_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointMeta& meta,
                     const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointPiece>& pieces, int keep);

// A job's hold on a checkpoint folder: the file <dir>/LOCK names the owning job, host and
// process. A second writer is refused (InputError naming the owner); a lock whose owner was on
// this host and is gone (a killed job) is taken over with a warning. Released when destroyed.
// Taken by one rank (rank 0) only.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  std::string path_;
};

// The complete checkpoints (step-<N>.h5, regular files) in `dir`, oldest first (by the step N
// as an integer, not by file name); empty when there is no such folder.
std::vector<std::string> list_checkpoints(const std::string& dir);
// Removes every complete checkpoint of `dir` (--overwrite), with a note on stderr. Call only
// while holding the folder's lock.
void remove_checkpoints(const std::string& dir);

// Removes half-written checkpoints (step-<N>.h5.tmp) left by a killed job, with a warning.
// Call only while holding the folder's lock (no other job writes there).
void clean_partial_checkpoints(const std::string& dir);

struct ResumePoint {
  std::string path;
  CheckpointMeta meta;
};
// Collective over `comm`: the newest complete checkpoint in `dir` whose bytes match their
// digest (chunks hashed by all ranks; a file without one fails), and whose every dataset is
// present, of the model's shape, matches its checksum and holds finite values (the datasets
// are read in full, spread over the ranks). Damaged ones are skipped with a warning naming
// them (rank 0), and listed in `skipped`. nullopt when none passes. A checkpoint of another
// model is an InputError.
std::optional<ResumePoint> find_resumable_checkpoint(MPI_Comm comm, const std::string& dir,
                                                     const std::vector<CheckpointTensor>& tensors,
                                                     const nlohmann::json& model,
                                                     std::string* skipped);

// Reads the metadata only.
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Reads each piece from the file (independent reads). Every tensor must exist with the
// expected shape; errors name the file and the dataset. Any layout may read what any other
// wrote: the pieces are boxes of the logical tensors.
void load_checkpoint(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointPiece>& pieces);

std::string checkpoint_name(int64_t step);  // "step-00000010.h5"

}  // namespace stratagem
