#include <stdexcept>
#include <string>

#include "stratagem/cuda_device.hpp"

namespace stratagem {

int choose_local_device(int local_rank, int local_size, int device_count, bool one_gpu_per_rank) {
  if (device_count <= 0) throw std::invalid_argument("no CUDA device on this node");
  if (local_rank < 0 || local_rank >= local_size)
    throw std::invalid_argument("local rank " + std::to_string(local_rank) + " outside [0," +
                                std::to_string(local_size) + ")");
  if (one_gpu_per_rank && local_size > device_count)
    throw std::invalid_argument(
        std::to_string(local_size) + " ranks on this node share " + std::to_string(device_count) +
        " GPU(s), but NCCL needs one GPU per rank; use --comm mpi (staged through host memory) "
        "or fewer ranks per node");
  return local_rank % device_count;
}

}  // namespace stratagem
