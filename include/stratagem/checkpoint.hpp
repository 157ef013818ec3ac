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

// One logical tensor of the flat state buffers.
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // into the flat buffer, in elements
  int64_t numel() const;
};

// A flat fp32 buffer of which this rank holds (and writes) [begin, end).
struct CheckpointBuffer {
  std::string group;      // "params", "optimizer/m", ...
  float* data = nullptr;  // element `begin` of the flat buffer
  int64_t begin = 0, end = 0;
};

struct CheckpointMeta {
  int64_t step = 0;  // optimizer steps completed
  uint64_t seed = 0;
  int64_t data_position = 0;  // samples consumed (the sampler is a pure function of seed, step)
  nlohmann::json model, plan, layout, extra;
};

// Collective over `comm`. Writes <dir>/step-<step>.h5 and keeps the newest `keep` files.
void save_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointMeta& meta,
                     const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointBuffer>& buffers, int keep);

// Newest complete checkpoint in `dir` (skipping and warning about half-written or unreadable
// ones), or nullopt. Collective-free: every rank may call it; rank 0 prints the warnings.
std::optional<std::string> newest_checkpoint(const std::string& dir, bool warn);

// Reads the metadata only.
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Fills [begin, end) of each buffer from the file (independent reads). Every tensor must exist
// with the expected shape; errors name the file and the dataset.
void load_checkpoint(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointBuffer>& buffers);

std::string checkpoint_name(int64_t step);  // "step-00000010.h5"

}  // namespace stratagem
