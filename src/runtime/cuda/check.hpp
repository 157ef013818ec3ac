// One checked-call macro for the CUDA runtime, cuBLAS(Lt) and NCCL: a failing call throws
// std::runtime_error naming the file, the line, the call and the library's own message.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#if defined(STRATAGEM_HAVE_NCCL)
#include <nccl.h>
#endif

namespace stratagem::cuda {

[[noreturn]] inline void raise_error(const char* lib, const std::string& what, const char* expr,
                                     const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                           lib + " error: " + what);
}
inline void check_status(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess)
    raise_error("CUDA", std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")", expr,
                file, line);
}
inline void check_status(cublasStatus_t e, const char* expr, const char* file, int line) {
  if (e != CUBLAS_STATUS_SUCCESS)
    raise_error("cuBLAS",
                std::string(cublasGetStatusName(e)) + " (" + cublasGetStatusString(e) + ")", expr,
                file, line);
}
#if defined(STRATAGEM_HAVE_NCCL)
inline void check_status(ncclResult_t e, const char* expr, const char* file, int line) {
  if (e != ncclSuccess && e != ncclInProgress)
    raise_error("NCCL", ncclGetErrorString(e), expr, file, line);
}
#endif

}  // namespace stratagem::cuda

#define STRATAGEM_CUDA_CHECK(call) \
  ::stratagem::cuda::check_status((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here, at the launching line.
#define STRATAGEM_CUDA_CHECK_LAUNCH() STRATAGEM_CUDA_CHECK(cudaGetLastError())
