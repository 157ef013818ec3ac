// The binary's side of the CUDA plugin (stratagem/cuda_device.hpp, src/runtime/cuda/
// plugin_abi.h): finds libstratagem_cuda.so, loads it once with dlopen, checks that it was
// built from the same headers, and forwards to its C interface. The plugin is never unloaded:
// backends, communicators and their code stay valid until the process exits.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "src/runtime/cuda/plugin_abi.h"
#include "stratagem/cuda_device.hpp"

namespace stratagem::cuda {
namespace {

constexpr const char* kPluginFile = "libstratagem_cuda.so";
constexpr size_t kLine = 1024;

struct Driver {
  int devices = 0;
  std::string why;
};

// cuInit and cuDeviceGetCount from the driver (libcuda.so.1 comes with the NVIDIA driver, not
// with the toolkit). The library stays loaded: the plugin's CUDA runtime loads it again.
Driver probe_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return {0, "no NVIDIA driver (libcuda.so.1 not found)"};
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  using Text = int (*)(int, const char**);
  auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<Count>(dlsym(lib, "cuDeviceGetCount"));
  auto name = reinterpret_cast<Text>(dlsym(lib, "cuGetErrorName"));
  auto text = reinterpret_cast<Text>(dlsym(lib, "cuGetErrorString"));
  if (!init || !count) return {0, "libcuda.so.1 lacks cuInit/cuDeviceGetCount"};
  auto error = [&](const char* call, int code) {
    const char *n = nullptr, *t = nullptr;
    if (name) name(code, &n);
    if (text) text(code, &t);
    return std::string(call) + ": " + (n ? n : "CUDA driver error " + std::to_string(code)) +
           (t ? std::string(" (") + t + ")" : "");
  };
  if (int e = init(0); e != 0) return {0, error("cuInit", e)};
  int n = 0;
  if (int e = count(&n); e != 0) return {0, error("cuDeviceGetCount", e)};
  return {n, n == 0 ? "the NVIDIA driver shows 0 devices" : ""};
}

const Driver& driver() {
  static const Driver d = probe_driver();
  return d;
}

struct Plugin {
  const StratagemCudaPlugin* api = nullptr;
  std::string path, error;
};

Plugin open_plugin() {
  Plugin p;
  p.path = plugin_path();
  std::error_code ec;
  if (!std::filesystem::exists(p.path, ec)) {
    p.error = "the CUDA plugin " + p.path +
              " is not there (a build without the CUDA toolkit, or the plugin was not copied "
              "beside the binary; $STRATAGEM_CUDA_PLUGIN may name it)";
    return p;
  }
  // RTLD_NOW: a CUDA library the plugin needs and cannot find is named here, not mid-run.
  void* lib = dlopen(p.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    p.error = std::string("cannot load the CUDA plugin: ") + (e ? e : p.path) +
              " (the CUDA runtime, cuBLAS and NCCL must be on the library path)";
    return p;
  }
  using Entry = const StratagemCudaPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(lib, STRATAGEM_CUDA_PLUGIN_ENTRY));
  if (!entry) {
    p.error = p.path + ": not a stratagem CUDA plugin (no " STRATAGEM_CUDA_PLUGIN_ENTRY " symbol)";
    return p;
  }
  const StratagemCudaPlugin* api = entry();
  if (api->abi != STRATAGEM_CUDA_PLUGIN_ABI ||
      std::strcmp(api->interface, STRATAGEM_PLUGIN_INTERFACE) != 0) {
    p.error = "the CUDA plugin " + p.path + " was built from other sources (interface " +
              std::to_string(api->abi) + "/" + api->interface + ", this binary " +
              std::to_string(STRATAGEM_CUDA_PLUGIN_ABI) + "/" + STRATAGEM_PLUGIN_INTERFACE +
              "): use the plugin built with this binary";
    return p;
  }
  p.api = api;
  return p;
}

const Plugin& plugin() {
  static const Plugin p = open_plugin();
  return p;
}

const StratagemCudaPlugin& api() {
  const Plugin& p = plugin();
  if (!p.api) throw std::runtime_error(p.error);
  return *p.api;
}

// A failed call's line as the exception the plugin's C++ code threw (roughly: bad argument or
// not).
[[noreturn]] void raise(int code, const char* error) {
  if (code == STRATAGEM_CUDA_BAD_ARGUMENT) throw std::invalid_argument(error);
  throw std::runtime_error(error);
}

std::string text(void (*get)(char*, size_t)) {
  char buf[kLine] = {};
  get(buf, sizeof buf);
  return buf;
}

}  // namespace

int driver_device_count(std::string* why) {
  if (why) *why = driver().why;
  return driver().devices;
}

std::string plugin_path() {
  if (const char* env = std::getenv("STRATAGEM_CUDA_PLUGIN"); env && *env) return env;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return kPluginFile;  // no /proc: the dynamic loader's search path
  return (exe.parent_path() / kPluginFile).string();
}

std::string load_plugin() {
  return plugin().error;
}

std::string unavailable_reason() {
  std::string why;
  if (driver_device_count(&why) == 0) return "no CUDA device: " + why;
  if (const auto e = load_plugin(); !e.empty()) return e;
  char buf[kLine] = {};
  if (api().device_count(buf, sizeof buf) == 0) return std::string("no CUDA device: ") + buf;
  return "";
}

std::string no_device_reason() {
  const std::string r = unavailable_reason();
  const std::string prefix = "no CUDA device: ";
  return r.rfind(prefix, 0) == 0 ? r.substr(prefix.size()) : r;
}

std::string describe_plugin() {
  if (const auto e = load_plugin(); !e.empty()) return "CUDA plugin: none: " + e;
  const auto& a = api();
  std::string nccl = text(a.nccl_version);
  std::string s = "CUDA plugin: " + plugin().path + " (CUDA runtime " + text(a.runtime_version) +
                  ", " + (nccl.empty() ? "no NCCL" : "NCCL " + nccl) + "); ";
  std::string why;
  if (driver_device_count(&why) == 0) return s + "no CUDA device: " + why;
  char buf[kLine] = {};
  const int n = a.device_count(buf, sizeof buf);
  if (n == 0) return s + "no CUDA device: " + buf;
  return s + std::to_string(n) + " device(s), device 0 " + device_name(0);
}

int device_count() {
  if (driver_device_count() == 0 || !load_plugin().empty()) return 0;
  return api().device_count(nullptr, 0);
}

std::string runtime_version() {
  return text(api().runtime_version);
}

std::string nccl_version() {
  return text(api().nccl_version);
}

bool have_nccl() {
  return !nccl_version().empty();
}

std::string device_name(int device) {
  char buf[kLine] = {};
  api().device_name(device, buf, sizeof buf);
  return buf;
}

std::unique_ptr<Backend> make_backend(int device, ScalarType compute) {
  void* backend = nullptr;
  char error[kLine] = {};
  if (int e = api().make_backend(device, int(compute), &backend, error, sizeof error))
    raise(e, error);
  return std::unique_ptr<Backend>(static_cast<Backend*>(backend));
}

namespace {
CommFactory comm_factory(Backend& backend, bool nccl) {
  const CommFactory host = [](MPI_Comm c, const std::string& name, double timeout_s) {
    return make_mpi_communicator(c, name, timeout_s);
  };
  void* factory = nullptr;
  char error[kLine] = {};
  if (int e = api().make_comm_factory(static_cast<void*>(&backend), nccl, &host, &factory, error,
                                      sizeof error))
    raise(e, error);
  std::unique_ptr<CommFactory> owned(static_cast<CommFactory*>(factory));
  return std::move(*owned);
}
}  // namespace

CommFactory nccl_comm_factory(Backend& backend) {
  return comm_factory(backend, true);
}

CommFactory host_staging_comm_factory(Backend& backend) {
  return comm_factory(backend, false);
}

DeviceMemory device_memory(Backend& backend) {
  int64_t bytes[4] = {};
  char error[kLine] = {};
  if (int e = api().device_memory(static_cast<void*>(&backend), bytes, error, sizeof error))
    raise(e, error);
  return {bytes[0], bytes[1], bytes[2], bytes[3]};
}

}  // namespace stratagem::cuda
