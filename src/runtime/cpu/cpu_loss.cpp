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
    for (int64_t j = 0; j < V; ++j) drow[j] = math::prob_from_lse(row[j], lse) * scale;
    drow[targets[r]] -= scale;
  }
}

namespace {
// Shapes of the vocabulary-parallel kernels: logits (N,Vl) with `valid` real columns.
LossDims shard_dims(const char* kernel, const Tensor& logits, std::span<const int32_t> targets,
                    int64_t valid) {
  if (!logits.defined() || logits.ndim() != 2)
    throw std::invalid_argument(
        kernel_error(kernel, "logits must be (N,Vl), got " + logits.shape.str()));
  const int64_t N = logits.dim(0), V = logits.dim(1);
  if (valid < 1 || valid > V)
    throw std::invalid_argument(kernel_error(kernel, "valid columns " + std::to_string(valid) +
                                                         " outside [1," + std::to_string(V) + "]"));
  if (targets.data() && static_cast<int64_t>(targets.size()) != N)
    throw std::invalid_argument(kernel_error(kernel, "got " + std::to_string(targets.size()) +
                                                         " targets for " + std::to_string(N) +
                                                         " logit rows"));
  return {N, V};
}
void expect_numel(const char* kernel, const char* what, const Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() != n)
    throw std::invalid_argument(kernel_error(
        kernel,
        std::string(what) + " must hold " + std::to_string(n) + " floats, got " + t.shape.str()));
}
}  // namespace

void CpuBackend::crossentropy_row_max(Tensor& max, const Tensor& logits, int64_t valid) {
  const auto [N, V] = shard_dims("crossentropy_row_max", logits, {}, valid);
  expect_numel("crossentropy_row_max", "max", max, N);
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
  const auto [N, V] = shard_dims("crossentropy_sums", logits, targets, valid);
  expect_numel("crossentropy_sums", "max", max, N);
  expect_numel("crossentropy_sums", "sums", sums, 2 * N);
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
  const auto [N, V] = shard_dims("crossentropy_shard_backward", logits, targets, valid);
  expect_shape(dlogits, logits.shape, "crossentropy_shard_backward", "dlogits");
  expect_numel("crossentropy_shard_backward", "max", max, N);
  expect_numel("crossentropy_shard_backward", "sums", sums, 2 * N);
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
