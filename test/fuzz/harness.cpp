#include "test/fuzz/harness.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sanitizer/common_interface_defs.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "stratagem/hdf5_guard.hpp"

// OpenMPI's allocations at MPI_Init outlive the process on purpose; leaks are not what these
// targets look for.
extern "C" const char* __asan_default_options() {
  return "detect_leaks=0";
}

// libFuzzer's inline 8-bit coverage counters of this executable (-fsanitize=fuzzer).
extern "C" __attribute__((weak)) uint8_t __start___sancov_cntrs[];
extern "C" __attribute__((weak)) uint8_t __stop___sancov_cntrs[];

namespace {
// The readers of unverified HDF5 files (token files, traces without a digest) run libhdf5 in a
// child process (stratagem/hdf5_guard.hpp): a crash there is the product's one-line bad-input
// error, so libFuzzer goes on. Two things the targets need from that child:
//  - what it covered: the child copies its coverage counters into a shared page before it ends
//    (also from a sanitizer's death callback), and the parent takes them in, so that the
//    fuzzer keeps its guidance through the reader's code;
//  - whose fault a crash was: the child's sanitizer report goes to a file, and the parent reads
//    its stack from the innermost frame outwards (as triage.py does). A fault in stratagem's
//    code, or inside libhdf5 on memory stratagem owns (a buffer too small for what it asked
//    HDF5 to read), is ours: the parent prints the report and aborts, and libFuzzer keeps the
//    input as a crash. A fault inside libhdf5 on its own memory is the damaged file's.
uint8_t* g_child_counters = nullptr;  // shared with the child: [0] says "filled", then counters
size_t g_counter_bytes = 0;

std::string child_report_path(pid_t parent) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/stratagem-fuzz-" + std::to_string(parent) +
         ".child-report";
}

void copy_counters_out() {
  if (!g_child_counters) return;
  std::memcpy(g_child_counters + 1, __start___sancov_cntrs, g_counter_bytes);
  g_child_counters[0] = 1;
}

void child_start() {
  const int fd = ::open(child_report_path(::getppid()).c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) ::dup2(fd, 2);
  // Replaces libFuzzer's own death callback, which would write a crash file from the child.
  __sanitizer_set_death_callback(copy_counters_out);
  ::signal(SIGABRT, SIG_DFL);  // libFuzzer's handler would too
}

void child_end() {
  copy_counters_out();
}

// (where, function) of the innermost frame inside libhdf5 or in stratagem's sources.
std::pair<std::string, std::string> first_deciding_frame(const std::string& report) {
  static const std::string root = [] {
    std::string f = __FILE__;  // ROOT/test/fuzz/harness.cpp
    return f.substr(0, f.size() - std::string("/test/fuzz/harness.cpp").size());
  }();
  static const std::regex frame(R"(^\s*#\d+ 0x[0-9a-f]+\s+(?:in (.*) )?(\S+)$)");
  static const std::regex build_id(R"( \(BuildId: \w+\)$)");
  bool in_hdf5 = false;
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);) {
    line = std::regex_replace(line, build_id, "");
    std::smatch m;
    if (!std::regex_match(line, m, frame)) continue;
    std::string fn = m[1].matched ? m[1].str() : "?";
    fn = fn.substr(0, fn.find('('));
    std::string loc = m[2].str();
    loc.erase(std::remove(loc.begin(), loc.end(), '('), loc.end());
    loc.erase(std::remove(loc.begin(), loc.end(), ')'), loc.end());
    if (loc.find("libhdf5") != std::string::npos) {
      if (fn != "?") return {"libhdf5", fn};
      in_hdf5 = true;
      continue;
    }
    if (in_hdf5) return {"libhdf5", "?"};
    // A source of this tree, wherever it was compiled (ccache's base_dir can leave another
    // checkout's path in the debug info): its part from /src/ or /test/ on names a file here.
    const std::string file =
        std::filesystem::path(loc.substr(0, loc.find(':'))).lexically_normal().string();
    for (const char* dir : {"/src/", "/test/"}) {
      const size_t at = file.rfind(dir);
      std::error_code ec;
      if (at != std::string::npos && std::filesystem::exists(root + file.substr(at), ec))
        return {"stratagem", fn};
    }
  }
  return {"", ""};
}

void parent_end(int status, bool killed_at_bound) {
  if (g_child_counters && g_child_counters[0]) {
    for (size_t i = 0; i < g_counter_bytes; ++i)
      __start___sancov_cntrs[i] = std::max(__start___sancov_cntrs[i], g_child_counters[1 + i]);
    g_child_counters[0] = 0;
  }
  const std::string path = child_report_path(::getpid());
  if (killed_at_bound || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::remove(path.c_str());
    return;
  }
  std::ifstream in(path);
  std::stringstream report;
  report << in.rdbuf();
  std::remove(path.c_str());
  const std::string text = report.str();
  auto [where, fn] = first_deciding_frame(text);
  // Memory the bad access hit: ASan names its owner after the access's stack. Not for a use
  // after free: the freed block's last tenant is named, not who kept the stale pointer (libhdf5
  // keeps none of the reader's buffers past a call; a block of ours freed in this process before
  // the fork can be what a libhdf5 state damaged by an earlier file points into).
  static const std::regex owner_mark("allocated by thread|is located in stack of thread");
  std::smatch m;
  if (where == "libhdf5" &&
      text.find("AddressSanitizer: heap-use-after-free") == std::string::npos &&
      std::regex_search(text, m, owner_mark) &&
      first_deciding_frame(m.suffix().str()).first == "stratagem")
    where = "stratagem";
  if (where == "libhdf5") return;  // the damaged file's: the reader says so, exit 2
  std::fprintf(stderr,
               "fuzz: the HDF5 reader's child process died (wait status %d) and the fault is "
               "not libhdf5's on its own memory%s; the child's report:\n%s\n",
               status, where.empty() ? " (no frame in libhdf5 or stratagem)" : "", text.c_str());
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  int ok = 0;
  MPI_Initialized(&ok);
  if (!ok) MPI_Init(argc, argv);
  if (__start___sancov_cntrs && +__stop___sancov_cntrs > +__start___sancov_cntrs) {
    g_counter_bytes = size_t(__stop___sancov_cntrs - __start___sancov_cntrs);
    void* p = ::mmap(nullptr, g_counter_bytes + 1, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) g_child_counters = static_cast<uint8_t*>(p);
  }
  stratagem::io::IsolationHooks hooks;
  hooks.child_start = child_start;
  hooks.child_end = child_end;
  hooks.parent_end = parent_end;
  stratagem::io::set_isolation_hooks(hooks);
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
