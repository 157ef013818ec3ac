// Softmax cross-entropy over the vocabulary, one row per token.
#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {

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
  expect_numel("crossentropy_forward", "losses", losses, N);
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
    for (int64_t j = 0; j < V; ++j) drow[j] = math::prob_from_lse(row[j], lse) * scale;
    drow[targets[r]] -= scale;
  }
}

void CpuBackend::crossentropy_row_max(Tensor& max, const Tensor& logits, int64_t valid) {
  const auto [N, V] = check_crossentropy_row_max(max, logits, valid);
#pragma omp parallel for schedule(static) if (N * V >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* row = logits.data + r * V;  // (Vl)
    float mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
    max.data[r] = mx;
  }
}

void CpuBackend::crossentropy_sums(Tensor& sums, const Tensor& logits, const Tensor& max,
                                   std::span<const int32_t> targets, int64_t vocab_begin,
                                   int64_t valid) {
  const auto [N, V] = check_crossentropy_sums(sums, logits, max, targets, valid);
#pragma omp parallel for schedule(static) if (N * V >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* row = logits.data + r * V;  // (Vl)
    const float mx = max.data[r];
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; ++j) sum += fast_exp(row[j] - mx);
    const int64_t t = int64_t(targets[r]) - vocab_begin;
    sums.data[2 * r] = sum;
    sums.data[2 * r + 1] = t >= 0 && t < valid ? row[t] : 0.0f;
  }
}

void CpuBackend::crossentropy_shard_backward(Tensor& dlogits, const Tensor& logits,
                                             const Tensor& max, const Tensor& sums,
                                             std::span<const int32_t> targets, int64_t vocab_begin,
                                             int64_t valid, float scale) {
  const auto [N, V] = check_crossentropy_shard_backward(dlogits, logits, max, sums, targets, valid);
#pragma omp parallel for schedule(static) if (N * V >= kMinParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const float* row = logits.data + r * V;  // (Vl)
    float* drow = dlogits.data + r * V;      // (Vl), may be the same memory as row
    const float lse = max.data[r] + std::log(sums.data[2 * r]);
#pragma omp simd
    for (int64_t j = 0; j < valid; ++j) drow[j] = math::prob_from_lse(row[j], lse) * scale;
    for (int64_t j = valid; j < V; ++j) drow[j] = 0.0f;
    const int64_t t = int64_t(targets[r]) - vocab_begin;
    if (t >= 0 && t < valid) drow[t] -= scale;
  }
}

}  // namespace stratagem::cpu
