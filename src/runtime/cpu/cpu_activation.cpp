// GELU (tanh approximation, as GPT-2 and llm.c) and SwiGLU.
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
void CpuBackend::gelu_forward(Tensor& out, const Tensor& inp) {
  expect_shape(out, inp.shape, "gelu_forward", "out");
  const float* x = inp.data;
  float* o = out.data;
  const int64_t n = inp.numel();
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) o[i] = math::gelu_forward(x[i]);
}

void CpuBackend::gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  expect_shape(dout, inp.shape, "gelu_backward", "dout");
  expect_shape(dinp, inp.shape, "gelu_backward", "dinp");
  const float* x = inp.data;
  const float* g = dout.data;
  float* dx = dinp.data;
  const int64_t n = inp.numel();
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) dx[i] = math::gelu_backward(x[i], g[i]);
}

void CpuBackend::swiglu_forward(Tensor& out, const Tensor& inp) {
  const auto [N, F] = swiglu_dims("swiglu_forward", inp, out);
#pragma omp parallel for schedule(static) if (N * F >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = inp.data + r * 2 * F;  // (F)
    const float* up = gate + F;                // (F)
    float* o = out.data + r * F;               // (F)
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) o[j] = math::swiglu_forward(gate[j], up[j]);
  }
}

void CpuBackend::swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const auto [N, F] = swiglu_dims("swiglu_backward", inp, dout);
  expect_shape(dinp, inp.shape, "swiglu_backward", "dinp");
#pragma omp parallel for schedule(static) if (N * F >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = inp.data + r * 2 * F;
    const float* up = gate + F;
    const float* g = dout.data + r * F;
    float* dgate = dinp.data + r * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) math::swiglu_backward(gate[j], up[j], g[j], &dgate[j], &dup[j]);
  }
}

}  // namespace stratagem::cpu
