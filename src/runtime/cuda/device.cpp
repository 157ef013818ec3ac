// CUDA device discovery. Built whenever nvcc exists (CI has the toolkit but no GPU), so the
// CUDA backend compiles and links everywhere and fails at run time with a clear message.
#include <cuda_runtime.h>

#include <string>

#include "stratagem/cuda_device.hpp"

namespace stratagem::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace stratagem::cuda
