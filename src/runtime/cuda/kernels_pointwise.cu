// Elementwise kernels: fill, add, scale, casts, GELU, SwiGLU, AdamW, sum of squares.
#include "src/runtime/cuda/check.hpp"
#include "src/runtime/cuda/kernel_bodies.hpp"
#include "src/runtime/cuda/kernels.hpp"
#include "src/runtime/cuda/reduce.cuh"

namespace stratagem::cuda {
namespace {
constexpr int kThreads = 256;
int blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}
#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void fill_kernel(float* p, int64_t n, float v) {
  GRID_STRIDE(i, n) p[i] = v;
}
__global__ void add_kernel(float* o, const float* a, const float* b, int64_t n) {
  GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}
__global__ void add_bias_kernel(float* o, const float* b, int64_t rows, int64_t cols) {
  GRID_STRIDE(i, rows * cols) body::add_bias(i, o, b, cols);
}
__global__ void scale_kernel(float* p, int64_t n, float f) {
  GRID_STRIDE(i, n) p[i] *= f;
}
__global__ void to_bf16_kernel(uint16_t* o, const float* in, int64_t n) {
  GRID_STRIDE(i, n) o[i] = math::bf16_from_float(in[i]);
}
__global__ void gelu_forward_kernel(float* o, const float* x, int64_t n) {
  GRID_STRIDE(i, n) o[i] = math::gelu_forward(x[i]);
}
__global__ void gelu_backward_kernel(float* dx, const float* g, const float* x, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = math::gelu_backward(x[i], g[i]);
}
// inp (N,2F) = [gate | up], out (N,F).
__global__ void swiglu_forward_kernel(float* o, const float* inp, int64_t N, int64_t F) {
  GRID_STRIDE(i, N * F) body::swiglu_forward(i, o, inp, F);
}
__global__ void swiglu_backward_kernel(float* dinp, const float* g, const float* inp, int64_t N,
                                       int64_t F) {
  GRID_STRIDE(i, N * F) body::swiglu_backward(i, dinp, g, inp, F);
}
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             math::AdamWScalars k) {
  GRID_STRIDE(i, n) math::adamw_element(&p[i], g[i], &m[i], &v[i], k);
}
__global__ void sum_squares_kernel(double* partials, const float* p, int64_t n) {
  __shared__ double shared[32];
  double acc = 0;
  GRID_STRIDE(i, n) acc += static_cast<double>(p[i]) * p[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}
__global__ void sum_partials_kernel(double* total, const double* partials, int count) {
  __shared__ double shared[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *total = acc;
}
}  // namespace

void launch_fill(float* p, int64_t n, float value, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<blocks(n), kThreads, 0, s>>>(p, n, value);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_add(float* out, const float* a, const float* b, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<blocks(n), kThreads, 0, s>>>(out, a, b, n);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_add_bias(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  add_bias_kernel<<<blocks(rows * cols), kThreads, 0, s>>>(out, bias, rows, cols);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_scale(float* p, int64_t n, float factor, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<<<blocks(n), kThreads, 0, s>>>(p, n, factor);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_to_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks(n), kThreads, 0, s>>>(out, in, n);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  gelu_forward_kernel<<<blocks(n), kThreads, 0, s>>>(out, inp, n);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n,
                          cudaStream_t s) {
  if (n == 0) return;
  gelu_backward_kernel<<<blocks(n), kThreads, 0, s>>>(dinp, dout, inp, n);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_swiglu_forward(float* out, const float* inp, int64_t N, int64_t F, cudaStream_t s) {
  if (N * F == 0) return;
  swiglu_forward_kernel<<<blocks(N * F), kThreads, 0, s>>>(out, inp, N, F);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F,
                            cudaStream_t s) {
  if (N * F == 0) return;
  swiglu_backward_kernel<<<blocks(N * F), kThreads, 0, s>>>(dinp, dout, inp, N, F);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_adamw(float* p, const float* g, float* m, float* v, int64_t n,
                  const math::AdamWScalars& k, cudaStream_t s) {
  if (n == 0) return;
  adamw_kernel<<<blocks(n), kThreads, 0, s>>>(p, g, m, v, n, k);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
int sum_squares_blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}
void launch_sum_squares(double* partials, double* total, const float* p, int64_t n,
                        cudaStream_t s) {
  const int nb = sum_squares_blocks(n);
  sum_squares_kernel<<<nb, kThreads, 0, s>>>(partials, p, n);
  STRATAGEM_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, 1024, 0, s>>>(total, partials, nb);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}

}  // namespace stratagem::cuda
