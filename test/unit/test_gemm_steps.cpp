// The CUDA backend's GEMM-based ops (src/runtime/cuda/gemm_steps.hpp) run on CPU: each GEMM
// by a naive column-major product that also checks the operand shapes cuBLASLt would check,
// the elementwise kernels by their own per-index bodies (kernel_bodies.hpp) in loops, and the
// row kernels (softmax, row dot products, column sums) by loops with the semantics
// kernels.hpp states. The results must equal the CPU
// backend's matmul and attention (GQA, probabilities kept or recomputed), so the layouts,
// strides and batch shapes of the GPU path are tested in every CI run, without a GPU.
#define BOOST_TEST_MODULE gemm_steps
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <deque>
#include <random>
#include <vector>

#include "src/runtime/cuda/gemm_steps.hpp"
#include "src/runtime/cuda/kernel_bodies.hpp"
#include "stratagem/backend.hpp"
#include "stratagem/kernel_math.hpp"
#include "test/support/random_tensors.hpp"

using namespace stratagem;
using cuda::GemmOperand;

namespace {

struct HostOps {
  std::deque<std::vector<float>> held;
  int gemms = 0;

  float* scratch(int64_t n) {
    held.emplace_back(size_t(n), std::nanf(""));  // unwritten scratch shows up as NaN
    return held.back().data();
  }
  // C (m x n) = alpha * op(A) op(B) + beta * C (+ bias per row), column-major, batched.
  void gemm(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, float* c,
            int64_t ldc, int64_t stride_c, int64_t batch, float alpha, float beta,
            const float* bias) {
    ++gemms;
    // The shape checks of cublasLtMatmul: op(A) is m x k, op(B) is k x n, ld >= rows.
    BOOST_REQUIRE(a.transposed ? (a.rows == k && a.cols == m) : (a.rows == m && a.cols == k));
    BOOST_REQUIRE(b.transposed ? (b.rows == n && b.cols == k) : (b.rows == k && b.cols == n));
    BOOST_REQUIRE(a.ld >= a.rows);
    BOOST_REQUIRE(b.ld >= b.rows);
    BOOST_REQUIRE(ldc >= m);
    BOOST_REQUIRE(!bias || (batch == 1 && ldc == m));
    for (int64_t i = 0; i < batch; ++i) {
      const float* A = a.data + i * a.stride;
      const float* Bm = b.data + i * b.stride;
      float* C = c + i * stride_c;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t r = 0; r < m; ++r) {
          double acc = 0;
          for (int64_t l = 0; l < k; ++l) {
            const float x = a.transposed ? A[l + r * a.ld] : A[r + l * a.ld];
            const float y = b.transposed ? Bm[j + l * b.ld] : Bm[l + j * b.ld];
            acc += double(x) * y;
          }
          float& out = C[r + j * ldc];
          out = float(alpha * acc + (beta != 0 ? beta * out : 0.0f));
          if (bias) out += bias[r];
        }
    }
  }
  // The kernels' own per-index bodies, in plain loops.
  void qkv_permute(float* qkv, float* q, float* k, float* v, int64_t B, int64_t T, int64_t NH,
                   int64_t KV, int64_t hd, bool to_heads) {
    for (int64_t i = 0; i < B * T * (NH + 2 * KV) * hd; ++i)
      cuda::body::qkv_permute(i, qkv, q, k, v, T, NH, KV, hd, to_heads);
  }
  void heads_permute(float* heads, float* out, int64_t B, int64_t T, int64_t NH, int64_t hd,
                     bool to_heads) {
    for (int64_t i = 0; i < B * T * NH * hd; ++i)
      cuda::body::heads_permute(i, heads, out, T, NH, hd, to_heads);
  }
  void causal_softmax(float* s, float* lse, int64_t rows, int64_t T) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % T;
      float* row = s + r * T;
      float mx = row[0], sum = 0;
      for (int64_t j = 0; j <= t; ++j) mx = std::max(mx, row[j]);
      for (int64_t j = 0; j <= t; ++j) sum += row[j] = math::fast_exp(row[j] - mx);
      for (int64_t j = 0; j < T; ++j) row[j] = j <= t ? row[j] * (1.0f / sum) : 0.0f;
      lse[r] = mx + std::log(sum);
    }
  }
  void causal_probs(float* s, const float* lse, int64_t rows, int64_t T) {
    for (int64_t i = 0; i < rows * T; ++i) cuda::body::causal_probs(i, s, lse, T);
  }
  void attention_d(float* d, const float* dout, const float* out, int64_t B, int64_t T, int64_t NH,
                   int64_t hd) {
    for (int64_t w = 0; w < B * NH * T; ++w) {
      const int64_t t = w % T, h = (w / T) % NH, b = w / (T * NH);
      const int64_t base = (b * T + t) * NH * hd + h * hd;
      float acc = 0;
      for (int64_t e = 0; e < hd; ++e) acc += dout[base + e] * out[base + e];
      d[w] = acc;
    }
  }
  void softmax_dscore(float* dp, const float* p, const float* d, int64_t rows, int64_t T) {
    for (int64_t i = 0; i < rows * T; ++i) cuda::body::softmax_dscore(i, dp, p, d, T);
  }
  void column_sums(float* out, const float* in, int64_t N, int64_t C) {
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0;
      for (int64_t r = 0; r < N; ++r) acc += in[r * C + c];
      out[c] += acc;
    }
  }
};

using test::host;
using test::randn;
// max |a - b| <= 1e-5 * max(1, max |b|)
void expect_close(const char* what, const float* a, const float* b, size_t n) {
  double err = 0, ref = 1;
  for (size_t i = 0; i < n; ++i) {
    BOOST_REQUIRE_MESSAGE(std::isfinite(a[i]), what << "[" << i << "] is not finite");
    err = std::max(err, double(std::abs(a[i] - b[i])));
    ref = std::max(ref, double(std::abs(b[i])));
  }
  BOOST_TEST(err <= 1e-5 * ref, what << ": max |diff| " << err << " vs max |ref| " << ref);
}

}  // namespace

BOOST_AUTO_TEST_CASE(matmul_steps_equal_the_cpu_backend) {
  const int64_t N = 13, C = 24, OC = 17;
  auto cpu = make_cpu_backend();
  const auto x = randn(N * C, 1), w = randn(OC * C, 2), b = randn(OC, 3), g = randn(N * OC, 4),
             dw0 = randn(OC * C, 5);
  Tensor xt = host(*cpu, x, {N, C}), wt = host(*cpu, w, {OC, C}), bt = host(*cpu, b, {OC});
  Tensor out = cpu->allocate({N, OC}), dx = cpu->allocate({N, C}), dw = host(*cpu, dw0, {OC, C}),
         db = cpu->zeros({OC});
  cpu->matmul_forward(out, xt, wt, bt);
  cpu->matmul_backward(dx, dw, db, host(*cpu, g, {N, OC}), xt, wt);

  HostOps ops;
  std::vector<float> o(N * OC), hdx(N * C), hdw = dw0, hdb(OC, 0.0f);
  cuda::matmul_forward_steps(ops, N, C, OC, x.data(), w.data(), b.data(), o.data());
  cuda::matmul_backward_steps(ops, N, C, OC, g.data(), x.data(), w.data(), hdx.data(), hdw.data(),
                              hdb.data());
  expect_close("out", o.data(), out.data, o.size());
  expect_close("dinp", hdx.data(), dx.data, hdx.size());
  expect_close("dweight (accumulated)", hdw.data(), dw.data, hdw.size());
  expect_close("dbias", hdb.data(), db.data, hdb.size());
  BOOST_TEST(ops.gemms == 3);
}

BOOST_AUTO_TEST_CASE(attention_steps_equal_the_cpu_backend) {
  const int64_t B = 2, T = 11, hd = 8;
  auto cpu = make_cpu_backend();
  for (auto [NH, KV] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {6, 1}}) {
    BOOST_TEST_CONTEXT("heads " << NH << ", kv heads " << KV) {
      const int64_t W = (NH + 2 * KV) * hd, C = NH * hd;
      auto qkv = randn(B * T * W, 6);
      const auto g = randn(B * T * C, 7);
      Tensor q = host(*cpu, qkv, {B, T, W}), out = cpu->allocate({B, T, C}),
             lse = cpu->allocate({B, NH, T}), att = cpu->allocate({B, NH, T, T}),
             dq = cpu->allocate({B, T, W}), dq2 = cpu->allocate({B, T, W});
      Tensor gt = host(*cpu, g, {B, T, C});
      cpu->attention_forward(out, att, lse, q, int(NH), int(KV));
      cpu->attention_backward(dq, gt, out, q, att, lse, int(NH), int(KV));

      HostOps ops;
      const cuda::AttentionShape a{B, T, NH, KV, hd};
      std::vector<float> s(B * NH * T * T), hl(B * NH * T), ho(B * T * C), hdq(B * T * W),
          hdq2(B * T * W), gg = g;
      cuda::attention_forward_steps(ops, a, qkv.data(), s.data(), hl.data(), ho.data());
      expect_close("out", ho.data(), out.data, ho.size());
      expect_close("lse", hl.data(), lse.data, hl.size());
      // The CPU backend leaves the probabilities above the diagonal unspecified.
      for (int64_t r = 0; r < B * NH * T; ++r)
        expect_close("probabilities", s.data() + r * T, att.data + r * T, size_t(r % T + 1));
      cuda::attention_backward_steps(ops, a, qkv.data(), s.data(), hl.data(), gg.data(), ho.data(),
                                     hdq.data());
      expect_close("dqkv (probabilities kept)", hdq.data(), dq.data, hdq.size());
      cuda::attention_backward_steps(ops, a, qkv.data(), nullptr, hl.data(), gg.data(), ho.data(),
                                     hdq2.data());
      cpu->attention_backward(dq2, gt, out, q, Tensor{}, lse, int(NH), int(KV));
      expect_close("dqkv (recomputed)", hdq2.data(), dq2.data, hdq2.size());
    }
  }
}
