// MPI through host memory for the CUDA backend (--comm mpi): every device buffer is copied to
// a host buffer, the MPI communicator runs on that, and the result is copied back when the
// request completes. Slower than NCCL, but several ranks can then share one GPU, which is how
// multi-rank plans are tested on a single GPU. Host pointers (the step's scalars) pass through.
#include <cuda_runtime.h>

#include <numeric>
#include <vector>

#include "src/runtime/cuda/check.hpp"
#include "src/runtime/cuda/comm_common.hpp"
#include "src/runtime/cuda/cuda_backend.hpp"
#include "src/runtime/cuda/device.hpp"

namespace stratagem::cuda {
namespace {

class StagedRequest final : public Request {
 public:
  StagedRequest(RequestPtr inner, std::vector<float> host, float* device_dst, int64_t offset,
                int64_t count, cudaStream_t stream)
      : inner_(std::move(inner)),
        host_(std::move(host)),
        dst_(device_dst),
        offset_(offset),
        count_(count),
        stream_(stream) {}
  void wait() override {
    inner_->wait();
    finish();
  }
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (done_) return;
    done_ = true;
    if (dst_ && count_ > 0) {
      STRATAGEM_CUDA_CHECK(cudaMemcpyAsync(dst_, host_.data() + offset_, count_ * sizeof(float),
                                           cudaMemcpyHostToDevice, stream_));
      // The host buffer dies with this request: the copy must have read it.
      STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }
  RequestPtr inner_;
  std::vector<float> host_;
  float* dst_;
  int64_t offset_, count_;
  cudaStream_t stream_;
  bool done_ = false;
};

class HostStagingCommunicator final : public Communicator {
 public:
  HostStagingCommunicator(std::unique_ptr<Communicator> inner, CudaBackend& be)
      : inner_(std::move(inner)), be_(be) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void all_reduce_sum(float* data, int64_t count) override {
    iall_reduce(data, count, ReduceOp::sum)->wait();
  }
  void all_reduce_sum(double* data, int64_t count) override {
    staged_doubles(data, count, [&](double* h) { inner_->all_reduce_sum(h, count); });
  }
  void all_reduce_max(double* data, int64_t count) override {
    staged_doubles(data, count, [&](double* h) { inner_->all_reduce_max(h, count); });
  }
  void reduce_scatter_sum_v(const float* send, float* recv,
                            const std::vector<int64_t>& counts) override {
    ireduce_scatter_v(send, recv, counts)->wait();
  }
  void all_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) override {
    iall_gather_v_inplace(buf, counts)->wait();
  }
  void barrier() override { inner_->barrier(); }

  RequestPtr iall_reduce(float* data, int64_t count, ReduceOp op) override {
    if (!is_device_pointer(data)) return inner_->iall_reduce(data, count, op);
    std::vector<float> h = to_host(data, count);
    RequestPtr r = inner_->iall_reduce(h.data(), count, op);
    return staged(std::move(r), std::move(h), data, 0, count);
  }
  RequestPtr ireduce_scatter(const float* send, float* recv, int64_t block_count) override {
    if (!is_device_pointer(send)) return inner_->ireduce_scatter(send, recv, block_count);
    std::vector<float> h = to_host(send, block_count * size());
    h.resize(h.size() + block_count);
    float* hr = h.data() + block_count * size();
    RequestPtr r = inner_->ireduce_scatter(h.data(), hr, block_count);
    return staged(std::move(r), std::move(h), recv, block_count * size(), block_count);
  }
  RequestPtr iall_gather(const float* send, float* recv, int64_t block_count) override {
    if (!is_device_pointer(send)) return inner_->iall_gather(send, recv, block_count);
    std::vector<float> h = to_host(send, block_count);
    h.resize(block_count * (1 + size()));
    RequestPtr r = inner_->iall_gather(h.data(), h.data() + block_count, block_count);
    return staged(std::move(r), std::move(h), recv, block_count, block_count * size());
  }
  RequestPtr ireduce_scatter_v(const float* send, float* recv,
                               const std::vector<int64_t>& counts) override {
    if (!is_device_pointer(send)) return inner_->ireduce_scatter_v(send, recv, counts);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t mine = counts.at(static_cast<size_t>(rank()));
    std::vector<float> h = to_host(send, total);
    h.resize(total + mine);
    RequestPtr r = inner_->ireduce_scatter_v(h.data(), h.data() + total, counts);
    return staged(std::move(r), std::move(h), recv, total, mine);
  }
  RequestPtr iall_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) override {
    if (!is_device_pointer(buf)) return inner_->iall_gather_v_inplace(buf, counts);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    std::vector<float> h = to_host(buf, total);
    RequestPtr r = inner_->iall_gather_v_inplace(h.data(), counts);
    return staged(std::move(r), std::move(h), buf, 0, total);
  }
  RequestPtr isend(const float* data, int64_t count, int peer, int tag) override {
    if (!is_device_pointer(data)) return inner_->isend(data, count, peer, tag);
    std::vector<float> h = to_host(data, count);
    RequestPtr r = inner_->isend(h.data(), count, peer, tag);
    return staged(std::move(r), std::move(h), nullptr, 0, 0);
  }
  RequestPtr irecv(float* data, int64_t count, int peer, int tag) override {
    if (!is_device_pointer(data)) return inner_->irecv(data, count, peer, tag);
    std::vector<float> h(static_cast<size_t>(count));
    RequestPtr r = inner_->irecv(h.data(), count, peer, tag);
    return staged(std::move(r), std::move(h), data, 0, count);
  }

 private:
  // Device -> host after the compute stream's pending work (which produced the data).
  std::vector<float> to_host(const float* device, int64_t count) {
    std::vector<float> h(static_cast<size_t>(count));
    if (count > 0) {
      STRATAGEM_CUDA_CHECK(cudaMemcpyAsync(h.data(), device, count * sizeof(float),
                                           cudaMemcpyDeviceToHost, be_.compute_stream()));
      STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(be_.compute_stream()));
    }
    return h;
  }
  RequestPtr staged(RequestPtr r, std::vector<float> h, float* dst, int64_t offset, int64_t count) {
    return std::make_unique<StagedRequest>(std::move(r), std::move(h), dst, offset, count,
                                           be_.compute_stream());
  }
  template <class F>
  void staged_doubles(double* data, int64_t count, F&& op) {
    if (!is_device_pointer(data)) return op(data);
    std::vector<double> h(static_cast<size_t>(count));
    cudaStream_t s = be_.compute_stream();
    STRATAGEM_CUDA_CHECK(
        cudaMemcpyAsync(h.data(), data, count * sizeof(double), cudaMemcpyDeviceToHost, s));
    STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(s));
    op(h.data());
    STRATAGEM_CUDA_CHECK(
        cudaMemcpyAsync(data, h.data(), count * sizeof(double), cudaMemcpyHostToDevice, s));
    STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  std::unique_ptr<Communicator> inner_;
  CudaBackend& be_;
};

}  // namespace

CommFactory impl::host_staging_comm_factory(Backend& backend, CommFactory host) {
  CudaBackend& be = as_cuda_backend(backend, "--comm mpi");
  return [&be, host = std::move(host)](MPI_Comm c, const std::string& name,
                                       double timeout_s) -> std::unique_ptr<Communicator> {
    return std::make_unique<HostStagingCommunicator>(host(c, name, timeout_s), be);
  };
}

}  // namespace stratagem::cuda
