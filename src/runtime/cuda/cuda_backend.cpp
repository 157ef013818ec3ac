// CudaBackend: construction, memory, and the kernels that need no GEMM. Shape checks mirror
// the CPU backend's, so a wrong call fails the same way on either.
#include "src/runtime/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "src/runtime/cuda/check.hpp"
#include "src/runtime/cuda/kernels.hpp"
#include "src/runtime/kernel_checks.hpp"

namespace stratagem::cuda {
using namespace checks;
namespace {
std::string err(const char* kernel, const std::string& what) {
  return kernel_error(kernel, what);
}
void expect_fp32(const char* kernel, const Tensor& t) {
  if (t.defined() && t.dtype != ScalarType::fp32)
    throw std::invalid_argument(
        err(kernel, "expects fp32 tensors, got " + std::string(to_string(t.dtype))));
}
}  // namespace

CudaBackend::CudaBackend(int device, ScalarType compute) : device_(device), compute_(compute) {
  STRATAGEM_CUDA_CHECK(cudaSetDevice(device));
  STRATAGEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  STRATAGEM_CUDA_CHECK(cublasLtCreate(&lt_));
  STRATAGEM_CUDA_CHECK(cublasCreate(&blas_));
  STRATAGEM_CUDA_CHECK(cublasSetStream(blas_, stream_));
  // fp32 stays fp32: no TF32 (the CPU comparison at 1e-5 needs it).
  STRATAGEM_CUDA_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  workspace_bytes_ = size_t{32} << 20;  // cuBLASLt's recommended workspace on Hopper
  STRATAGEM_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  const int dev = device;
  pool_ = std::make_shared<alloc::CachingPool>(
      [dev](size_t bytes) -> void* {
        void* p = nullptr;
        cudaSetDevice(dev);
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
          cudaGetLastError();  // clear the sticky-free out-of-memory error
          return nullptr;
        }
        return p;
      },
      [](void* p) { cudaFree(p); });
}

CudaBackend::~CudaBackend() {
  // Drop the backend's own tensors first; the pool lives on in tensors still held elsewhere.
  ids_[0] = ids_[1] = rope_ = partials_ = Tensor{};
  if (stream_) cudaStreamSynchronize(stream_);
  if (workspace_) cudaFree(workspace_);
  if (lt_) cublasLtDestroy(lt_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

Tensor CudaBackend::allocate(Shape shape) {
  return allocate(shape, ScalarType::fp32);
}

Tensor CudaBackend::allocate(Shape shape, ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * element_bytes(dtype);
  void* p = pool_->allocate(bytes, category_);
  std::shared_ptr<alloc::CachingPool> pool = pool_;
  std::shared_ptr<void> storage(p, [pool](void* q) { pool->release(q); });
  return Tensor{static_cast<float*>(p), shape, std::move(storage), dtype, Device::cuda};
}

void CudaBackend::fill(Tensor& t, float value) {
  expect_fp32("fill", t);
  launch_fill(t.data, t.numel(), value, stream_);
}

void CudaBackend::copy(Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel() || dst.dtype != src.dtype)
    throw std::invalid_argument(
        err("copy", "sizes differ: " + dst.shape.str() + " vs " + src.shape.str()));
  if (dst.data != src.data && src.numel() > 0)
    STRATAGEM_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::upload(Tensor& dst, const float* host) {
  expect_fp32("upload", dst);
  // From pageable memory the call returns once `host` has been staged, so the caller may
  // reuse it at once; the copy itself runs in stream order.
  if (dst.numel() > 0)
    STRATAGEM_CUDA_CHECK(
        cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::download(float* host, const Tensor& src) {
  expect_fp32("download", src);
  if (src.numel() > 0)
    STRATAGEM_CUDA_CHECK(
        cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
  STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() {
  STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

const int32_t* CudaBackend::device_ids(std::span<const int32_t> ids, int slot) {
  Tensor& buf = ids_[slot];
  const int64_t need = std::max<int64_t>(1, static_cast<int64_t>(ids.size()));
  if (buf.numel() < need) {
    // The old buffer may still be read by queued kernels; the pool hands it out again only in
    // stream order, which is the order those kernels run in.
    buf = allocate(Shape{need});
  }
  if (!ids.empty())
    STRATAGEM_CUDA_CHECK(cudaMemcpyAsync(buf.data, ids.data(), ids.size() * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, stream_));
  return reinterpret_cast<const int32_t*>(buf.data);
}

// ---- embedding ----------------------------------------------------------------------------
void CudaBackend::embedding_forward(Tensor& out, std::span<const int32_t> tokens, const Tensor& wte,
                                    const Tensor& wpe) {
  check_embedding_shapes("embedding_forward", out, wte, wpe);
  const int64_t B = out.dim(0), T = out.dim(1), C = out.dim(2);
  check_tokens("embedding_forward", tokens, B * T, wte.dim(0));
  launch_embedding_forward(out.data, device_ids(tokens, 0), wte.data, wpe.data, B * T, T, C,
                           stream_);
}

void CudaBackend::embedding_backward(Tensor& dwte, Tensor& dwpe, std::span<const int32_t> tokens,
                                     const Tensor& dout) {
  check_embedding_shapes("embedding_backward", dout, dwte, dwpe);
  const int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
  check_tokens("embedding_backward", tokens, B * T, dwte.dim(0));
  launch_embedding_backward(dwte.data, dwpe.data, device_ids(tokens, 0), dout.data, B, T, C,
                            stream_);
}

// ---- normalization ------------------------------------------------------------------------
void CudaBackend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                    const Tensor& weight, const Tensor& bias, float eps) {
  const auto [N, C] = check_layernorm_forward(out, mean, rstd, inp, weight, bias);
  launch_norm_forward(out.data, mean.data, rstd.data, inp.data, weight.data, bias.data, N, C, eps,
                      stream_);
}

void CudaBackend::layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd) {
  const auto [N, C] = check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  launch_norm_backward_dinp(dinp.data, dout.data, inp.data, weight.data, mean.data, rstd.data, N, C,
                            stream_);
  launch_norm_backward_params(dweight.data, dbias.data, dout.data, inp.data, mean.data, rstd.data,
                              N, C, stream_);
}

void CudaBackend::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp,
                                  const Tensor& weight, float eps) {
  const auto [N, C] = check_rmsnorm_forward(out, rstd, inp, weight);
  launch_norm_forward(out.data, nullptr, rstd.data, inp.data, weight.data, nullptr, N, C, eps,
                      stream_);
}

void CudaBackend::rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const auto [N, C] = check_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  launch_norm_backward_dinp(dinp.data, dout.data, inp.data, weight.data, nullptr, rstd.data, N, C,
                            stream_);
  launch_norm_backward_params(dweight.data, nullptr, dout.data, inp.data, nullptr, rstd.data, N, C,
                              stream_);
}

// ---- rope ---------------------------------------------------------------------------------
const float* CudaBackend::rope_table(int64_t T, int64_t hd, float theta) {
  if (T != rope_T_ || hd != rope_hd_ || theta != rope_theta_ || !rope_.defined()) {
    std::vector<float> host(static_cast<size_t>(T * (hd / 2) * 2));
    math::fill_rope_table(host.data(), T, hd, theta);
    rope_ = allocate(Shape{std::max<int64_t>(1, static_cast<int64_t>(host.size()))});
    if (!host.empty()) upload(rope_, host.data());
    synchronize();
    rope_T_ = T, rope_hd_ = hd, rope_theta_ = theta;
  }
  return rope_.data;
}

void CudaBackend::rope_forward(Tensor& qkv, int heads, int kv_heads, float theta) {
  const QkvDims d = rope_dims("rope_forward", qkv, heads, kv_heads);
  launch_rope(qkv.data, rope_table(d.T, d.hd, theta), d.B * d.T, d.T, d.W, d.hd, heads + kv_heads,
              1.0f, stream_);
}

void CudaBackend::rope_backward(Tensor& dqkv, int heads, int kv_heads, float theta) {
  const QkvDims d = rope_dims("rope_backward", dqkv, heads, kv_heads);
  launch_rope(dqkv.data, rope_table(d.T, d.hd, theta), d.B * d.T, d.T, d.W, d.hd, heads + kv_heads,
              -1.0f, stream_);
}

// ---- pointwise ----------------------------------------------------------------------------
void CudaBackend::gelu_forward(Tensor& out, const Tensor& inp) {
  expect_shape(out, inp.shape, "gelu_forward", "out");
  launch_gelu_forward(out.data, inp.data, inp.numel(), stream_);
}
void CudaBackend::gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  expect_shape(dout, inp.shape, "gelu_backward", "dout");
  expect_shape(dinp, inp.shape, "gelu_backward", "dinp");
  launch_gelu_backward(dinp.data, dout.data, inp.data, inp.numel(), stream_);
}

void CudaBackend::swiglu_forward(Tensor& out, const Tensor& inp) {
  const auto [N, F] = swiglu_dims("swiglu_forward", inp, out);
  launch_swiglu_forward(out.data, inp.data, N, F, stream_);
}
void CudaBackend::swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const auto [N, F] = swiglu_dims("swiglu_backward", inp, dout);
  expect_shape(dinp, inp.shape, "swiglu_backward", "dinp");
  launch_swiglu_backward(dinp.data, dout.data, inp.data, N, F, stream_);
}
void CudaBackend::residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  expect_same_numel("residual_forward", out, a);
  expect_same_numel("residual_forward", out, b);
  launch_add(out.data, a.data, b.data, out.numel(), stream_);
}
void CudaBackend::residual_backward(Tensor& dinp, const Tensor& dout) {
  expect_same_numel("residual_backward", dinp, dout);
  launch_add(dinp.data, dinp.data, dout.data, dinp.numel(), stream_);
}

// ---- loss ---------------------------------------------------------------------------------
void CudaBackend::crossentropy_forward(Tensor& losses, const Tensor& logits,
                                       std::span<const int32_t> targets) {
  const auto [N, V] = loss_dims("crossentropy_forward", logits, targets);
  expect_numel("crossentropy_forward", "losses", losses, N);
  Tensor max = scratch(Shape{N}), sums = scratch(Shape{N, 2});
  launch_ce_row_max(max.data, logits.data, N, V, V, stream_);
  launch_ce_sums(sums.data, logits.data, max.data, device_ids(targets, 1), N, V, 0, V, stream_);
  launch_ce_losses(losses.data, max.data, sums.data, N, stream_);
}

void CudaBackend::crossentropy_softmax_backward(Tensor& dlogits, const Tensor& logits,
                                                std::span<const int32_t> targets, float scale) {
  const auto [N, V] = loss_dims("crossentropy_softmax_backward", logits, targets);
  expect_shape(dlogits, logits.shape, "crossentropy_softmax_backward", "dlogits");
  Tensor max = scratch(Shape{N}), sums = scratch(Shape{N, 2});
  const int32_t* t = device_ids(targets, 1);
  launch_ce_row_max(max.data, logits.data, N, V, V, stream_);
  launch_ce_sums(sums.data, logits.data, max.data, t, N, V, 0, V, stream_);
  launch_ce_backward(dlogits.data, logits.data, max.data, sums.data, t, N, V, 0, V, scale, stream_);
}

void CudaBackend::crossentropy_row_max(Tensor& max, const Tensor& logits, int64_t valid) {
  const auto [N, V] = check_crossentropy_row_max(max, logits, valid);
  launch_ce_row_max(max.data, logits.data, N, V, valid, stream_);
}

void CudaBackend::crossentropy_sums(Tensor& sums, const Tensor& logits, const Tensor& max,
                                    std::span<const int32_t> targets, int64_t vocab_begin,
                                    int64_t valid) {
  const auto [N, V] = check_crossentropy_sums(sums, logits, max, targets, valid);
  launch_ce_sums(sums.data, logits.data, max.data, device_ids(targets, 1), N, V, vocab_begin, valid,
                 stream_);
}

void CudaBackend::crossentropy_shard_backward(Tensor& dlogits, const Tensor& logits,
                                              const Tensor& max, const Tensor& sums,
                                              std::span<const int32_t> targets, int64_t vocab_begin,
                                              int64_t valid, float scale) {
  const auto [N, V] = check_crossentropy_shard_backward(dlogits, logits, max, sums, targets, valid);
  launch_ce_backward(dlogits.data, logits.data, max.data, sums.data, device_ids(targets, 1), N, V,
                     vocab_begin, valid, scale, stream_);
}

// ---- optimizer ----------------------------------------------------------------------------
double CudaBackend::sum_squares(const Tensor& t) {
  expect_fp32("sum_squares", t);
  const int nb = sum_squares_blocks(t.numel());
  // fp64 partials: (blocks) + the total, as doubles inside an fp32 tensor's bytes.
  if (partials_.numel() < 2 * (nb + 1)) partials_ = allocate(Shape{2 * (1024 + 1)});
  double* partials = reinterpret_cast<double*>(partials_.data);
  launch_sum_squares(partials, partials + nb, t.data, t.numel(), stream_);
  double total = 0;
  STRATAGEM_CUDA_CHECK(
      cudaMemcpyAsync(&total, partials + nb, sizeof total, cudaMemcpyDeviceToHost, stream_));
  STRATAGEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return total;
}

void CudaBackend::scale(Tensor& t, float factor) {
  expect_fp32("scale", t);
  launch_scale(t.data, t.numel(), factor, stream_);
}

void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                               const AdamWStep& s) {
  check_adamw(param, grad, m, v, s.step);
  const int64_t n = grad.numel();
  launch_adamw(param.data, grad.data, m.data, v.data, n,
               math::adamw_scalars(s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step), stream_);
}

}  // namespace stratagem::cuda
