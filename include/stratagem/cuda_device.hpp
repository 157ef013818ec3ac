// CUDA devices, and the CUDA backend and communicators. The binary links no CUDA library: the
// backend and the NCCL communicator live in a plugin, libstratagem_cuda.so, which the functions
// in `cuda` load on first use (src/runtime/cuda_plugin.cpp). It is looked for beside the
// running binary (/proc/self/exe), or where $STRATAGEM_CUDA_PLUGIN names. A node without a
// GPU, without the CUDA libraries or without the plugin runs every other command unchanged.
// choose_local_device is plain C++.
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
// GPUs the NVIDIA driver shows, asked through libcuda.so.1 (dlopened; neither the plugin nor
// the CUDA libraries are loaded): 0 without a driver or a device, with the reason in *why.
int driver_device_count(std::string* why = nullptr);
// Where the plugin is looked for: $STRATAGEM_CUDA_PLUGIN, else libstratagem_cuda.so beside the
// running binary.
std::string plugin_path();
// Loads the plugin (once per process; it stays loaded): "" when it is ready, else one line
// naming what is missing (the file, a CUDA library it needs, or a plugin from another build).
std::string load_plugin();
// "" when the CUDA backend can run here; else one line: "no CUDA device: <why>" (the driver's
// or the CUDA runtime's words), or load_plugin()'s line. Asks the driver before loading the
// plugin, so a node without a GPU never maps the CUDA libraries.
std::string unavailable_reason();
// One line for `stratagem --version`: the plugin, its CUDA runtime and NCCL, the devices.
std::string describe_plugin();

// ---- through the plugin (call after unavailable_reason() returned "") --------------------
// Devices the CUDA runtime sees; 0 when the driver shows none or the plugin cannot load.
int device_count();
std::string runtime_version();
std::string nccl_version();  // "" when the plugin was built without NCCL
bool have_nccl();
std::string device_name(int device);  // e.g. "NVIDIA H200"
// Why there is no usable device: unavailable_reason() without its "no CUDA device: " prefix.
std::string no_device_reason();

// The backend on `device`, computing GEMMs in `compute` (fp32, or bf16 with fp32 accumulate).
// Throws std::invalid_argument for a device out of range, std::runtime_error otherwise.
std::unique_ptr<Backend> make_backend(int device, ScalarType compute);
// Communicators for a CUDA backend (made by make_backend, which must outlive them): NCCL over
// device memory, ordered against the backend's compute stream with events; or MPI with every
// device buffer staged through host memory (several ranks may then share one GPU).
CommFactory nccl_comm_factory(Backend& backend);
CommFactory host_staging_comm_factory(Backend& backend);
// Bytes the backend's caching allocator holds (live + cached) and its high-water mark.
struct DeviceMemory {
  int64_t reserved_bytes = 0, reserved_high_water_bytes = 0, live_bytes = 0,
          live_high_water_bytes = 0;
};
DeviceMemory device_memory(Backend& backend);
}  // namespace cuda

}  // namespace stratagem
