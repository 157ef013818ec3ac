// Linear layers: Eigen GEMMs straight on the tensors' buffers (Maps, no copies). Eigen
// parallelizes each GEMM with OpenMP itself.
#include <algorithm>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {
constexpr int64_t kChannelChunk = 64;

}  // namespace

void CpuBackend::matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                const Tensor& bias) {
  progress();
  const auto [N, C, OC] = linear_dims("matmul_forward", inp, weight, out, "out");
  if (bias.defined()) expect_shape(bias, Shape{OC}, "matmul_forward", "bias");
  MatMap o(out.data, N, OC);          // (N,OC)
  ConstMatMap x(inp.data, N, C);      // (N,C)
  ConstMatMap w(weight.data, OC, C);  // (OC,C)
  o.noalias() = x * w.transpose();
  if (bias.defined()) {
    const float* b = bias.data;
#pragma omp parallel for schedule(static) if (N * OC >= kMinParallelWork)
    for (int64_t r = 0; r < N; ++r) {
      float* row = out.data + r * OC;
#pragma omp simd
      for (int64_t j = 0; j < OC; ++j) row[j] += b[j];
    }
  }
}

void CpuBackend::matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight) {
  progress();
  const auto [N, C, OC] = linear_dims("matmul_backward", inp, weight, dout, "dout");
  if (dweight.defined()) expect_shape(dweight, weight.shape, "matmul_backward", "dweight");
  if (dbias.defined()) expect_shape(dbias, Shape{OC}, "matmul_backward", "dbias");
  ConstMatMap g(dout.data, N, OC);    // (N,OC)
  ConstMatMap x(inp.data, N, C);      // (N,C)
  ConstMatMap w(weight.data, OC, C);  // (OC,C)
  if (dinp.defined()) {
    expect_shape(dinp, inp.shape, "matmul_backward", "dinp");
    MatMap dx(dinp.data, N, C);
    dx.noalias() = g * w;
  }
  if (dweight.defined()) {
    MatMap dw(dweight.data, OC, C);
    dw.noalias() += g.transpose() * x;
  }
  if (dbias.defined()) {
    float* db = dbias.data;
    const int64_t chunks = (OC + kChannelChunk - 1) / kChannelChunk;
#pragma omp parallel for schedule(static) if (N * OC >= kMinParallelWork)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t j0 = chunk * kChannelChunk, j1 = std::min(OC, j0 + kChannelChunk);
      float acc[kChannelChunk] = {};
      for (int64_t r = 0; r < N; ++r) {
        const float* row = dout.data + r * OC;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
      }
      for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
    }
  }
}

}  // namespace stratagem::cpu
