// A bound on the time libhdf5 may spend in a file that stratagem did not verify: a trace
// written without a digest, a `--data` token file (made by the user, e.g. with h5py). libhdf5
// 1.10.8 loops forever on some damaged files (test/fuzz/known-hdf5/: a global heap whose free
// space claims 0 bytes), where no error can be raised. Every libhdf5 call on such a file runs
// inside a guard; one that does not return within the bound ends the process with one line
// naming the file and exit code 2 (a bounded section of stratagem/blocking_section.hpp, which in
// an MPI job ends the other ranks too: the launcher sees a rank exit without MPI_Finalize).
//
// The bound: STRATAGEM_HDF5_TIMEOUT_S seconds (default 300; 0 turns the guard off), plus one
// second per 10 MB of the file beyond its first GB (a slow file system reading a large file).
// Checkpoints and traces with a digest are checked before libhdf5 opens them
// (src/io/file_digest.hpp) and need no guard.
//
// libhdf5 also crashes on some damaged files (SIGSEGV, SIGFPE: test/fuzz/known-hdf5/), inside
// the library, before stratagem sees any data. So the readers of unverified files do all their
// libhdf5 work in a forked child (read_isolated): the parent never opens such a file with
// libhdf5; it receives what the child read, or the child's error, or, when the child dies from
// a signal, one line naming the file ("libhdf5 crashed reading it (SIGSEGV); the file is
// damaged") and exit 2. The child calls neither MPI nor exit handlers (it ends with _exit), so
// it is safe after MPI_Init (Open MPI over shared memory and TCP; not checked with InfiniBand
// verbs, which warn on fork). Where fork fails (no memory for the page tables), the read runs in
// the process under the time guard alone.
#pragma once
#include <functional>
#include <memory>
#include <string>

namespace stratagem {
class BlockingSection;
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
  std::unique_ptr<BlockingSection> scope_;
};

// Runs `read` in a forked child and returns the bytes it returned. An InputError thrown there is
// thrown here with the same message (any other exception as std::runtime_error); a child killed
// by a signal or ending without its answer is an InputError "PATH: libhdf5 crashed reading it
// (SIGNAME); the file is damaged"; one still running after hdf5_read_bound_s(path) is killed and
// is the time guard's InputError. `read` must not call MPI.
// A reader that asks libhdf5 several questions about one file (trace::Reader: one child per
// question) passes its `budget_s`, set to hdf5_read_bound_s(path) once: each child is bounded by
// what is left of it, and the time it took is taken off, so that the file as a whole is bounded
// (a damaged trace on which every question is slow would otherwise take the bound per rank).
std::string read_isolated(const std::string& path, const std::function<std::string()>& read,
                          double* budget_s = nullptr);

// Hooks for the fuzz targets (test/fuzz/harness.cpp), which must see what the child covered and
// tell a fault in stratagem's code inside the child from libhdf5's. Production sets none.
struct IsolationHooks {
  void (*child_start)() = nullptr;  // in the child, before `read`
  void (*child_end)() = nullptr;    // in the child, after `read`, before _exit
  // In the parent once the child is reaped: its wait status, and whether the parent killed it at
  // the bound.
  void (*parent_end)(int wait_status, bool killed_at_bound) = nullptr;
};
void set_isolation_hooks(const IsolationHooks& hooks);

}  // namespace stratagem::io
