// Communicator: the collectives and point-to-point transfers the runtime needs, over one group
// of ranks. The MPI version serves the CPU backend; an NCCL version implements the same
// interface for CUDA. Nonblocking calls return a Request that the ops depending on the
// transfer wait for, so communication overlaps compute as the Program's streams say.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace stratagem {

// A transfer in flight. wait() completes it (the buffers may then be reused); it throws
// CommTimeout when the peers do not arrive within the communicator's timeout.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete (never blocks)
};
using RequestPtr = std::unique_ptr<Request>;

// Several transfers waited for as one (a reduction over a layer's flat runs, an all-to-all's
// point-to-point pairs).
class RequestGroup final : public Request {
 public:
  std::vector<RequestPtr> parts;
  void wait() override {
    for (auto& r : parts) r->wait();
  }
  bool test() override {
    bool all = true;
    for (auto& r : parts) all = r->test() && all;
    return all;
  }
};

enum class ReduceOp { sum, max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // ---- blocking ---------------------------------------------------------------------------
  // In place: every member ends with the element-wise sum.
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
  virtual void all_reduce_sum(double* data, int64_t count) = 0;
  virtual void all_reduce_max(double* data, int64_t count) = 0;
  // Uneven variants (ZeRO shards rarely split a tensor evenly): member i receives the sum of
  // the counts[i] elements that follow the first i blocks of `send`.
  virtual void reduce_scatter_sum_v(const float* send, float* recv,
                                    const std::vector<int64_t>& counts) = 0;
  // In place: member i's block sits at its displacement inside `buf`; afterwards every member
  // holds all blocks.
  virtual void all_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) = 0;
  virtual void barrier() = 0;
  // ---- nonblocking ------------------------------------------------------------------------
  // In place over `count` elements.
  virtual RequestPtr iall_reduce(float* data, int64_t count, ReduceOp op) = 0;
  // send holds size() blocks of block_count; member i receives the sum of block i.
  virtual RequestPtr ireduce_scatter(const float* send, float* recv, int64_t block_count) = 0;
  // Each member contributes block_count; recv holds size() blocks in member order.
  virtual RequestPtr iall_gather(const float* send, float* recv, int64_t block_count) = 0;
  // Uneven variants over `counts` (one per member): reduce-scatter into recv (counts[rank]
  // elements), and all-gather in place (member i's block at its displacement in buf).
  virtual RequestPtr ireduce_scatter_v(const float* send, float* recv,
                                       const std::vector<int64_t>& counts) = 0;
  virtual RequestPtr iall_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) = 0;
  // Point-to-point with a member (by its rank in this communicator); `tag` tells apart
  // transfers between the same pair (an interleaved pipeline of two stages sends both ways).
  virtual RequestPtr isend(const float* data, int64_t count, int peer, int tag) = 0;
  virtual RequestPtr irecv(float* data, int64_t count, int peer, int tag) = 0;
  // ---- all-to-all (expert parallelism's dispatch and combine) -----------------------------
  // Blocking: member j's recv[i*per_member ...] = member i's send[j*per_member ...] (the
  // counts of the uneven exchange that follows).
  virtual void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t per_member);
  // Member i's block of send_counts[j] elements goes to member j, whose recv holds the blocks
  // of every member in member order (recv_counts[i] from member i). Nonblocking.
  virtual RequestPtr iall_to_all_v(const float* send, const std::vector<int64_t>& send_counts,
                                   float* recv, const std::vector<int64_t>& recv_counts);
};

// The defaults: a communicator without all-to-all names itself (the MPI one has it).
inline void Communicator::all_to_all_counts(const int64_t*, int64_t*, int64_t) {
  throw std::runtime_error(
      "this communicator has no all-to-all yet (expert parallelism runs "
      "over MPI communicators: --comm mpi)");
}
inline RequestPtr Communicator::iall_to_all_v(const float*, const std::vector<int64_t>&, float*,
                                              const std::vector<int64_t>&) {
  throw std::runtime_error(
      "this communicator has no all-to-all yet (expert parallelism runs "
      "over MPI communicators: --comm mpi)");
}

// Thrown by Request::wait when a transfer waits longer than the timeout: names the operation,
// the group and the members that did not arrive (when known).
class CommTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A communicator over an MPI communicator (not owned: the caller frees it). `name` labels the
// group in errors; waits longer than timeout_s throw CommTimeout (<= 0: wait forever).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name = "world",
                                                    double timeout_s = 0);

// Asynchronous progress of the MPI communicators' nonblocking transfers (the CPU backend's):
// a thread enters MPI while any is in flight, so they move on during computation, as a
// device's network does (src/runtime/comm/mpi_progress.hpp). Needs MPI initialized with
// MPI_THREAD_MULTIPLE, else start does nothing; stop before MPI_Finalize.
void start_mpi_progress();
void stop_mpi_progress();

// Makes the communicator of one group from the group's MPI communicator (not owned), its name
// for errors and the timeout. ParallelState calls it once per distinct group, in Layout order,
// on every member at the same time, so a factory may itself be collective over `comm` (NCCL
// bootstraps over it). The default is make_mpi_communicator.
using CommFactory = std::function<std::unique_ptr<Communicator>(
    MPI_Comm comm, const std::string& name, double timeout_s)>;

// MPI communicators for the Layout's groups that contain this rank, made collectively over
// world with MPI_Comm_split (every rank must call it with the same group list).
class MpiGroups {
 public:
  // `groups[i]` lists the world ranks of group i; every world rank calls this with the same
  // list. Afterwards comm(i) is this rank's communicator for group i, or MPI_COMM_NULL.
  MpiGroups(MPI_Comm world, const std::vector<std::vector<int>>& groups);
  ~MpiGroups();
  MpiGroups(const MpiGroups&) = delete;
  MpiGroups& operator=(const MpiGroups&) = delete;
  MPI_Comm comm(int group) const { return comms_.at(group); }

 private:
  std::vector<MPI_Comm> comms_;
};

}  // namespace stratagem
