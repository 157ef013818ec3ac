// Softmax cross-entropy over the vocabulary, one row per token.
#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {
struct LossDims {
  int64_t n, v;
};

LossDims loss_dims(const char* kernel, const Tensor& logits, std::span<const int32_t> targets) {
  if (!logits.defined() || logits.ndim() < 2)
    throw std::invalid_argument(
        kernel_error(kernel, "logits must be (N,V), got " + logits.shape.str()));
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  if (static_cast<int64_t>(targets.size()) != N)
    throw std::invalid_argument(kernel_error(kernel, "got " + std::to_string(targets.size()) +
                                                         " targets for " + std::to_string(N) +
                                                         " logit rows"));
  for (int32_t t : targets)
    if (t < 0 || t >= V)
      throw std::invalid_argument(kernel_error(
          kernel, "target " + std::to_string(t) + " outside [0," + std::to_string(V) + ")"));
  return {N, V};
}

// log(sum(exp(row))) computed stably around the row maximum.
float logsumexp(const float* row, int64_t V) {
  float mx = row[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < V; ++j) sum += fast_exp(row[j] - mx);
  return mx + std::log(sum);
}
}  // namespace

void CpuBackend::crossentropy_forward(Tensor& losses, const Tensor& logits,
                                      std::span<const int32_t> targets) {
  const auto [N, V] = loss_dims("crossentropy_forward", logits, targets);
  if (!losses.defined() || losses.numel() != N)
    throw std::invalid_argument(kernel_error(
        "crossentropy_forward",
        "losses must hold " + std::to_string(N) + " floats, got " + losses.shape.str()));
#pragma omp parallel for schedule(static) if (N * V >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* row = logits.data + r * V;  // (V)
    losses.data[r] = logsumexp(row, V) - row[targets[r]];
  }
}

void CpuBackend::crossentropy_softmax_backward(Tensor& dlogits, const Tensor& logits,
                                               std::span<const int32_t> targets, float scale) {
  const auto [N, V] = loss_dims("crossentropy_softmax_backward", logits, targets);
  expect_shape(dlogits, logits.shape, "crossentropy_softmax_backward", "dlogits");
#pragma omp parallel for schedule(static) if (N * V >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* row = logits.data + r * V;  // (V)
    float* drow = dlogits.data + r * V;      // (V), may be the same memory as row
    const float lse = logsumexp(row, V);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) drow[j] = fast_exp(row[j] - lse) * scale;
    drow[targets[r]] -= scale;
  }
}

}  // namespace stratagem::cpu
