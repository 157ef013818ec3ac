// The plugin's one exported symbol: the C interface of plugin_abi.h over the CUDA backend and
// communicators. Every call catches what the C++ below throws and hands back one line, so no
// exception crosses into the binary through C.
#include <cstdio>
#include <stdexcept>
#include <string>

#include "src/runtime/cuda/comm_common.hpp"
#include "src/runtime/cuda/cuda_backend.hpp"
#include "src/runtime/cuda/device.hpp"
#include "src/runtime/cuda/plugin_abi.h"

namespace stratagem::cuda {

std::unique_ptr<Backend> impl::make_backend(int device, ScalarType compute) {
  const int n = device_count();
  if (n == 0) throw std::runtime_error("no CUDA device: " + no_device_reason());
  if (device < 0 || device >= n)
    throw std::invalid_argument("CUDA device " + std::to_string(device) + " outside [0," +
                                std::to_string(n) + ")");
  return std::make_unique<CudaBackend>(device, compute);
}

namespace {

void put(char* out, size_t out_bytes, const std::string& s) {
  if (out && out_bytes > 0) std::snprintf(out, out_bytes, "%s", s.c_str());
}

template <class F>
int guarded(char* error, size_t error_bytes, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::invalid_argument& e) {
    put(error, error_bytes, e.what());
    return STRATAGEM_CUDA_BAD_ARGUMENT;
  } catch (const std::exception& e) {
    put(error, error_bytes, e.what());
  } catch (...) {
    put(error, error_bytes, "unknown error in the CUDA plugin");
  }
  return STRATAGEM_CUDA_FAILURE;
}

int device_count(char* why, size_t why_bytes) {
  const int n = impl::device_count();
  if (n == 0) put(why, why_bytes, impl::no_device_reason());
  return n;
}
void device_name(int device, char* out, size_t out_bytes) {
  put(out, out_bytes, impl::device_name(device));
}
void runtime_version(char* out, size_t out_bytes) {
  put(out, out_bytes, impl::runtime_version());
}
void nccl_version(char* out, size_t out_bytes) {
  put(out, out_bytes, impl::nccl_version());
}

int make_backend(int device, int compute, void** backend, char* error, size_t error_bytes) {
  return guarded(error, error_bytes, [&] {
    if (compute != int(ScalarType::fp32) && compute != int(ScalarType::bf16))
      throw std::invalid_argument("compute type " + std::to_string(compute) + ": not fp32/bf16");
    *backend = impl::make_backend(device, ScalarType(compute)).release();
  });
}

int make_comm_factory(void* backend, int nccl, const void* host_factory, void** factory,
                      char* error, size_t error_bytes) {
  return guarded(error, error_bytes, [&] {
    Backend& be = *static_cast<Backend*>(backend);
    *factory = new CommFactory(
        nccl ? impl::nccl_comm_factory(be)
             : impl::host_staging_comm_factory(be, *static_cast<const CommFactory*>(host_factory)));
  });
}

int device_memory(void* backend, int64_t bytes[4], char* error, size_t error_bytes) {
  return guarded(error, error_bytes, [&] {
    const auto& s =
        as_cuda_backend(*static_cast<Backend*>(backend), "device_memory").memory_stats();
    bytes[0] = s.reserved_bytes;
    bytes[1] = s.reserved_high_water;
    bytes[2] = s.requested_total;
    bytes[3] = s.requested_total_high_water;
  });
}

}  // namespace
}  // namespace stratagem::cuda

extern "C" __attribute__((visibility("default"))) const StratagemCudaPlugin* stratagem_cuda_plugin(
    void) {
  using namespace stratagem::cuda;
  static const StratagemCudaPlugin plugin = {STRATAGEM_CUDA_PLUGIN_ABI,
                                             STRATAGEM_PLUGIN_INTERFACE,
                                             STRATAGEM_VERSION,
                                             device_count,
                                             device_name,
                                             runtime_version,
                                             nccl_version,
                                             make_backend,
                                             make_comm_factory,
                                             device_memory};
  return &plugin;
}
