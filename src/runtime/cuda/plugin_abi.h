/* The C interface between the stratagem binary and its CUDA plugin, libstratagem_cuda.so (the
 * CUDA backend and the NCCL and host-staged communicators, src/runtime/cuda/). The binary links
 * no CUDA library: it dlopens the plugin only when a command needs CUDA (--backend cuda, or the
 * default backend on a node whose driver shows a GPU), so every other command runs on nodes
 * without the CUDA libraries and without mapping them (~220 MB resident).
 *
 * C++ objects (Backend, CommFactory) cross as pointers of the core's types: both sides must be
 * compiled from the same headers. `interface` is a hash of those headers (CMake computes it);
 * the binary refuses a plugin whose hash differs, before calling anything else. The first two
 * fields never move, so that check is safe on a plugin of any version.
 *
 * Calls that can fail return 0 on success; on failure they write one line to `error` (at most
 * `error_bytes`, NUL-terminated) and return STRATAGEM_CUDA_BAD_ARGUMENT (the caller's input was
 * wrong: a device out of range, a backend of another kind) or STRATAGEM_CUDA_FAILURE. No C++
 * exception crosses this interface. */
#ifndef STRATAGEM_CUDA_PLUGIN_ABI_H
#define STRATAGEM_CUDA_PLUGIN_ABI_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STRATAGEM_CUDA_PLUGIN_ABI 1
#define STRATAGEM_CUDA_PLUGIN_ENTRY "stratagem_cuda_plugin"
#define STRATAGEM_CUDA_BAD_ARGUMENT 1
#define STRATAGEM_CUDA_FAILURE 2

typedef struct StratagemCudaPlugin {
  int abi;               /* STRATAGEM_CUDA_PLUGIN_ABI */
  const char* interface; /* hash of the headers whose types cross (STRATAGEM_PLUGIN_INTERFACE) */
  const char* stratagem_version;
  /* Devices the CUDA runtime sees; 0 with the runtime's reason in `why`. */
  int (*device_count)(char* why, size_t why_bytes);
  void (*device_name)(int device, char* out, size_t out_bytes);
  /* "13.0"; NCCL's "2.27.7", or "" when the plugin was built without NCCL. */
  void (*runtime_version)(char* out, size_t out_bytes);
  void (*nccl_version)(char* out, size_t out_bytes);
  /* A new stratagem::Backend on `device` computing GEMMs in `compute` (stratagem::ScalarType:
   * 0 fp32, 1 bf16); the caller owns *backend and deletes it as a Backend. */
  int (*make_backend)(int device, int compute, void** backend, char* error, size_t error_bytes);
  /* A new stratagem::CommFactory (caller owns) for a backend made by make_backend: NCCL when
   * `nccl`, else host-staged over `host_factory` (a const stratagem::CommFactory*, the core's MPI
   * communicators). The factory refers to the backend, which must outlive it. */
  int (*make_comm_factory)(void* backend, int nccl, const void* host_factory, void** factory,
                           char* error, size_t error_bytes);
  /* The backend's caching allocator: reserved, reserved high water, live, live high water. */
  int (*device_memory)(void* backend, int64_t bytes[4], char* error, size_t error_bytes);
} StratagemCudaPlugin;

/* The plugin's one exported symbol (STRATAGEM_CUDA_PLUGIN_ENTRY). */
const StratagemCudaPlugin* stratagem_cuda_plugin(void);

#ifdef __cplusplus
}
#endif
#endif
