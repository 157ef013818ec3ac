// HDF5 checkpoints written with parallel HDF5 and collective I/O: one dataset per logical
// tensor in its full shape, every rank writing its shard. A checkpoint appears under its final
// name only once complete (temporary name, barrier, rename), so a crash never damages the
// previous one; the last K are kept.
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
// collectively) and its own `pieces` (written independently). Writes <dir>/step-<step>.h5 and
// keeps the newest `keep` files.
void save_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointMeta& meta,
                     const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointPiece>& pieces, int keep);

// Newest complete checkpoint in `dir` (skipping and warning about half-written or unreadable
// ones), or nullopt. Collective-free: every rank may call it; rank 0 prints the warnings.
std::optional<std::string> newest_checkpoint(const std::string& dir, bool warn);

// Reads the metadata only.
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Reads each piece from the file (independent reads). Every tensor must exist with the
// expected shape; errors name the file and the dataset. Any layout may read what any other
// wrote: the pieces are boxes of the logical tensors.
void load_checkpoint(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointPiece>& pieces);

std::string checkpoint_name(int64_t step);  // "step-00000010.h5"

}  // namespace stratagem
