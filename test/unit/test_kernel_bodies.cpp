// The per-index bodies of the CUDA backend's elementwise kernels (kernel_bodies.hpp), run in
// plain loops on CPU, equal the CPU backend's embedding, RoPE, SwiGLU and bias: the GPU
// kernels' indexing is tested in every CI run, without a GPU.
#define BOOST_TEST_MODULE kernel_bodies
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "src/runtime/cuda/kernel_bodies.hpp"
#include "stratagem/backend.hpp"
#include "test/support/random_tensors.hpp"

using namespace stratagem;
namespace body = stratagem::cuda::body;

namespace {
using test::host;
using test::randn;
void expect_equal(const char* what, const std::vector<float>& a, const Tensor& b, double tol) {
  BOOST_REQUIRE_EQUAL(int64_t(a.size()), b.numel());
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, double(std::abs(a[i] - b.data[i])));
  BOOST_TEST(err <= tol, what << ": max |diff| " << err);
}
}  // namespace

BOOST_AUTO_TEST_CASE(embedding_forward) {
  auto cpu = make_cpu_backend();
  const int64_t B = 2, T = 5, C = 12, V = 9;
  const auto wte = randn(V * C, 1), wpe = randn(T * C, 2);
  std::vector<int32_t> tok = {0, 3, 8, -1, 3, 7, 1, -1, 2, 5};
  for (bool pos : {true, false}) {
    Tensor out = cpu->allocate({B, T, C});
    cpu->embedding_forward(out, tok, host(*cpu, wte, {V, C}),
                           pos ? host(*cpu, wpe, {T, C}) : Tensor{});
    std::vector<float> o(B * T * C);
    for (int64_t i = 0; i < B * T * C; ++i)
      body::embedding_forward(i, o.data(), tok.data(), wte.data(), pos ? wpe.data() : nullptr, T,
                              C);
    expect_equal(pos ? "embedding with positions" : "embedding", o, out, 0);
  }
}

BOOST_AUTO_TEST_CASE(rope_forward_and_backward) {
  auto cpu = make_cpu_backend();
  const int64_t B = 2, T = 7, NH = 4, KV = 2, hd = 8, W = (NH + 2 * KV) * hd;
  const auto qkv = randn(B * T * W, 3);
  std::vector<float> table(T * hd);
  math::fill_rope_table(table.data(), T, hd, 10000.0f);
  for (float sign : {1.0f, -1.0f}) {
    Tensor t = host(*cpu, qkv, {B, T, W});
    if (sign > 0)
      cpu->rope_forward(t, int(NH), int(KV), 10000.0f);
    else
      cpu->rope_backward(t, int(NH), int(KV), 10000.0f);
    std::vector<float> h = qkv;
    for (int64_t i = 0; i < B * T * (NH + KV) * (hd / 2); ++i)
      body::rope(i, h.data(), table.data(), T, W, hd, int(NH + KV), sign);
    expect_equal(sign > 0 ? "rope forward" : "rope backward", h, t, 0);
  }
}

BOOST_AUTO_TEST_CASE(swiglu_and_bias) {
  auto cpu = make_cpu_backend();
  const int64_t N = 6, F = 10;
  const auto x = randn(N * 2 * F, 4), g = randn(N * F, 5), b = randn(F, 6);
  Tensor xt = host(*cpu, x, {N, 2 * F}), out = cpu->allocate({N, F}),
         dx = cpu->allocate({N, 2 * F});
  cpu->swiglu_forward(out, xt);
  cpu->swiglu_backward(dx, host(*cpu, g, {N, F}), xt);
  std::vector<float> o(N * F), d(N * 2 * F);
  for (int64_t i = 0; i < N * F; ++i) body::swiglu_forward(i, o.data(), x.data(), F);
  for (int64_t i = 0; i < N * F; ++i) body::swiglu_backward(i, d.data(), g.data(), x.data(), F);
  // The same formulas; the CPU loop may vectorize them (fused multiply-adds).
  expect_equal("swiglu forward", o, out, 1e-6);
  expect_equal("swiglu backward", d, dx, 1e-6);
  // Bias: each row of (N,F) gains the bias vector, as the CPU matmul adds it.
  std::vector<float> rows = g;
  for (int64_t i = 0; i < N * F; ++i) body::add_bias(i, rows.data(), b.data(), F);
  Tensor w = cpu->allocate({F, F}), in = cpu->allocate({N, F}), res = cpu->allocate({N, F});
  cpu->fill(w, 0.0f);
  for (int64_t j = 0; j < F; ++j) w.data[j * F + j] = 1.0f;  // identity: out = in + bias
  cpu->upload(in, g.data());
  cpu->matmul_forward(res, in, w, host(*cpu, b, {F}));
  expect_equal("bias", rows, res, 1e-6);
}
