// The per-element math both backends share (stratagem/kernel_math.hpp), checked on CPU: the
// CUDA kernels call these same functions, so a GPU run only has indexing and launch left.
#define BOOST_TEST_MODULE kernel_math
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "stratagem/kernel_math.hpp"

using namespace stratagem;

namespace {
uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// Central difference of f at x.
template <class F>
double fd(F f, double x, double h = 1e-3) {
  return (f(x + h) - f(x - h)) / (2 * h);
}
}  // namespace

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even) {
  BOOST_TEST(math::bf16_from_float(1.0f) == 0x3f80);
  BOOST_TEST(math::float_from_bf16(0x3f80) == 1.0f);
  // Exactly halfway between two bf16 values: ties go to the even mantissa.
  BOOST_TEST(math::bf16_from_float(from_bits(0x3f808000u)) == 0x3f80);
  BOOST_TEST(math::bf16_from_float(from_bits(0x3f818000u)) == 0x3f82);
  BOOST_TEST(math::bf16_from_float(from_bits(0x3f808001u)) == 0x3f81);  // just above: up
  BOOST_TEST(math::bf16_from_float(-2.0f) == 0xc000);
  BOOST_TEST(math::bf16_from_float(INFINITY) == 0x7f80);
  BOOST_TEST(std::isnan(math::float_from_bf16(math::bf16_from_float(NAN))));
  // A NaN whose payload sits in the low bits must not round into infinity.
  BOOST_TEST(std::isnan(math::float_from_bf16(math::bf16_from_float(from_bits(0x7f800001u)))));
  // The largest finite float rounds up to infinity, as IEEE rounding says.
  BOOST_TEST(math::bf16_from_float(from_bits(0x7f7fffffu)) == 0x7f80);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = d(rng);
    const float r = math::float_from_bf16(math::bf16_from_float(x));
    BOOST_REQUIRE(std::abs(r - x) <= std::abs(x) * (1.0f / 256));  // half an ulp of 8 bits
    BOOST_REQUIRE((bits(r) & 0xffffu) == 0);
  }
}

BOOST_AUTO_TEST_CASE(fast_exp_and_tanh_match_the_library) {
  double worst = 0;
  for (double x = -80; x <= 80; x += 0.0137) {
    const float xf = float(x);
    const double ref = std::exp(double(xf));
    worst = std::max(worst, std::abs(math::fast_exp(xf) - ref) / ref);
  }
  BOOST_TEST(worst < 5e-7, "worst relative error " << worst);
  BOOST_TEST(math::fast_exp(-1000.0f) < 1e-37f);
  for (double x = -12; x <= 12; x += 0.01)
    BOOST_REQUIRE(std::abs(math::fast_tanh(float(x)) - std::tanh(x)) < 2e-7);
}

BOOST_AUTO_TEST_CASE(activation_gradients_match_finite_differences) {
  for (double x = -6; x <= 6; x += 0.25) {
    const double g = 0.7;
    const double num = fd([](double v) { return double(math::gelu_forward(float(v))); }, x);
    BOOST_TEST(std::abs(math::gelu_backward(float(x), float(g)) - g * num) < 2e-3);
    for (double up : {-1.5, 0.3, 2.0}) {
      float dgate, dup;
      math::swiglu_backward(float(x), float(up), float(g), &dgate, &dup);
      const double ngate =
          fd([&](double v) { return double(math::swiglu_forward(float(v), float(up))); }, x);
      const double nup =
          fd([&](double v) { return double(math::swiglu_forward(float(x), float(v))); }, up);
      BOOST_TEST(std::abs(dgate - g * ngate) < 2e-3);
      BOOST_TEST(std::abs(dup - g * nup) < 2e-3);
    }
  }
  // GELU's tanh form at known points (PyTorch's gelu(approximate="tanh")).
  BOOST_TEST(std::abs(math::gelu_forward(1.0f) - 0.8411920f) < 1e-6);
  BOOST_TEST(std::abs(math::gelu_forward(-2.0f) - (-0.0454023f)) < 1e-6);
}

// LayerNorm and RMSNorm of one row built from norm_apply/rstd_of; norm_dinp against central
// differences of <out, r>.
BOOST_AUTO_TEST_CASE(norm_input_gradient_matches_finite_differences) {
  const int C = 24;
  std::mt19937 rng(3);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> x(C), w(C), b(C), r(C);
  for (int c = 0; c < C; ++c) x[c] = d(rng), w[c] = d(rng), b[c] = d(rng), r[c] = d(rng);
  for (bool rms : {false, true}) {
    auto stats = [&](const std::vector<double>& v, float* m, float* s) {
      double sum = 0, sq = 0;
      for (double e : v) sum += e;
      *m = rms ? 0.0f : float(sum / C);
      for (double e : v) sq += (e - *m) * (e - *m);
      *s = math::rstd_of(float(sq / C), 1e-5f);
    };
    auto loss = [&](const std::vector<double>& v) {
      float m, s;
      stats(v, &m, &s);
      double l = 0;
      for (int c = 0; c < C; ++c)
        l += r[c] * (rms ? math::norm_apply(float(v[c]), m, s, float(w[c]))
                         : math::norm_apply(float(v[c]), m, s, float(w[c]), float(b[c])));
      return l;
    };
    float m, s;
    stats(x, &m, &s);
    double sum_dn = 0, sum_dn_n = 0;
    for (int c = 0; c < C; ++c) {
      sum_dn += r[c] * w[c];
      sum_dn_n += r[c] * w[c] * (x[c] - m) * s;
    }
    for (int c = 0; c < C; ++c) {
      const float analytic = math::norm_dinp(float(r[c]), float(w[c]), float(x[c]), m, s,
                                             rms ? 0.0f : float(sum_dn / C), float(sum_dn_n / C));
      std::vector<double> xp = x, xm = x;
      const double h = 1e-2;
      xp[c] += h, xm[c] -= h;
      const double num = (loss(xp) - loss(xm)) / (2 * h);
      BOOST_TEST(std::abs(analytic - num) < 2e-3 * (1 + std::abs(num)),
                 (rms ? "rmsnorm" : "layernorm") << " c=" << c);
    }
  }
}

BOOST_AUTO_TEST_CASE(rope_rotation_is_orthogonal_and_its_transpose_undoes_it) {
  const int T = 16, hd = 8;
  std::vector<float> table(T * hd);
  math::fill_rope_table(table.data(), T, hd, 10000.0f);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < hd / 2; ++i) {
      const float c = table[(t * hd / 2 + i) * 2], s = table[(t * hd / 2 + i) * 2 + 1];
      BOOST_REQUIRE(std::abs(c - std::cos(t * std::pow(10000.0, -2.0 * i / hd))) < 1e-6);
      float a, b, x1, x2;
      math::rope_rotate(0.3f, -1.2f, c, s, &a, &b);
      BOOST_REQUIRE(std::abs(a * a + b * b - (0.09f + 1.44f)) < 1e-5);
      math::rope_rotate(a, b, c, -s, &x1, &x2);
      BOOST_REQUIRE(std::abs(x1 - 0.3f) < 1e-6);
      BOOST_REQUIRE(std::abs(x2 + 1.2f) < 1e-6);
    }
}

// Softmax backward through probabilities rebuilt from the log-sum-exp.
BOOST_AUTO_TEST_CASE(softmax_backward_matches_finite_differences) {
  const std::vector<double> s0 = {0.5, -1.0, 2.0, 0.1, -0.3};
  const std::vector<double> r = {1.0, -2.0, 0.5, 0.25, 3.0};
  const int n = 5;
  auto probs = [&](const std::vector<double>& s) {
    double mx = s[0], sum = 0;
    for (double v : s) mx = std::max(mx, v);
    for (double v : s) sum += std::exp(v - mx);
    const float lse = float(mx + std::log(sum));
    std::vector<float> p(n);
    for (int j = 0; j < n; ++j) p[j] = math::prob_from_lse(float(s[j]), lse);
    return p;
  };
  auto p = probs(s0);
  double total = 0, d = 0;
  for (int j = 0; j < n; ++j) total += p[j], d += p[j] * r[j];
  BOOST_TEST(std::abs(total - 1.0) < 1e-6);
  for (int j = 0; j < n; ++j) {
    std::vector<double> sp = s0, sm = s0;
    sp[j] += 1e-3, sm[j] -= 1e-3;
    double lp = 0, lm = 0;
    auto pp = probs(sp), pm = probs(sm);
    for (int k = 0; k < n; ++k) lp += r[k] * pp[k], lm += r[k] * pm[k];
    BOOST_TEST(std::abs(math::softmax_dscore(p[j], float(r[j]), float(d)) - (lp - lm) / 2e-3) <
               1e-3);
  }
}

// torch.optim.AdamW's update written out in fp64, three steps.
BOOST_AUTO_TEST_CASE(adamw_element_follows_torch) {
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  float p = 0.5f, m = 0, v = 0;
  double rp = 0.5, rm = 0, rv = 0;
  const float grads[3] = {0.3f, -1.0f, 0.05f};
  for (int step = 1; step <= 3; ++step) {
    const float g = grads[step - 1];
    math::adamw_element(&p, g, &m, &v, math::adamw_scalars(lr, b1, b2, eps, wd, step));
    rp *= 1 - double(lr) * wd;
    rm = b1 * rm + (1 - double(b1)) * g;
    rv = b2 * rv + (1 - double(b2)) * g * g;
    const double mhat = rm / (1 - std::pow(double(b1), step));
    const double denom = std::sqrt(rv) / std::sqrt(1 - std::pow(double(b2), step)) + eps;
    rp -= lr * mhat / denom;
    BOOST_TEST(std::abs(p - rp) < 1e-6, "step " << step << ": " << p << " vs " << rp);
  }
}
