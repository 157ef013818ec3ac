// The plugin's own C++ entry points, behind its C interface (plugin.cpp, plugin_abi.h). The
// core reaches them only through that interface, as the functions of stratagem/cuda_device.hpp;
// these live in `impl` so that the two sets of names never meet. Internal to src/runtime/cuda.
#pragma once
#include <memory>
#include <string>

#include "stratagem/backend.hpp"
#include "stratagem/comm.hpp"

namespace stratagem::cuda::impl {

int device_count();
// Why there is no usable device ("" when there is one): the CUDA runtime's own words.
std::string no_device_reason();
std::string device_name(int device);  // e.g. "NVIDIA H200"
std::string runtime_version();        // "13.0"
std::string nccl_version();           // "2.27.7", or "" in a plugin built without NCCL

std::unique_ptr<Backend> make_backend(int device, ScalarType compute);
// NCCL over device memory, ordered against the backend's compute stream with events.
CommFactory nccl_comm_factory(Backend& backend);
// `host`'s communicators (MPI) with every device buffer staged through host memory: several
// ranks may then share one GPU.
CommFactory host_staging_comm_factory(Backend& backend, CommFactory host);

}  // namespace stratagem::cuda::impl
