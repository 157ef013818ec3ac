// Causal multi-head attention with grouped key/value heads (GQA), parallel over (B, heads).
// Scores are computed in blocks of query rows so that only the causal (lower) part of
// Q K^T is ever multiplied: block [r0,r1) needs keys [0,r1) only, about half the work of a
// full T x T product.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {
constexpr int64_t kRowBlock = 64;  // query rows per score block

using Eigen::OuterStride;
}  // namespace

void CpuBackend::attention_forward(Tensor& out, Tensor& att, Tensor& lse, const Tensor& qkv,
                                   int heads, int kv_heads) {
  progress();
  const QkvDims d = qkv_dims("attention_forward", qkv, heads, kv_heads);
  const int64_t B = d.B, T = d.T, W = d.W, hd = d.hd, NH = d.NH, KV = d.KV;
  expect_shape(out, Shape{B, T, NH * hd}, "attention_forward", "out");
  expect_shape(lse, Shape{B, NH, T}, "attention_forward", "lse");
  const bool keep = att.defined();
  if (keep) expect_shape(att, Shape{B, NH, T, T}, "attention_forward", "att");
  const int64_t R = std::min(kRowBlock, std::max<int64_t>(T, 1));
  reserve_scratch(static_cast<size_t>(R * T));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

#pragma omp parallel for collapse(2) schedule(dynamic) if (B * T * T * W >= kMinParallelWork)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t kvh = h / d.group;
      const float* base = qkv.data + b * T * W;                                     // (T,W)
      ConstStridedMap k_all(base + (NH + kvh) * hd, T, hd, OuterStride<>(W));       // (T,hd)
      ConstStridedMap v_all(base + (NH + KV + kvh) * hd, T, hd, OuterStride<>(W));  // (T,hd)
      float* lse_bh = lse.data + (b * NH + h) * T;                                  // (T)
      float* scratch = thread_scratch(omp_get_thread_num(), 0);
      for (int64_t r0 = 0; r0 < T; r0 += R) {
        const int64_t r1 = std::min(T, r0 + R), rows = r1 - r0, keys = r1;
        float* s_ptr = keep ? att.data + ((b * NH + h) * T + r0) * T : scratch;
        const int64_t ld = keep ? T : keys;
        StridedMap s(s_ptr, rows, keys, OuterStride<>(ld));                     // (rows,keys)
        ConstStridedMap q(base + r0 * W + h * hd, rows, hd, OuterStride<>(W));  // (rows,hd)
        s.noalias() = scale * (q * k_all.topRows(keys).transpose());
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t t = r0 + i;
          float* row = s_ptr + i * ld;
          float mx = row[0];
          for (int64_t j = 1; j <= t; ++j) mx = std::max(mx, row[j]);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j <= t; ++j) {
            row[j] = fast_exp(row[j] - mx);
            sum += row[j];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
          std::fill(row + t + 1, row + keys, 0.0f);
          lse_bh[t] = mx + std::log(sum);
        }
        StridedMap y(out.data + (b * T + r0) * NH * hd + h * hd, rows, hd,
                     OuterStride<>(NH * hd));  // (rows,hd)
        y.noalias() = s * v_all.topRows(keys);
      }
    }
  }
}

void CpuBackend::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out,
                                    const Tensor& qkv, const Tensor& att, const Tensor& lse,
                                    int heads, int kv_heads) {
  progress();
  const QkvDims d = qkv_dims("attention_backward", qkv, heads, kv_heads);
  const int64_t B = d.B, T = d.T, W = d.W, hd = d.hd, NH = d.NH, KV = d.KV;
  const int64_t C = NH * hd;
  expect_shape(dqkv, qkv.shape, "attention_backward", "dqkv");
  expect_shape(dout, Shape{B, T, C}, "attention_backward", "dout");
  expect_shape(out, Shape{B, T, C}, "attention_backward", "out");
  expect_shape(lse, Shape{B, NH, T}, "attention_backward", "lse");
  const bool keep = att.defined();
  if (keep) expect_shape(att, Shape{B, NH, T, T}, "attention_backward", "att");
  const int64_t R = std::min(kRowBlock, std::max<int64_t>(T, 1));
  // Per thread: probabilities when they are rebuilt, dP, and the per-row D = dY . Y.
  reserve_scratch(static_cast<size_t>(2 * R * T + R));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Parallel over kv heads, not query heads: the query heads of one group all add into the
  // same dK and dV, and keeping them in one task avoids both races and atomics.
#pragma omp parallel for collapse(2) schedule(dynamic) if (B * T * T * W >= kMinParallelWork)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kvh = 0; kvh < KV; ++kvh) {
      const float* base = qkv.data + b * T * W;
      float* dbase = dqkv.data + b * T * W;
      ConstStridedMap k_all(base + (NH + kvh) * hd, T, hd, OuterStride<>(W));       // (T,hd)
      ConstStridedMap v_all(base + (NH + KV + kvh) * hd, T, hd, OuterStride<>(W));  // (T,hd)
      StridedMap dk_all(dbase + (NH + kvh) * hd, T, hd, OuterStride<>(W));
      StridedMap dv_all(dbase + (NH + KV + kvh) * hd, T, hd, OuterStride<>(W));
      dk_all.setZero();
      dv_all.setZero();
      float* scratch = thread_scratch(omp_get_thread_num(), 0);
      float* p_scratch = scratch;
      float* dp_scratch = scratch + R * T;
      float* dsum = scratch + 2 * R * T;
      for (int64_t h = kvh * d.group; h < (kvh + 1) * d.group; ++h) {
        const float* lse_bh = lse.data + (b * NH + h) * T;
        for (int64_t r0 = 0; r0 < T; r0 += R) {
          const int64_t r1 = std::min(T, r0 + R), rows = r1 - r0, keys = r1;
          ConstStridedMap q(base + r0 * W + h * hd, rows, hd, OuterStride<>(W));  // (rows,hd)
          const float* p_ptr;
          int64_t ld;
          if (keep) {
            p_ptr = att.data + ((b * NH + h) * T + r0) * T;
            ld = T;
          } else {
            // Selective recompute: rebuild P = exp(scale * q k^T - lse) from saved q, k.
            ld = keys;
            StridedMap s(p_scratch, rows, keys, OuterStride<>(ld));
            s.noalias() = scale * (q * k_all.topRows(keys).transpose());
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t t = r0 + i;
              float* row = p_scratch + i * ld;
              const float l = lse_bh[t];
#pragma omp simd
              for (int64_t j = 0; j <= t; ++j) row[j] = math::prob_from_lse(row[j], l);
              std::fill(row + t + 1, row + keys, 0.0f);
            }
            p_ptr = p_scratch;
          }
          ConstStridedMap p(p_ptr, rows, keys, OuterStride<>(ld));  // (rows,keys)
          const float* dy_ptr = dout.data + (b * T + r0) * C + h * hd;
          const float* y_ptr = out.data + (b * T + r0) * C + h * hd;
          ConstStridedMap dy(dy_ptr, rows, hd, OuterStride<>(C));  // (rows,hd)
          for (int64_t i = 0; i < rows; ++i) {
            float acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t e = 0; e < hd; ++e) acc += dy_ptr[i * C + e] * y_ptr[i * C + e];
            dsum[i] = acc;
          }
          // dP = dY V^T, then dS = P * (dP - D) with D_i = dY_i . Y_i = sum_j P_ij dP_ij.
          StridedMap ds(dp_scratch, rows, keys, OuterStride<>(keys));
          ds.noalias() = dy * v_all.topRows(keys).transpose();
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t t = r0 + i;
            float* row = dp_scratch + i * keys;
            const float* prow = p_ptr + i * ld;
            const float di = dsum[i];
#pragma omp simd
            for (int64_t j = 0; j <= t; ++j) row[j] = math::softmax_dscore(prow[j], row[j], di);
            std::fill(row + t + 1, row + keys, 0.0f);
          }
          StridedMap dq(dbase + r0 * W + h * hd, rows, hd, OuterStride<>(W));
          dq.noalias() = scale * (ds * k_all.topRows(keys));
          dk_all.topRows(keys).noalias() += scale * (ds.transpose() * q);
          dv_all.topRows(keys).noalias() += p.transpose() * dy;
        }
      }
    }
  }
}

}  // namespace stratagem::cpu
