// The one rule for every file stratagem writes (-o, --chrome, --trace, --log-json, checkpoints):
// - only regular files are written: an existing device, FIFO, socket or directory at the path
//   is refused (InputError naming the flag and the path), so `-o /dev/null` never replaces a
//   device node with a file;
// - every write and the close are checked; a full disk is an error (exit 1) naming the file and
//   "no space left", never a success or a bare library message.
// The CLI refuses an output that is also one of the command's inputs (Args::output).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace stratagem::io {

// Refuses `path` as an output of `flag` ("-o", "--trace"): empty, an existing file that is not
// a regular file, or a folder that does not exist. Throws InputError naming both.
void check_output_path(const std::string& flag, const std::string& path);

// Whether the file system holding `path` (or its folder) has less room than `bytes_needed`
// (what is left to write): what a failed write whose library does not pass errno on (HDF5,
// MPI-IO, which may leave a partial write's worth free) is told apart by.
bool no_space_left(const std::string& path, uint64_t bytes_needed = 1);

// Throws the error of a failed write of `path`: std::runtime_error (exit 1) saying "no space
// left on device" for ENOSPC and EDQUOT (or when the file system is full), else naming errno.
[[noreturn]] void throw_write_error(const std::string& flag, const std::string& path, int err);

// libhdf5 may be left broken by a write that failed (a full disk): its teardown in
// MPI_Finalize then crashes. The HDF5 writers note such a failure; main then ends the process
// without that teardown, after printing the error.
void note_failed_hdf5_write();
bool failed_hdf5_write();

// A file being written, through a stdio stream whose every write is checked.
// - replace (the default): written to a temporary name beside the target and renamed into
//   place by commit(), so a failure never leaves half a file under the name;
// - append / truncate: written in place (a log that grows while the job runs).
// Without commit(), the destructor removes the temporary file (replace) and reports nothing.
class OutputFile {
 public:
  enum class Mode { replace, truncate, append };
  OutputFile(std::string flag, std::string path, Mode mode = Mode::replace);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // For fprintf and friends; errors are kept and thrown by flush() or commit().
  std::FILE* stream() { return stream_; }
  void write(std::string_view bytes);
  // Pushes what is buffered to the file; throws on a write error (a log line per step).
  void flush();
  // Flushes, syncs and closes (checked), then renames into place (replace).
  void commit();
  const std::string& path() const { return path_; }

  // The stream's sink (fopencookie): writes all of `n` bytes or records errno.
  long write_raw(const char* data, size_t n);

 private:
  void close_checked();
  std::string flag_, path_, tmp_;  // tmp_ empty: written in place
  int fd_ = -1;
  std::FILE* stream_ = nullptr;
  int error_ = 0;  // errno of the first failed write
};

// `contents` as the whole of `path` (OutputFile, replace mode); errors name `flag`.
void write_output(const std::string& flag, const std::string& path, std::string_view contents);

}  // namespace stratagem::io
