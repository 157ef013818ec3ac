// The public entry points of the CUDA backend (stratagem/cuda_device.hpp).
#include <stdexcept>

#include "src/runtime/cuda/comm_common.hpp"
#include "src/runtime/cuda/cuda_backend.hpp"
#include "stratagem/cuda_device.hpp"

namespace stratagem::cuda {

std::unique_ptr<Backend> make_backend(int device, ScalarType compute) {
  const int n = device_count();
  if (n == 0) throw std::runtime_error("no CUDA device: " + no_device_reason());
  if (device < 0 || device >= n)
    throw std::invalid_argument("CUDA device " + std::to_string(device) + " outside [0," +
                                std::to_string(n) + ")");
  return std::make_unique<CudaBackend>(device, compute);
}

DeviceMemory device_memory(Backend& backend) {
  const auto& s = as_cuda_backend(backend, "device_memory").memory_stats();
  return {s.reserved_bytes, s.reserved_high_water, s.requested_total, s.requested_total_high_water};
}

}  // namespace stratagem::cuda
