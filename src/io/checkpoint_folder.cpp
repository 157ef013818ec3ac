// A checkpoint folder as a whole: its lock (one job writes it at a time), the listing of its
// complete checkpoints, and the removal of half-written ones and, on --overwrite, of another
// run's.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "src/io/checkpoint_files.hpp"
#include "stratagem/checkpoint.hpp"
#include "stratagem/error.hpp"
#include "stratagem/input_file.hpp"
#include "stratagem/output_file.hpp"

namespace stratagem {

namespace fs = std::filesystem;

namespace io {
CkptFile classify_checkpoint_file(const std::string& f) {
  if (f.rfind("step-", 0) != 0) return CkptFile::other;
  size_t i = 5;
  while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) ++i;
  if (i == 5) return CkptFile::other;
  const std::string rest = f.substr(i);
  if (rest == ".h5") return CkptFile::complete;
  if (rest == ".h5.tmp") return CkptFile::partial;
  return CkptFile::other;
}

namespace {
// The step digits of a checkpoint's name without their leading zeros ("" for step 0).
std::string step_digits(const std::string& path) {
  const std::string f = fs::path(path).filename().string();
  size_t begin = 5, end = 5;  // after "step-"
  while (end < f.size() && std::isdigit(static_cast<unsigned char>(f[end]))) ++end;
  while (begin < end && f[begin] == '0') ++begin;
  return f.substr(begin, end - begin);
}
}  // namespace

bool checkpoint_step_before(const std::string& a, const std::string& b) {
  // Compared as decimal integers of any length: fewer digits is smaller, then digit by digit.
  // No conversion, so a name of 30 digits neither overflows nor ties with another.
  const std::string da = step_digits(a), db = step_digits(b);
  if (da.size() != db.size()) return da.size() < db.size();
  if (da != db) return da < db;
  return a < b;  // one step under two names (step-1.h5, step-00000001.h5): any fixed order
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
}  // namespace io

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> all;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return all;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // A FIFO or device under a checkpoint's name is not one: opening it could block forever.
    if (io::classify_checkpoint_file(it->path().filename().string()) != io::CkptFile::complete)
      continue;
    std::error_code ec2;
    if (fs::is_regular_file(it->path(), ec2))
      all.push_back(it->path().string());
    else
      std::fprintf(stderr, "stratagem: warning: ignoring %s: not a regular file\n",
                   shorten(it->path().string(), 200).c_str());
  }
  if (ec) throw InputError("--ckpt-dir " + dir + ": cannot list (" + ec.message() + ")");
  std::sort(all.begin(), all.end(), io::checkpoint_step_before);
  return all;
}

void remove_checkpoints(const std::string& dir) {
  const std::vector<std::string> all = list_checkpoints(dir);
  if (all.empty()) return;
  std::fprintf(stderr,
               "stratagem: --overwrite: removing %zu checkpoint(s) of another run from %s\n",
               all.size(), dir.c_str());
  for (const auto& path : all) {
    std::error_code ec;
    fs::remove(path, ec);
    if (ec)
      throw InputError("--ckpt-dir " + dir + ": cannot remove " + path + " (" + ec.message() + ")");
  }
  io::fsync_dir(dir);
}

void clean_partial_checkpoints(const std::string& dir) {
  if (!fs::is_directory(dir)) return;
  for (const auto& e : fs::directory_iterator(dir))
    if (io::classify_checkpoint_file(e.path().filename().string()) == io::CkptFile::partial) {
      std::fprintf(stderr, "stratagem: warning: ignoring half-written checkpoint %s (removed)\n",
                   e.path().c_str());
      std::error_code ec;
      fs::remove(e.path(), ec);
    }
}
namespace {
std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}
std::string job_id() {
  for (const char* v : {"SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"})
    if (const char* x = std::getenv(v)) return x;
  return "pid " + std::to_string(::getpid());
}
// Whether the lock's owner (a process on this host) is gone: no such process, or one that is
// not stratagem (its pid was reused).
// A zombie (killed, not yet reaped) is gone too.
bool owner_gone(long pid) {
  if (pid <= 0) return false;
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return true;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line, name, state;
  while (std::getline(status, line)) {
    if (line.rfind("Name:", 0) == 0) name = line;
    if (line.rfind("State:", 0) == 0) state = line;
  }
  if (name.empty()) return false;  // no /proc: assume alive
  return name.find("stratagem") == std::string::npos || state.find('Z') != std::string::npos;
}
}  // namespace

CheckpointLock::CheckpointLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError("--ckpt-dir " + dir + ": cannot create (" + ec.message() + ")");
  const std::string path = (fs::path(dir) / "LOCK").string();
  const std::string host = host_name();
  const std::string mine =
      "job " + job_id() + " host " + host + " pid " + std::to_string(::getpid()) + "\n";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd >= 0) {
      const bool ok = ::write(fd, mine.data(), mine.size()) == ssize_t(mine.size());
      ::fsync(fd);
      ::close(fd);
      if (!ok) {
        ::unlink(path.c_str());
        if (io::no_space_left(dir))
          throw std::runtime_error("--ckpt-dir " + dir + ": writing " + path +
                                   ": no space left on device");
        throw InputError("--ckpt-dir " + dir + ": cannot write " + path);
      }
      path_ = path;
      return;
    }
    if (errno != EEXIST) throw InputError("--ckpt-dir " + dir + ": cannot create " + path);
    // Our lock is one short line; a FIFO or /dev/zero in its place must not block or fill memory.
    constexpr uint64_t kMaxLockBytes = 4096;
    std::string owner =
        io::read_input_file(path, kMaxLockBytes, "--ckpt-dir " + dir + ": " + path, "a lock file");
    owner = owner.substr(0, owner.find('\n'));
    // A damaged or foreign lock may hold anything: printable characters only, not too many.
    owner = shorten(owner, 120);
    for (char& c : owner)
      if (static_cast<unsigned char>(c) >= 0x80) c = '?';
    // "job J host H pid P"
    const auto h = owner.find(" host "), p = owner.find(" pid ");
    const bool here =
        h != std::string::npos && p != std::string::npos && owner.substr(h + 6, p - h - 6) == host;
    const long pid = p != std::string::npos ? std::atol(owner.c_str() + p + 5) : 0;
    if (attempt == 0 && here && owner_gone(pid)) {
      std::fprintf(stderr,
                   "stratagem: warning: --ckpt-dir %s: removing the lock of a job that is gone "
                   "(%s)\n",
                   dir.c_str(), owner.c_str());
      ::unlink(path.c_str());
      continue;
    }
    throw InputError("--ckpt-dir " + dir + ": locked by another job (" + owner + ", file " + path +
                     "); if that job is gone, remove the file");
  }
  throw InputError("--ckpt-dir " + dir + ": cannot take the lock " + path);
}

CheckpointLock::~CheckpointLock() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

}  // namespace stratagem
