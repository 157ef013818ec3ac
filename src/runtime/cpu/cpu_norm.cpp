// LayerNorm (weight + optional bias) and RMSNorm (weight only) over the last dimension.
#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {
// Weight/bias gradients reduce over rows. Each thread owns a chunk of channels and walks all
// rows: race-free, and the summation order does not depend on the thread count.
constexpr int64_t kChannelChunk = 32;

}  // namespace

void CpuBackend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                   const Tensor& weight, const Tensor& bias, float eps) {
  const auto [N, C] = check_layernorm_forward(out, mean, rstd, inp, weight, bias);
  const float* w = weight.data;
  const float* b = bias.data;
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp.data + r * C;  // (C)
    float* o = out.data + r * C;        // (C)
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const float m = sum / C;
    float var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    const float s = math::rstd_of(var / C, eps);
    if (b) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = math::norm_apply(x[c], m, s, w[c], b[c]);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = math::norm_apply(x[c], m, s, w[c]);
    }
    mean.data[r] = m;
    rstd.data[r] = s;
  }
}

void CpuBackend::layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd) {
  const auto [N, C] = check_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  const float* w = weight.data;

#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp.data + r * C;   // (C)
    const float* g = dout.data + r * C;  // (C)
    float* dx = dinp.data + r * C;       // (C)
    const float m = mean.data[r], s = rstd.data[r];
    // dx = s * (dn - mean(dn) - n * mean(dn * n)), with n the normalized input, dn = g * w.
    float sum_dn = 0, sum_dn_n = 0;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
    for (int64_t c = 0; c < C; ++c) {
      const float dn = g[c] * w[c];
      sum_dn += dn;
      sum_dn_n += dn * (x[c] - m) * s;
    }
    const float a = sum_dn / C, bb = sum_dn_n / C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dx[c] += math::norm_dinp(g[c], w[c], x[c], m, s, a, bb);
  }

  const int64_t chunks = (C + kChannelChunk - 1) / kChannelChunk;
  float* dw = dweight.data;
  float* db = dbias.data;
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t c0 = chunk * kChannelChunk, c1 = std::min(C, c0 + kChannelChunk);
    float acc_w[kChannelChunk] = {}, acc_b[kChannelChunk] = {};
    for (int64_t r = 0; r < N; ++r) {
      const float* x = inp.data + r * C;
      const float* g = dout.data + r * C;
      const float m = mean.data[r], s = rstd.data[r];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        acc_w[c - c0] += g[c] * (x[c] - m) * s;
        acc_b[c - c0] += g[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dw[c] += acc_w[c - c0];
      if (db) db[c] += acc_b[c - c0];
    }
  }
}

void CpuBackend::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                 float eps) {
  const auto [N, C] = check_rmsnorm_forward(out, rstd, inp, weight);
  const float* w = weight.data;
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp.data + r * C;
    float* o = out.data + r * C;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
    const float s = math::rstd_of(ss / C, eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = math::norm_apply(x[c], 0.0f, s, w[c]);
    rstd.data[r] = s;
  }
}

void CpuBackend::rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const auto [N, C] = check_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  const float* w = weight.data;
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp.data + r * C;
    const float* g = dout.data + r * C;
    float* dx = dinp.data + r * C;
    const float s = rstd.data[r];
    // dx = s * (dn - n * mean(dn * n)), n = x * s, dn = g * w.
    float sum_dn_n = 0;
#pragma omp simd reduction(+ : sum_dn_n)
    for (int64_t c = 0; c < C; ++c) sum_dn_n += g[c] * w[c] * x[c] * s;
    const float bb = sum_dn_n / C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dx[c] += math::norm_dinp(g[c], w[c], x[c], 0.0f, s, 0.0f, bb);
  }

  const int64_t chunks = (C + kChannelChunk - 1) / kChannelChunk;
  float* dw = dweight.data;
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t c0 = chunk * kChannelChunk, c1 = std::min(C, c0 + kChannelChunk);
    float acc[kChannelChunk] = {};
    for (int64_t r = 0; r < N; ++r) {
      const float* x = inp.data + r * C;
      const float* g = dout.data + r * C;
      const float s = rstd.data[r];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += g[c] * x[c] * s;
    }
    for (int64_t c = c0; c < c1; ++c) dw[c] += acc[c - c0];
  }
}

}  // namespace stratagem::cpu
