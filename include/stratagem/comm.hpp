// Communicator: the collectives the runtime needs, over one group of ranks. The MPI version
// serves the CPU backend; an NCCL version implements the same interface for CUDA.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace stratagem {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every member ends with the element-wise sum.
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
  virtual void all_reduce_sum(double* data, int64_t count) = 0;
  virtual void all_reduce_max(double* data, int64_t count) = 0;
  // send holds size() blocks of block_count; member i receives the sum of block i.
  virtual void reduce_scatter_sum(const float* send, float* recv, int64_t block_count) = 0;
  // Each member contributes block_count; recv holds size() blocks in member order.
  virtual void all_gather(const float* send, float* recv, int64_t block_count) = 0;
  // Uneven variants (ZeRO shards rarely split a tensor evenly): member i receives the sum of
  // the counts[i] elements that follow the first i blocks of `send`.
  virtual void reduce_scatter_sum_v(const float* send, float* recv,
                                    const std::vector<int64_t>& counts) = 0;
  // In place: member i's block sits at its displacement inside `buf`; afterwards every member
  // holds all blocks.
  virtual void all_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) = 0;
  virtual void barrier() = 0;
};

// A communicator over an MPI communicator (not owned: the caller frees it).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

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
