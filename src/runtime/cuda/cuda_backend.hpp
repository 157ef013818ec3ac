// CudaBackend: the Backend on one CUDA device. Kernels live in one .cu file per family, as
// the CPU backend's do, and take their per-element math from stratagem/kernel_math.hpp (the
// same functions the CPU backend runs, so CI checks the formulas on CPU).
//  - Every tensor the executor sees is fp32 (master weights, gradients, optimizer states,
//    activations). With compute type bf16 the GEMMs (linear layers and attention's batched
//    products) cast their two operands to bf16 and accumulate in fp32 into an fp32 result,
//    as torch.autocast does; everything else computes in fp32.
//  - All work goes on one compute stream, in issue order; download() and the reductions that
//    return a host value synchronize it. Communicators order themselves against it with
//    events (compute_stream()).
//  - Device memory comes from a caching pool (src/runtime/alloc/caching_pool.hpp).
// Internal to src/runtime/cuda.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "src/runtime/alloc/caching_pool.hpp"
#include "src/runtime/cuda/gemm_steps.hpp"
#include "stratagem/backend.hpp"

namespace stratagem::cuda {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, ScalarType compute);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }

  int device() const { return device_; }
  ScalarType compute_type() const { return compute_; }
  cudaStream_t compute_stream() const { return stream_; }
  const alloc::CachingPool::Stats& memory_stats() const { return pool_->stats(); }
  // The category later allocations are counted under (the executor does not pass one yet).
  void set_allocation_category(MemCategory c) { category_ = c; }

  Tensor allocate(Shape shape) override;
  Tensor allocate(Shape shape, ScalarType dtype);
  void fill(Tensor& t, float value) override;
  void copy(Tensor& dst, const Tensor& src) override;
  void upload(Tensor& dst, const float* host) override;
  void download(float* host, const Tensor& src) override;
  void synchronize() override;

  void embedding_forward(Tensor& out, std::span<const int32_t> tokens, const Tensor& wte,
                         const Tensor& wpe) override;
  void embedding_backward(Tensor& dwte, Tensor& dwpe, std::span<const int32_t> tokens,
                          const Tensor& dout) override;

  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, float eps) override;
  void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd) override;
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       float eps) override;
  void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd) override;

  void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override;
  void matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight) override;

  void rope_forward(Tensor& qkv, int heads, int kv_heads, float theta) override;
  void rope_backward(Tensor& dqkv, int heads, int kv_heads, float theta) override;

  void attention_forward(Tensor& out, Tensor& att, Tensor& lse, const Tensor& qkv, int heads,
                         int kv_heads) override;
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& qkv,
                          const Tensor& att, const Tensor& lse, int heads, int kv_heads) override;

  void gelu_forward(Tensor& out, const Tensor& inp) override;
  void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void swiglu_forward(Tensor& out, const Tensor& inp) override;
  void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void residual_forward(Tensor& out, const Tensor& a, const Tensor& b) override;
  void residual_backward(Tensor& dinp, const Tensor& dout) override;

  void crossentropy_forward(Tensor& losses, const Tensor& logits,
                            std::span<const int32_t> targets) override;
  void crossentropy_softmax_backward(Tensor& dlogits, const Tensor& logits,
                                     std::span<const int32_t> targets, float scale) override;
  void crossentropy_row_max(Tensor& max, const Tensor& logits, int64_t valid) override;
  void crossentropy_sums(Tensor& sums, const Tensor& logits, const Tensor& max,
                         std::span<const int32_t> targets, int64_t vocab_begin,
                         int64_t valid) override;
  void crossentropy_shard_backward(Tensor& dlogits, const Tensor& logits, const Tensor& max,
                                   const Tensor& sums, std::span<const int32_t> targets,
                                   int64_t vocab_begin, int64_t valid, float scale) override;

  double sum_squares(const Tensor& t) override;
  void scale(Tensor& t, float factor) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWStep& step) override;

  // ---- for the kernel files --------------------------------------------------------------
  // The Ops of gemm_steps.hpp on this backend: cuBLASLt and the kernels, on the compute stream.
  struct DeviceOps;
  // C (m x n, column-major, ldc) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C (+ bias
  // per row of C when given), over `batch` matrices `stride*` elements apart. A, B and C are
  // fp32; with compute type bf16, A and B are cast to bf16 first (fp32 accumulate).
  void gemm(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, float* c,
            int64_t ldc, int64_t stride_c, int64_t batch, float alpha, float beta,
            const float* bias = nullptr);
  // Host ids copied to device memory in stream order (slot 0: tokens, 1: targets).
  const int32_t* device_ids(std::span<const int32_t> ids, int slot);
  // Scratch the size of `shape`, released to the pool when the tensor is dropped.
  Tensor scratch(Shape shape, ScalarType dtype = ScalarType::fp32) {
    return allocate(shape, dtype);
  }
  const float* rope_table(int64_t T, int64_t hd, float theta);

 private:
  int device_;
  ScalarType compute_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  // classic cuBLAS: the fallback of gemm()
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::shared_ptr<alloc::CachingPool> pool_;
  MemCategory category_ = MemCategory::buffers;
  Tensor ids_[2];
  Tensor rope_;
  int64_t rope_T_ = 0, rope_hd_ = 0;
  float rope_theta_ = 0;
  Tensor partials_;  // sum_squares' per-block fp64 partials
};

}  // namespace stratagem::cuda
