// CUDA device discovery through the CUDA runtime, inside the plugin. Built whenever nvcc
// exists (CI has the toolkit but no GPU), so the plugin compiles and links everywhere and the
// core reports a missing device in one line.
#include "src/runtime/cuda/device.hpp"

#include <cuda_runtime.h>

#include <string>
#if defined(STRATAGEM_HAVE_NCCL)
#include <nccl.h>
#endif

namespace stratagem::cuda::impl {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return n == 0 ? "the CUDA runtime sees 0 devices" : "";
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
    cudaGetLastError();
    return "unknown";
  }
  return p.name;
}

std::string runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string nccl_version() {
#if defined(STRATAGEM_HAVE_NCCL)
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
#else
  return "";
#endif
}

}  // namespace stratagem::cuda::impl
