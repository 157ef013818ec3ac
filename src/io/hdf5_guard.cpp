// The guard around libhdf5 calls on unverified files (see hdf5_guard.hpp).
#include "stratagem/hdf5_guard.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "stratagem/blocking_section.hpp"
#include "stratagem/error.hpp"

namespace stratagem::io {

namespace {
constexpr double kDefaultBoundS = 300;
constexpr double kFreeBytes = 1e9;          // read within the base bound
constexpr double kSlowestBytesPerS = 10e6;  // beyond it, a slow file system

double base_bound_s() {
  const char* env = std::getenv("STRATAGEM_HDF5_TIMEOUT_S");
  if (!env || !*env) return kDefaultBoundS;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(env, &end);
  // A value that is not a number is ignored rather than turning the guard off.
  if (errno || end == env || *end || !std::isfinite(v) || v < 0) return kDefaultBoundS;
  return v;
}
}  // namespace

double hdf5_read_bound_s(const std::string& path) {
  const double base = base_bound_s();
  if (base <= 0) return 0;
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  if (ec || double(bytes) <= kFreeBytes) return base;
  return base + (double(bytes) - kFreeBytes) / kSlowestBytesPerS;
}

Hdf5Guard::Hdf5Guard(const std::string& path, bool armed, double bound_s) {
  if (!armed) return;
  if (bound_s < 0) bound_s = hdf5_read_bound_s(path);
  if (bound_s <= 0) return;
  char within[32];
  std::snprintf(within, sizeof within, "%g", bound_s);
  scope_ = std::make_unique<BlockingSection>(SectionBound{
      bound_s,
      path + ": libhdf5 did not finish reading it within " + within + " s; the file is damaged",
      kExitBadInput});
}

Hdf5Guard::~Hdf5Guard() = default;

namespace {
IsolationHooks g_hooks;

// The child's answer on the pipe: one kind byte, an 8-byte length, the bytes.
constexpr char kAnswerOk = 'O', kAnswerInputError = 'I', kAnswerError = 'E';

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

[[noreturn]] void child_main(int fd, const std::function<std::string()>& read, pid_t parent) {
  // Ends with the parent (a parent killed by the launcher leaves no child reading on).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(125);
  ::signal(SIGPIPE, SIG_IGN);
  // What dies here is reported by the parent in one line: no crash report of Open MPI's or a
  // sanitizer's on the user's terminal, no HDF5 diagnostics.
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null_fd >= 0) ::dup2(null_fd, 2);
  if (g_hooks.child_start) {
    g_hooks.child_start();
  } else {
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, SIG_DFL);
  }
  char kind = kAnswerOk;
  std::string bytes;
  try {
    bytes = read();
  } catch (const InputError& e) {
    kind = kAnswerInputError;
    bytes = e.what();
  } catch (const std::exception& e) {
    kind = kAnswerError;
    bytes = e.what();
  }
  if (g_hooks.child_end) g_hooks.child_end();
  const uint64_t n = bytes.size();
  char head[9];
  head[0] = kind;
  std::memcpy(head + 1, &n, 8);
  const bool ok = write_all(fd, head, sizeof head) && write_all(fd, bytes.data(), bytes.size());
  ::_exit(ok ? 0 : 124);
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGFPE:
      return "SIGFPE";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGKILL:
      return "SIGKILL";
    default:
      return "signal " + std::to_string(sig);
  }
}

// Kills and reaps the child on every way out of the parent's wait.
struct Child {
  pid_t pid = -1;
  int fd = -1;
  int status = 0;
  bool reaped = false;
  void reap(bool kill_first) {
    if (pid < 0 || reaped) return;
    if (kill_first) ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    reaped = true;
  }
  ~Child() {
    if (fd >= 0) ::close(fd);
    reap(true);
  }
};
}  // namespace

void set_isolation_hooks(const IsolationHooks& hooks) {
  g_hooks = hooks;
}

std::string read_isolated(const std::string& path, const std::function<std::string()>& read,
                          double* budget_s) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    Hdf5Guard guard(path);
    return read();
  }
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], read, parent);
  }
  ::close(fds[1]);
  if (pid < 0) {
    // No child (no memory for its page tables): read here, bounded in time only.
    ::close(fds[0]);
    Hdf5Guard guard(path);
    return read();
  }
  Child child;
  child.pid = pid;
  child.fd = fds[0];
  // The whole file's bound, and what this child may take of it (at least 1 ms: a budget spent
  // to the last tick still ends in the guard's error, not in an unbounded wait).
  const double bound_s = budget_s ? *budget_s : hdf5_read_bound_s(path);
  const double file_bound_s = hdf5_read_bound_s(path);
  const auto started = std::chrono::steady_clock::now();
  const auto deadline =
      started + std::chrono::duration<double>(bound_s > 0 ? std::max(bound_s, 1e-3) : 0);
  std::string got;
  bool killed_at_bound = false;
  char buf[1 << 16];
  for (;;) {
    int wait_ms = -1;
    if (bound_s > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) {
        killed_at_bound = true;
        break;
      }
      wait_ms = int(std::min<long long>(left, 1 << 30));
    }
    pollfd p{child.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) continue;  // the deadline is checked above
    const ssize_t n = ::read(child.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child closed its end: it ended
    got.append(buf, size_t(n));
  }
  child.reap(killed_at_bound);
  if (budget_s && *budget_s > 0)
    *budget_s = std::max(
        1e-3,
        *budget_s -
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  if (g_hooks.parent_end) g_hooks.parent_end(child.status, killed_at_bound);
  if (killed_at_bound) {
    char within[32];
    std::snprintf(within, sizeof within, "%g", budget_s ? file_bound_s : bound_s);
    throw InputError(path + ": libhdf5 did not finish reading it within " + within +
                     " s; the file is damaged");
  }
  uint64_t n = 0;
  if (got.size() >= 9) std::memcpy(&n, got.data() + 1, 8);
  const bool complete = got.size() >= 9 && n == got.size() - 9 && WIFEXITED(child.status) &&
                        WEXITSTATUS(child.status) == 0;
  if (!complete) {
    const std::string how = WIFSIGNALED(child.status)
                                ? signal_name(WTERMSIG(child.status))
                                : "exit " + std::to_string(WEXITSTATUS(child.status));
    throw InputError(path + ": libhdf5 crashed reading it (" + how + "); the file is damaged");
  }
  const char kind = got[0];
  got.erase(0, 9);
  if (kind == kAnswerInputError) throw InputError(got);
  if (kind == kAnswerError) throw std::runtime_error(got);
  return got;
}

}  // namespace stratagem::io
