#include "stratagem/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "src/io/atomic_file.hpp"
#include "stratagem/error.hpp"

namespace stratagem::io {

namespace fs = std::filesystem;

namespace {
std::string named(const std::string& flag, const std::string& path) {
  return (flag.empty() ? std::string() : flag + " ") + path;
}

// The existing folder a new file at `path` would go into ("." for a bare name).
std::string folder_of(const std::string& path) {
  const auto dir = fs::path(path).parent_path();
  return dir.empty() ? std::string(".") : dir.string();
}

ssize_t cookie_write(void* cookie, const char* data, size_t n) {
  return static_cast<OutputFile*>(cookie)->write_raw(data, n);
}
}  // namespace

namespace {
bool g_failed_hdf5_write = false;
}  // namespace

void note_failed_hdf5_write() {
  g_failed_hdf5_write = true;
}
bool failed_hdf5_write() {
  return g_failed_hdf5_write;
}

void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) throw InputError(flag + ": expected a file name, got an empty one");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      throw InputError(named(flag, path) + ": is a directory, expected a file name");
    if (!S_ISREG(st.st_mode))
      throw InputError(named(flag, path) +
                       ": is not a regular file (a device, FIFO or socket): stratagem writes "
                       "only regular files");
    return;
  }
  std::error_code ec;  // a name the file system rejects is treated as missing
  const std::string dir = folder_of(path);
  if (!fs::is_directory(dir, ec))
    throw InputError(named(flag, path) + ": directory " + dir + " does not exist");
}

bool no_space_left(const std::string& path, uint64_t bytes_needed) {
  struct statvfs vfs {};
  std::error_code ec;
  const std::string probe = fs::is_directory(path, ec) ? path : folder_of(path);
  if (::statvfs(probe.c_str(), &vfs) != 0) return false;
  if (vfs.f_favail == 0 && vfs.f_files > 0) return true;  // no inode for a new file
  return uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize) < std::max<uint64_t>(1, bytes_needed);
}

void throw_write_error(const std::string& flag, const std::string& path, int err) {
  if (err == ENOSPC || err == EDQUOT || no_space_left(path))
    throw std::runtime_error(named(flag, path) + ": no space left on device" +
                             (err == EDQUOT ? " (disk quota exceeded)" : ""));
  throw std::runtime_error(named(flag, path) + ": write failed (" +
                           (err ? std::strerror(err) : "unknown error") + ")");
}

OutputFile::OutputFile(std::string flag, std::string path, Mode mode)
    : flag_(std::move(flag)), path_(std::move(path)) {
  check_output_path(flag_, path_);
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
  std::string target = path_;
  if (mode == Mode::replace) {
    tmp_ = temporary_path_for(path_);
    target = tmp_;
    flags |= O_TRUNC;
  } else {
    // O_NOFOLLOW-free on purpose: a log given as a link to a regular file is fine. A FIFO
    // created after the check must not block the open.
    flags |= O_NONBLOCK | (mode == Mode::append ? O_APPEND : O_TRUNC);
  }
  fd_ = ::open(target.c_str(), flags, 0644);
  if (fd_ < 0)
    throw InputError(named(flag_, path_) + ": cannot write (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(named(flag_, path_) +
                     ": is not a regular file: stratagem writes only "
                     "regular files");
  }
  if (mode != Mode::replace) ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  cookie_io_functions_t io{};
  io.write = cookie_write;
  stream_ = ::fopencookie(this, "w", io);
  if (!stream_) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error(named(flag_, path_) + ": cannot open a stream");
  }
}

OutputFile::~OutputFile() {
  if (stream_) std::fclose(stream_);  // the sink records, never throws
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

long OutputFile::write_raw(const char* data, size_t n) {
  if (error_) return -1;
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd_, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      error_ = w < 0 ? errno : ENOSPC;  // a write of 0 bytes to a regular file: no room
      return -1;
    }
    done += size_t(w);
  }
  return long(n);
}

void OutputFile::write(std::string_view bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), stream_) != bytes.size() && !error_) error_ = EIO;
}

void OutputFile::flush() {
  if (std::fflush(stream_) != 0 && !error_) error_ = EIO;
  if (error_) throw_write_error(flag_, path_, error_);
}

void OutputFile::close_checked() {
  flush();
  if (std::fclose(stream_) != 0 && !error_) error_ = EIO;
  stream_ = nullptr;
  if (error_) throw_write_error(flag_, path_, error_);
  // The file's blocks are allocated by now on most file systems, but not on all (NFS, and
  // delayed allocation): fsync and close report what is left.
  if (::fsync(fd_) != 0 && errno != EINVAL) error_ = errno;
  if (::close(fd_) != 0 && !error_) error_ = errno;
  fd_ = -1;
  if (error_) throw_write_error(flag_, path_, error_);
}

void OutputFile::commit() {
  close_checked();
  if (tmp_.empty()) return;
  // Checked again at the last moment: a device node that appeared at the path meanwhile is
  // not replaced.
  check_output_path(flag_, path_);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw InputError(named(flag_, path_) + ": cannot write (" + std::strerror(errno) + ")");
  tmp_.clear();
}

void write_output(const std::string& flag, const std::string& path, std::string_view contents) {
  OutputFile out(flag, path);
  out.write(contents);
  out.commit();
}

}  // namespace stratagem::io
