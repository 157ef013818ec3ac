// Host memory, copies and the simple reductions of the CPU backend.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem {

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<cpu::CpuBackend>();
}

namespace cpu {
namespace {
// 64-byte alignment: one cache line and one AVX-512 vector, what Eigen's kernels like best.
constexpr size_t kAlign = 64;

}  // namespace

Tensor CpuBackend::allocate(Shape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * sizeof(float);
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (!p) throw std::bad_alloc();
  std::shared_ptr<void> storage(p, [](void* q) { std::free(q); });
  return Tensor{static_cast<float*>(p), shape, std::move(storage)};
}

void CpuBackend::fill(Tensor& t, float value) {
  float* p = t.data;
  const int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  expect_same_numel("copy", dst, src);
  if (dst.data != src.data) std::memcpy(dst.data, src.data, src.bytes());
}

void CpuBackend::copy_block(Tensor& dst, int64_t dst_row0, int64_t dst_col0, const Tensor& src,
                            int64_t src_row0, int64_t src_col0, int64_t rows, int64_t cols) {
  const auto fits = [](const Tensor& t, int64_t row0, int64_t col0, int64_t rows, int64_t cols) {
    if (!t.defined() || t.ndim() < 1) return false;
    const int64_t width = t.dim(-1), height = t.numel() / std::max<int64_t>(width, 1);
    return row0 >= 0 && col0 >= 0 && rows >= 0 && cols >= 0 && row0 + rows <= height &&
           col0 + cols <= width;
  };
  if (!fits(dst, dst_row0, dst_col0, rows, cols) || !fits(src, src_row0, src_col0, rows, cols))
    throw std::invalid_argument("copy_block: a " + std::to_string(rows) + "x" +
                                std::to_string(cols) + " block does not fit " + src.shape.str() +
                                " -> " + dst.shape.str());
  const int64_t dw = dst.dim(-1), sw = src.dim(-1);
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(dst.data + (dst_row0 + i) * dw + dst_col0,
                src.data + (src_row0 + i) * sw + src_col0,
                static_cast<size_t>(cols) * sizeof(float));
}

void CpuBackend::upload(Tensor& dst, const float* host) {
  if (dst.numel() > 0 && dst.data != host) std::memcpy(dst.data, host, dst.bytes());
}

void CpuBackend::download(float* host, const Tensor& src) {
  if (src.numel() > 0 && src.data != host) std::memcpy(host, src.data, src.bytes());
}

void CpuBackend::residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  expect_same_numel("residual_forward", out, a);
  expect_same_numel("residual_forward", out, b);
  float* o = out.data;
  const float* x = a.data;
  const float* y = b.data;
  const int64_t n = out.numel();
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void CpuBackend::residual_backward(Tensor& dinp, const Tensor& dout) {
  expect_same_numel("residual_backward", dinp, dout);
  residual_forward(dinp, dinp, dout);
}

double CpuBackend::sum_squares(const Tensor& t) {
  const float* p = t.data;
  const int64_t n = t.numel();
  double total = 0;
  // fp64 partial sums: the grad norm of 100M+ parameters must not lose small tensors.
#pragma omp parallel for reduction(+ : total) schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(p[i]) * p[i];
  return total;
}

void CpuBackend::scale(Tensor& t, float factor) {
  float* p = t.data;
  const int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) p[i] *= factor;
}

void CpuBackend::reserve_scratch(size_t floats_per_thread) {
  const size_t threads = static_cast<size_t>(omp_get_max_threads());
  // Round to whole cache lines so threads never share one.
  floats_per_thread = (floats_per_thread + 15) / 16 * 16;
  if (floats_per_thread > scratch_per_thread_ || scratch_.size() < threads * scratch_per_thread_) {
    scratch_per_thread_ = std::max(floats_per_thread, scratch_per_thread_);
    scratch_.assign(threads * scratch_per_thread_, 0.0f);
  }
}

float* CpuBackend::thread_scratch(int thread, size_t /*floats_per_thread*/) {
  return scratch_.data() + static_cast<size_t>(thread) * scratch_per_thread_;
}

}  // namespace cpu
}  // namespace stratagem
