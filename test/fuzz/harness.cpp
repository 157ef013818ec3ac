#include "test/fuzz/harness.hpp"

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

// OpenMPI's allocations at MPI_Init outlive the process on purpose; leaks are not what these
// targets look for.
extern "C" const char* __asan_default_options() {
  return "detect_leaks=0";
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  int ok = 0;
  MPI_Initialized(&ok);
  if (!ok) MPI_Init(argc, argv);
  return 0;
}

namespace stratagem::fuzz {

std::string write_input(const uint8_t* data, size_t size, const char* suffix) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path = std::string(dir && *dir ? dir : "/tmp") + "/stratagem-fuzz-" +
                           std::to_string(::getpid()) + suffix;
  write_file(path, data, size);
  return path;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  out.close();
  if (!out) std::abort();
}

void check_message(const char* what) {
  const size_t n = std::strlen(what);
  if (n == 0 || n > 4096 || std::strchr(what, '\n')) {
    std::fprintf(stderr,
                 "fuzz: an InputError breaks the one-short-line contract (%zu bytes):\n%.*s\n", n,
                 600, what);
    std::abort();
  }
}

}  // namespace stratagem::fuzz
