// NcclCommunicator: the Communicator over NCCL for the CUDA backend.
//  - Bootstrap: rank 0 of the group's MPI communicator makes the ncclUniqueId and broadcasts
//    it; ParallelState creates the groups in the same order on every rank, so the broadcasts
//    and ncclCommInitRank calls match.
//  - Streams and NCCL communicators: collectives run on the communicator's own stream. NCCL
//    runs the operations of one NCCL communicator in issue order, so a pipeline stage whose
//    send waits for a peer that is itself sending first would deadlock. Point-to-point
//    transfers therefore get two NCCL communicators of their own (with `p2p`, which the world
//    communicator, the one ParallelState uses between stages, has): one carries every transfer
//    to a higher rank, the other every transfer to a lower one, each on its own stream. On
//    each, data flows one way along the ranks, so the waits cannot form a cycle. Each op first
//    waits (an event) for the compute stream's work so far, which produced its input.
//  - Requests: an event recorded after the op. test() queries it; wait() polls it until the
//    communicator's timeout, then aborts the NCCL communicator and throws CommTimeout; on
//    success the compute stream is also made to wait for the event.
//  - NCCL has no tags: point-to-point transfers between a pair match in issue order, which is
//    the Program's order on both sides.
//  - Host pointers (the step's scalars, in fp64) are staged through device memory.
#include <cuda_runtime.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "src/runtime/cuda/check.hpp"
#include "src/runtime/cuda/comm_common.hpp"
#include "src/runtime/cuda/cuda_backend.hpp"
#include "src/runtime/cuda/device.hpp"

namespace stratagem::cuda {

#if defined(STRATAGEM_HAVE_NCCL)
namespace {

class NcclCommunicator;

class NcclRequest final : public Request {
 public:
  NcclRequest(NcclCommunicator& comm, cudaEvent_t done, std::string what)
      : comm_(comm), done_(done), what_(std::move(what)) {}
  ~NcclRequest() override;
  void wait() override;
  bool test() override;

 private:
  NcclCommunicator& comm_;
  cudaEvent_t done_;
  std::string what_;
  bool complete_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name, double timeout_s, CudaBackend& be, bool p2p)
      : name_(std::move(name)), timeout_s_(timeout_s), be_(be) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    STRATAGEM_CUDA_CHECK(cudaSetDevice(be.device()));
    nccl_ = init(comm);
    if (p2p) up_ = init(comm), down_ = init(comm);
    for (cudaStream_t* s : {&coll_, &up_stream_, &down_stream_})
      STRATAGEM_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    // After ncclCommAbort (a timeout) the communicators are already released.
    if (!aborted_)
      for (ncclComm_t c : {nccl_, up_, down_})
        if (c) ncclCommDestroy(c);
    for (cudaStream_t s : {coll_, up_stream_, down_stream_})
      if (s) cudaStreamDestroy(s);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  cudaStream_t compute_stream() const { return be_.compute_stream(); }

  // ---- blocking ---------------------------------------------------------------------------
  void all_reduce_sum(float* data, int64_t count) override {
    iall_reduce(data, count, ReduceOp::sum)->wait();
  }
  void all_reduce_sum(double* data, int64_t count) override {
    reduce_doubles(data, count, ncclSum);
  }
  void all_reduce_max(double* data, int64_t count) override {
    reduce_doubles(data, count, ncclMax);
  }
  void reduce_scatter_sum_v(const float* send, float* recv,
                            const std::vector<int64_t>& counts) override {
    ireduce_scatter_v(send, recv, counts)->wait();
  }
  void all_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) override {
    iall_gather_v_inplace(buf, counts)->wait();
  }
  void barrier() override {
    float* one = scratch_floats(1);
    STRATAGEM_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), coll_));
    issue(coll_, "barrier", [&] {
      STRATAGEM_CUDA_CHECK(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, nccl_, coll_));
    })->wait();
  }

  // ---- nonblocking ------------------------------------------------------------------------
  RequestPtr iall_reduce(float* data, int64_t count, ReduceOp op) override {
    return issue(coll_, "all-reduce", [&] {
      STRATAGEM_CUDA_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat,
                                         op == ReduceOp::max ? ncclMax : ncclSum, nccl_, coll_));
    });
  }
  RequestPtr ireduce_scatter(const float* send, float* recv, int64_t block_count) override {
    return issue(coll_, "reduce-scatter", [&] {
      STRATAGEM_CUDA_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(block_count),
                                             ncclFloat, ncclSum, nccl_, coll_));
    });
  }
  RequestPtr iall_gather(const float* send, float* recv, int64_t block_count) override {
    return issue(coll_, "all-gather", [&] {
      STRATAGEM_CUDA_CHECK(
          ncclAllGather(send, recv, static_cast<size_t>(block_count), ncclFloat, nccl_, coll_));
    });
  }
  // Uneven blocks: one ncclReduce per member (rooted at it), fused into one NCCL group.
  RequestPtr ireduce_scatter_v(const float* send, float* recv,
                               const std::vector<int64_t>& counts) override {
    check_counts(counts, "reduce-scatter-v");
    return issue(coll_, "reduce-scatter-v", [&] {
      STRATAGEM_CUDA_CHECK(ncclGroupStart());
      int64_t displ = 0;
      for (int i = 0; i < size_; ++i) {
        const int64_t n = counts[static_cast<size_t>(i)];
        if (n > 0)
          STRATAGEM_CUDA_CHECK(ncclReduce(send + displ, i == rank_ ? recv : nullptr,
                                          static_cast<size_t>(n), ncclFloat, ncclSum, i, nccl_,
                                          coll_));
        displ += n;
      }
      STRATAGEM_CUDA_CHECK(ncclGroupEnd());
    });
  }
  // Uneven in-place all-gather: one ncclBroadcast per member's block.
  RequestPtr iall_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) override {
    check_counts(counts, "all-gather-v");
    return issue(coll_, "all-gather-v", [&] {
      STRATAGEM_CUDA_CHECK(ncclGroupStart());
      int64_t displ = 0;
      for (int i = 0; i < size_; ++i) {
        const int64_t n = counts[static_cast<size_t>(i)];
        if (n > 0)
          STRATAGEM_CUDA_CHECK(ncclBroadcast(buf + displ, buf + displ, static_cast<size_t>(n),
                                             ncclFloat, i, nccl_, coll_));
        displ += n;
      }
      STRATAGEM_CUDA_CHECK(ncclGroupEnd());
    });
  }
  // A transfer to a higher rank goes on `up_`, to a lower one on `down_`, on both sides.
  RequestPtr isend(const float* data, int64_t count, int peer, int /*tag*/) override {
    const Lane l = lane(peer, peer > rank_);
    return issue(l.stream, "send to " + std::to_string(peer), [&] {
      STRATAGEM_CUDA_CHECK(
          ncclSend(data, static_cast<size_t>(count), ncclFloat, peer, l.comm, l.stream));
    });
  }
  RequestPtr irecv(float* data, int64_t count, int peer, int /*tag*/) override {
    const Lane l = lane(peer, rank_ > peer);
    return issue(l.stream, "receive from " + std::to_string(peer), [&] {
      STRATAGEM_CUDA_CHECK(
          ncclRecv(data, static_cast<size_t>(count), ncclFloat, peer, l.comm, l.stream));
    });
  }

  // Polls `done` until the timeout; on expiry aborts NCCL (peers blocked on us fail too).
  void wait_event(cudaEvent_t done, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaEventQuery(done);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) STRATAGEM_CUDA_CHECK(e);
      for (ncclComm_t c : {nccl_, up_, down_}) {
        if (!c) continue;
        ncclResult_t async = ncclSuccess;
        STRATAGEM_CUDA_CHECK(ncclCommGetAsyncError(c, &async));
        STRATAGEM_CUDA_CHECK(async);
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_s_ > 0 && waited > timeout_s_) {
        aborted_ = true;
        for (ncclComm_t c : {nccl_, up_, down_})
          if (c) ncclCommAbort(c);
        throw CommTimeout(what + " on " + name_ + " did not complete within " +
                          std::to_string(timeout_s_) + " s (NCCL communicator aborted)");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // Later kernels that read the result are ordered after it, too.
    STRATAGEM_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), done, 0));
  }

 private:
  // Rank 0 of `comm` makes the unique id and broadcasts it; every member joins.
  ncclComm_t init(MPI_Comm comm) {
    ncclUniqueId id{};
    if (rank_ == 0) STRATAGEM_CUDA_CHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
    ncclComm_t c = nullptr;
    STRATAGEM_CUDA_CHECK(ncclCommInitRank(&c, size_, id, rank_));
    return c;
  }
  struct Lane {
    ncclComm_t comm;
    cudaStream_t stream;
  };
  Lane lane(int peer, bool upward) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw std::invalid_argument("point-to-point on " + name_ + ": peer " + std::to_string(peer) +
                                  " is not another member of " + std::to_string(size_));
    if (!up_)
      throw std::logic_error("point-to-point on " + name_ +
                             ": this NCCL communicator was made without transfer lanes");
    return upward ? Lane{up_, up_stream_} : Lane{down_, down_stream_};
  }
  template <class F>
  RequestPtr issue(cudaStream_t stream, std::string what, F&& call) {
    cudaEvent_t ready = nullptr, done = nullptr;
    STRATAGEM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    STRATAGEM_CUDA_CHECK(cudaEventRecord(ready, compute_stream()));
    STRATAGEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
    STRATAGEM_CUDA_CHECK(cudaEventDestroy(ready));  // released once it has completed
    call();
    STRATAGEM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    STRATAGEM_CUDA_CHECK(cudaEventRecord(done, stream));
    return std::make_unique<NcclRequest>(*this, done, std::move(what));
  }
  void check_counts(const std::vector<int64_t>& counts, const char* what) const {
    if (static_cast<int>(counts.size()) != size_)
      throw std::invalid_argument(std::string(what) + " on " + name_ + ": " +
                                  std::to_string(counts.size()) + " counts for " +
                                  std::to_string(size_) + " members");
  }
  float* scratch_floats(int64_t n) {
    if (scratch_.numel() < n) scratch_ = be_.allocate(Shape{n});
    return scratch_.data;
  }
  void reduce_doubles(double* data, int64_t count, ncclRedOp_t op) {
    double* dev = data;
    const bool host = !is_device_pointer(data);
    if (host) {
      dev = reinterpret_cast<double*>(scratch_floats(2 * count));
      STRATAGEM_CUDA_CHECK(cudaMemcpyAsync(dev, data, count * sizeof(double),
                                           cudaMemcpyHostToDevice, compute_stream()));
    }
    issue(coll_, "all-reduce (fp64)", [&] {
      STRATAGEM_CUDA_CHECK(
          ncclAllReduce(dev, dev, static_cast<size_t>(count), ncclDouble, op, nccl_, coll_));
    })->wait();
    if (host) {
      STRATAGEM_CUDA_CHECK(cudaMemcpyAsync(data, dev, count * sizeof(double),
                                           cudaMemcpyDeviceToHost, compute_stream()));
      STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
    }
  }

  std::string name_;
  double timeout_s_;
  CudaBackend& be_;
  int rank_ = 0, size_ = 1;
  ncclComm_t nccl_ = nullptr;                 // collectives
  ncclComm_t up_ = nullptr, down_ = nullptr;  // transfers to higher / lower ranks
  bool aborted_ = false;
  cudaStream_t coll_ = nullptr, up_stream_ = nullptr, down_stream_ = nullptr;
  Tensor scratch_;
};

NcclRequest::~NcclRequest() {
  cudaEventDestroy(done_);
}
void NcclRequest::wait() {
  if (complete_) return;
  comm_.wait_event(done_, what_);
  complete_ = true;
}
bool NcclRequest::test() {
  if (complete_) return true;
  if (cudaEventQuery(done_) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  wait();
  return true;
}

}  // namespace

CommFactory impl::nccl_comm_factory(Backend& backend) {
  CudaBackend& be = as_cuda_backend(backend, "--comm nccl");
  return [&be](MPI_Comm c, const std::string& name,
               double timeout_s) -> std::unique_ptr<Communicator> {
    // Pipeline stages exchange activations over the world communicator (ParallelState).
    return std::make_unique<NcclCommunicator>(c, name, timeout_s, be, name == "world");
  };
}

#else  // built without nccl.h / libnccl

CommFactory impl::nccl_comm_factory(Backend&) {
  throw std::invalid_argument(
      "--comm nccl: this CUDA plugin was built without NCCL (nccl.h and libnccl were not found "
      "at configure time); use --comm mpi");
}

#endif

}  // namespace stratagem::cuda
