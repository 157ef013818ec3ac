// CUDA devices, and the CUDA backend and communicators. The functions in `cuda` below the
// line exist only in builds with the CUDA toolkit (STRATAGEM_HAVE_CUDA); callers guard them.
// choose_local_device is plain C++, in every build.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "stratagem/backend.hpp"
#include "stratagem/comm.hpp"

namespace stratagem {

// The GPU a rank drives: its rank among the ranks of its node (MPI_COMM_TYPE_SHARED split),
// modulo the node's device count. With NCCL every rank needs a GPU of its own, so
// `one_gpu_per_rank` refuses more ranks than devices on a node (std::invalid_argument naming
// both counts and the --comm mpi way out). Throws when there is no device at all.
int choose_local_device(int local_rank, int local_size, int device_count, bool one_gpu_per_rank);

namespace cuda {
int device_count();
std::string runtime_version();
// Why there is no usable device ("" when there is one): the driver's own words.
std::string no_device_reason();
std::string device_name(int device);  // e.g. "NVIDIA H200"

// ---- CUDA builds only ----------------------------------------------------------------------
// The backend on `device`, computing GEMMs in `compute` (fp32, or bf16 with fp32 accumulate).
std::unique_ptr<Backend> make_backend(int device, ScalarType compute);
// Communicators for a CUDA backend (made by make_backend): NCCL over device memory, ordered
// against the backend's compute stream with events; or MPI with every device buffer staged
// through host memory (several ranks may then share one GPU).
CommFactory nccl_comm_factory(Backend& backend);
CommFactory host_staging_comm_factory(Backend& backend);
bool have_nccl();
// Bytes the backend's caching allocator holds (live + cached) and its high-water mark.
struct DeviceMemory {
  int64_t reserved_bytes = 0, reserved_high_water_bytes = 0, live_bytes = 0,
          live_high_water_bytes = 0;
};
DeviceMemory device_memory(Backend& backend);
}  // namespace cuda

}  // namespace stratagem
