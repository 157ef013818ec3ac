#include <stdexcept>
#include <string>
#include <vector>

#include "stratagem/comm.hpp"

// One checked-call macro for MPI, reporting file and line.
#define STRATAGEM_MPI_CHECK(call)                                                       \
  do {                                                                                  \
    int rc_ = (call);                                                                   \
    if (rc_ != MPI_SUCCESS) {                                                           \
      char msg_[MPI_MAX_ERROR_STRING];                                                  \
      int len_ = 0;                                                                     \
      MPI_Error_string(rc_, msg_, &len_);                                               \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": " #call ": " + std::string(msg_, len_));              \
    }                                                                                   \
  } while (0)

namespace stratagem {
namespace {

// MPI counts are int; large buffers go in chunks.
constexpr int64_t kMaxChunk = 1 << 30;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm c) : comm_(c) {
    MPI_Comm_rank(c, &rank_);
    MPI_Comm_size(c, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, int64_t count) override {
    reduce(data, count, MPI_FLOAT, MPI_SUM);
  }
  void all_reduce_sum(double* data, int64_t count) override {
    reduce(data, count, MPI_DOUBLE, MPI_SUM);
  }
  void all_reduce_max(double* data, int64_t count) override {
    reduce(data, count, MPI_DOUBLE, MPI_MAX);
  }

  void reduce_scatter_sum(const float* send, float* recv, int64_t block) override {
    if (block > kMaxChunk) throw std::runtime_error("reduce_scatter: block too large for MPI");
    STRATAGEM_MPI_CHECK(
        MPI_Reduce_scatter_block(send, recv, static_cast<int>(block), MPI_FLOAT, MPI_SUM, comm_));
  }
  void all_gather(const float* send, float* recv, int64_t block) override {
    if (block > kMaxChunk) throw std::runtime_error("all_gather: block too large for MPI");
    STRATAGEM_MPI_CHECK(MPI_Allgather(send, static_cast<int>(block), MPI_FLOAT, recv,
                                      static_cast<int>(block), MPI_FLOAT, comm_));
  }
  void reduce_scatter_sum_v(const float* send, float* recv,
                            const std::vector<int64_t>& counts) override {
    std::vector<int> c = to_int(counts);
    STRATAGEM_MPI_CHECK(MPI_Reduce_scatter(send, recv, c.data(), MPI_FLOAT, MPI_SUM, comm_));
  }
  void all_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) override {
    std::vector<int> c = to_int(counts), displs(c.size(), 0);
    for (size_t i = 1; i < c.size(); ++i) displs[i] = displs[i - 1] + c[i - 1];
    STRATAGEM_MPI_CHECK(
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, c.data(), displs.data(), MPI_FLOAT, comm_));
  }
  void barrier() override { STRATAGEM_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  static std::vector<int> to_int(const std::vector<int64_t>& v) {
    std::vector<int> out;
    int64_t total = 0;
    for (int64_t x : v) out.push_back(static_cast<int>(x)), total += x;
    if (total > kMaxChunk)
      throw std::runtime_error("collective: buffer too large for one MPI call");
    return out;
  }
  template <class T>
  void reduce(T* data, int64_t count, MPI_Datatype type, MPI_Op op) {
    for (int64_t at = 0; at < count; at += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - at));
      STRATAGEM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + at, n, type, op, comm_));
    }
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

MpiGroups::MpiGroups(MPI_Comm world, const std::vector<std::vector<int>>& groups) {
  int me = 0;
  MPI_Comm_rank(world, &me);
  for (const auto& g : groups) {
    int pos = -1;
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i] == me) pos = static_cast<int>(i);
    MPI_Comm c = MPI_COMM_NULL;
    // Members get color 0 ordered by their position in the group; others opt out.
    STRATAGEM_MPI_CHECK(MPI_Comm_split(world, pos >= 0 ? 0 : MPI_UNDEFINED, pos, &c));
    comms_.push_back(c);
  }
}

MpiGroups::~MpiGroups() {
  for (MPI_Comm& c : comms_)
    if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
}

}  // namespace stratagem
