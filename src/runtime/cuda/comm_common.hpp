// Helpers shared by the CUDA communicators (internal).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "src/runtime/cuda/cuda_backend.hpp"

namespace stratagem::cuda {

// True for memory of a CUDA device (or managed memory); false for host memory, pinned or not.
inline bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

inline CudaBackend& as_cuda_backend(Backend& backend, const char* who) {
  auto* be = dynamic_cast<CudaBackend*>(&backend);
  if (!be)
    throw std::invalid_argument(std::string(who) + ": needs the cuda backend, got " +
                                backend.name());
  return *be;
}

}  // namespace stratagem::cuda
