// A bound on the time libhdf5 may spend in a file that stratagem did not verify: a trace
// written without a digest, a `--data` token file (made by the user, e.g. with h5py). libhdf5
// 1.10.8 loops forever on some damaged files (test/fuzz/known-hdf5/: a global heap whose free
// space claims 0 bytes), where no error can be raised. Every libhdf5 call on such a file runs
// inside a guard; one that does not return within the bound ends the process with one line
// naming the file and exit code 2 (the watchdog of stratagem/watchdog.hpp, which in an MPI job
// ends the other ranks too: the launcher sees a rank exit without MPI_Finalize).
//
// The bound: STRATAGEM_HDF5_TIMEOUT_S seconds (default 300; 0 turns the guard off), plus one
// second per 10 MB of the file beyond its first GB (a slow file system reading a large file).
// Checkpoints and traces with a digest are checked before libhdf5 opens them
// (src/io/file_digest.hpp) and need no guard.
#pragma once
#include <memory>
#include <string>

namespace stratagem {
class WatchdogScope;
}

namespace stratagem::io {

// The bound for the file at `path`, in seconds (0: no guard).
double hdf5_read_bound_s(const std::string& path);

class Hdf5Guard {
 public:
  // Armed for `path` when `armed`; `bound_s` < 0: hdf5_read_bound_s(path).
  explicit Hdf5Guard(const std::string& path, bool armed = true, double bound_s = -1);
  ~Hdf5Guard();
  Hdf5Guard(const Hdf5Guard&) = delete;
  Hdf5Guard& operator=(const Hdf5Guard&) = delete;

 private:
  std::unique_ptr<WatchdogScope> scope_;
};

}  // namespace stratagem::io
