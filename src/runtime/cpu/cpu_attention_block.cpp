// Causal attention of one block of queries against one block of keys/values, the online-softmax
// merge of two partial results, and the block pair's backward: the pieces context parallelism
// (src/runtime/context_parallel.cpp) assembles ring, all-gather and all-to-all attention from.
// The mask compares sequence positions, not rows, because a rank's rows hold two chunks of
// the sequence that are far apart (the load-balanced order).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {
constexpr int64_t kRowBlock = 64;  // query rows per score block
constexpr float kNoKey = -std::numeric_limits<float>::infinity();

using Eigen::OuterStride;

// The operands of a block pair, checked once.
struct BlockDims {
  QkvDims q;
  int64_t Tk = 0, X = 0, kv_col = 0;  // kv rows, kv row width, first k column in kv
};

void check_span(const char* kernel, const char* what, TokenSpan s, int64_t T) {
  if (s.row0 < 0 || s.rows < 0 || s.row0 + s.rows > T || s.pos0 < 0)
    throw std::invalid_argument(
        kernel_error(kernel, std::string(what) + " span rows [" + std::to_string(s.row0) + "," +
                                 std::to_string(s.row0 + s.rows) + ") at position " +
                                 std::to_string(s.pos0) + " do not fit T=" + std::to_string(T)));
}

BlockDims block_dims(const char* kernel, const Tensor& q, TokenSpan qs, const Tensor& kv,
                     TokenSpan ks, int heads, int kv_heads) {
  BlockDims d{qkv_dims(kernel, q, heads, kv_heads)};
  const int64_t kv_width = 2 * d.q.KV * d.q.hd;
  if (!kv.defined() || kv.ndim() != 3 || kv.dim(0) != d.q.B || kv.dim(2) < kv_width)
    throw std::invalid_argument(kernel_error(kernel, "kv must be (" + std::to_string(d.q.B) +
                                                         ",Tk,>=" + std::to_string(kv_width) +
                                                         "), got " + kv.shape.str()));
  d.Tk = kv.dim(1), d.X = kv.dim(2), d.kv_col = d.X - kv_width;
  check_span(kernel, "q", qs, d.q.T);
  check_span(kernel, "kv", ks, d.Tk);
  return d;
}

// Keys of the kv span that a query at position p sees (a prefix of the span).
int64_t visible_keys(int64_t p, TokenSpan ks) {
  return std::clamp<int64_t>(p - ks.pos0 + 1, 0, ks.rows);
}
}  // namespace

void CpuBackend::attention_block_forward(Tensor& out, Tensor& lse, const Tensor& q, TokenSpan qs,
                                         const Tensor& kv, TokenSpan ks, int heads, int kv_heads) {
  progress();
  const char* kernel = "attention_block_forward";
  const BlockDims d = block_dims(kernel, q, qs, kv, ks, heads, kv_heads);
  const int64_t B = d.q.B, T = d.q.T, W = d.q.W, hd = d.q.hd, NH = d.q.NH, KV = d.q.KV;
  expect_shape(out, Shape{B, T, NH * hd}, kernel, "out");
  expect_shape(lse, Shape{B, NH, T}, kernel, "lse");
  const int64_t R = std::min(kRowBlock, std::max<int64_t>(qs.rows, 1));
  reserve_scratch(static_cast<size_t>(R * std::max<int64_t>(ks.rows, 1)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

#pragma omp parallel for collapse(2) \
    schedule(dynamic) if (B * qs.rows * ks.rows * W >= kMinParallelWork)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t kvh = h / d.q.group;
      const float* kv_base = kv.data + (b * d.Tk + ks.row0) * d.X + d.kv_col;
      ConstStridedMap k_all(kv_base + kvh * hd, ks.rows, hd, OuterStride<>(d.X));
      ConstStridedMap v_all(kv_base + (KV + kvh) * hd, ks.rows, hd, OuterStride<>(d.X));
      float* lse_bh = lse.data + (b * NH + h) * T;
      float* s_ptr = thread_scratch(omp_get_thread_num(), 0);
      for (int64_t r0 = qs.row0; r0 < qs.row0 + qs.rows; r0 += R) {
        const int64_t rows = std::min(qs.row0 + qs.rows, r0 + R) - r0;
        const int64_t p0 = qs.pos0 + (r0 - qs.row0);
        const int64_t keys = visible_keys(p0 + rows - 1, ks);
        StridedMap y(out.data + (b * T + r0) * NH * hd + h * hd, rows, hd, OuterStride<>(NH * hd));
        if (keys == 0) {  // the whole block lies before the keys: nothing visible
          y.setZero();
          std::fill(lse_bh + r0, lse_bh + r0 + rows, kNoKey);
          continue;
        }
        StridedMap s(s_ptr, rows, keys, OuterStride<>(keys));
        ConstStridedMap qm(q.data + (b * T + r0) * W + h * hd, rows, hd, OuterStride<>(W));
        s.noalias() = scale * (qm * k_all.topRows(keys).transpose());
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t n = visible_keys(p0 + i, ks);
          float* row = s_ptr + i * keys;
          if (n == 0) {
            std::fill(row, row + keys, 0.0f);
            lse_bh[r0 + i] = kNoKey;
            continue;
          }
          float mx = row[0];
          for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < n; ++j) {
            row[j] = fast_exp(row[j] - mx);
            sum += row[j];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) row[j] *= inv;
          std::fill(row + n, row + keys, 0.0f);
          lse_bh[r0 + i] = mx + std::log(sum);
        }
        y.noalias() = s * v_all.topRows(keys);
      }
    }
  }
}

void CpuBackend::attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out,
                                 const Tensor& part_lse, TokenSpan span) {
  const char* kernel = "attention_merge";
  if (!out.defined() || out.ndim() != 3 || !lse.defined() || lse.ndim() != 3 ||
      lse.dim(0) != out.dim(0) || lse.dim(2) != out.dim(1) || out.dim(2) % lse.dim(1) != 0)
    throw std::invalid_argument(
        kernel_error(kernel, "out must be (B,T,NH*hd) and lse (B,NH,T), got " + out.shape.str() +
                                 " and " + lse.shape.str()));
  expect_shape(part_out, out.shape, kernel, "part_out");
  expect_shape(part_lse, lse.shape, kernel, "part_lse");
  const int64_t B = out.dim(0), T = out.dim(1), NH = lse.dim(1), hd = out.dim(2) / NH;
  check_span(kernel, "the", span, T);
#pragma omp parallel for collapse(2) \
    schedule(static) if (B * span.rows * NH * hd >= kMinParallelWork)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = span.row0; t < span.row0 + span.rows; ++t) {
        float& l1 = lse.data[(b * NH + h) * T + t];
        const float l2 = part_lse.data[(b * NH + h) * T + t];
        if (l2 == kNoKey) continue;  // the part saw no key: nothing to add
        float* y = out.data + (b * T + t) * NH * hd + h * hd;
        const float* py = part_out.data + (b * T + t) * NH * hd + h * hd;
        if (l1 == kNoKey) {
          std::copy(py, py + hd, y);
          l1 = l2;
          continue;
        }
        // Each part is normalized by its own sum: rescale both to the union's sum.
        const float mx = std::max(l1, l2);
        const float l = mx + std::log(std::exp(l1 - mx) + std::exp(l2 - mx));
        const float a = std::exp(l1 - l), c = std::exp(l2 - l);
#pragma omp simd
        for (int64_t e = 0; e < hd; ++e) y[e] = a * y[e] + c * py[e];
        l1 = l;
      }
    }
  }
}

void CpuBackend::attention_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout,
                                          const Tensor& out, const Tensor& lse, const Tensor& q,
                                          TokenSpan qs, const Tensor& kv, TokenSpan ks, int heads,
                                          int kv_heads) {
  progress();
  const char* kernel = "attention_block_backward";
  const BlockDims d = block_dims(kernel, q, qs, kv, ks, heads, kv_heads);
  const int64_t B = d.q.B, T = d.q.T, W = d.q.W, hd = d.q.hd, NH = d.q.NH, KV = d.q.KV;
  const int64_t C = NH * hd;
  expect_shape(dq, q.shape, kernel, "dq");
  expect_shape(dkv, kv.shape, kernel, "dkv");
  expect_shape(dout, Shape{B, T, C}, kernel, "dout");
  expect_shape(out, Shape{B, T, C}, kernel, "out");
  expect_shape(lse, Shape{B, NH, T}, kernel, "lse");
  const int64_t R = std::min(kRowBlock, std::max<int64_t>(qs.rows, 1));
  const int64_t K = std::max<int64_t>(ks.rows, 1);
  // Per thread: the rebuilt probabilities, dP, and D = dY . Y per row.
  reserve_scratch(static_cast<size_t>(2 * R * K + R));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Parallel over kv heads: the query heads of one group all add into the same dK and dV.
#pragma omp parallel for collapse(2) \
    schedule(dynamic) if (B * qs.rows * ks.rows * W >= kMinParallelWork)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kvh = 0; kvh < KV; ++kvh) {
      const float* kv_base = kv.data + (b * d.Tk + ks.row0) * d.X + d.kv_col;
      float* dkv_base = dkv.data + (b * d.Tk + ks.row0) * d.X + d.kv_col;
      ConstStridedMap k_all(kv_base + kvh * hd, ks.rows, hd, OuterStride<>(d.X));
      ConstStridedMap v_all(kv_base + (KV + kvh) * hd, ks.rows, hd, OuterStride<>(d.X));
      StridedMap dk_all(dkv_base + kvh * hd, ks.rows, hd, OuterStride<>(d.X));
      StridedMap dv_all(dkv_base + (KV + kvh) * hd, ks.rows, hd, OuterStride<>(d.X));
      float* scratch = thread_scratch(omp_get_thread_num(), 0);
      float* p_ptr = scratch;
      float* dp_ptr = scratch + R * K;
      float* dsum = scratch + 2 * R * K;
      for (int64_t h = kvh * d.q.group; h < (kvh + 1) * d.q.group; ++h) {
        const float* lse_bh = lse.data + (b * NH + h) * T;
        for (int64_t r0 = qs.row0; r0 < qs.row0 + qs.rows; r0 += R) {
          const int64_t rows = std::min(qs.row0 + qs.rows, r0 + R) - r0;
          const int64_t p0 = qs.pos0 + (r0 - qs.row0);
          const int64_t keys = visible_keys(p0 + rows - 1, ks);
          if (keys == 0) continue;
          ConstStridedMap qm(q.data + (b * T + r0) * W + h * hd, rows, hd, OuterStride<>(W));
          // P = exp(scale q k^T - lse) with the final lse: this block's share of the softmax.
          StridedMap p(p_ptr, rows, keys, OuterStride<>(keys));
          p.noalias() = scale * (qm * k_all.topRows(keys).transpose());
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t n = visible_keys(p0 + i, ks);
            float* row = p_ptr + i * keys;
            const float l = lse_bh[r0 + i];
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) row[j] = math::prob_from_lse(row[j], l);
            std::fill(row + n, row + keys, 0.0f);
          }
          const float* dy_ptr = dout.data + (b * T + r0) * C + h * hd;
          const float* y_ptr = out.data + (b * T + r0) * C + h * hd;
          ConstStridedMap dy(dy_ptr, rows, hd, OuterStride<>(C));
          for (int64_t i = 0; i < rows; ++i) {
            float acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t e = 0; e < hd; ++e) acc += dy_ptr[i * C + e] * y_ptr[i * C + e];
            dsum[i] = acc;
          }
          // dP = dY V^T, then dS = P * (dP - D): D is over the whole row, so the final output.
          StridedMap ds(dp_ptr, rows, keys, OuterStride<>(keys));
          ds.noalias() = dy * v_all.topRows(keys).transpose();
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t n = visible_keys(p0 + i, ks);
            float* row = dp_ptr + i * keys;
            const float* prow = p_ptr + i * keys;
            const float di = dsum[i];
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) row[j] = math::softmax_dscore(prow[j], row[j], di);
            std::fill(row + n, row + keys, 0.0f);
          }
          StridedMap dqm(dq.data + (b * T + r0) * W + h * hd, rows, hd, OuterStride<>(W));
          dqm.noalias() += scale * (ds * k_all.topRows(keys));
          dk_all.topRows(keys).noalias() += scale * (ds.transpose() * qm);
          dv_all.topRows(keys).noalias() += p.transpose() * dy;
        }
      }
    }
  }
}

}  // namespace stratagem::cpu
