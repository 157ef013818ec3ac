// Finite-difference checks of every CPU kernel's backward, a naive fp64 attention for the
// forward, and the Transformer blocks' recompute modes against Recompute::none.
#define BOOST_TEST_MODULE cpu_kernels
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "stratagem/backend.hpp"
#include "stratagem/transformer.hpp"

using namespace stratagem;

namespace {

struct Env {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng{1234};

  Tensor randn(Shape s, float scale = 1.0f) {
    Tensor t = be->allocate(s);
    std::normal_distribution<float> d(0.0f, scale);
    for (int64_t i = 0; i < t.numel(); ++i) t.data[i] = d(rng);
    return t;
  }
  Tensor zeros(Shape s) { return be->zeros(s); }
  Tensor clone(const Tensor& t) {
    Tensor c = be->allocate(t.shape);
    be->copy(c, t);
    return c;
  }
  std::vector<int32_t> ids(size_t n, int vocab) {
    std::uniform_int_distribution<int32_t> d(0, vocab - 1);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
};

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.data[i]) * b.data[i];
  return s;
}

// Compares `analytic` with central differences of `loss` in the elements of `x` (all of them,
// or an evenly spread sample), in max-norm relative to the largest analytic entry.
void check_grad(const char* what, Tensor& x, const Tensor& analytic,
                const std::function<double()>& loss, double h = 1e-2, double tol = 1e-2,
                int64_t max_points = 400) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_REQUIRE_EQUAL(x.numel(), analytic.numel());
    const int64_t n = x.numel();
    const int64_t stride = std::max<int64_t>(1, n / max_points);
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < n; ++i) max_ref = std::max(max_ref, std::abs(double(analytic.data[i])));
    for (int64_t i = 0; i < n; i += stride) {
      const float saved = x.data[i];
      x.data[i] = saved + static_cast<float>(h);
      const double lp = loss();
      x.data[i] = saved - static_cast<float>(h);
      const double lm = loss();
      x.data[i] = saved;
      const double fd = (lp - lm) / (2 * h);
      max_err = std::max(max_err, std::abs(fd - analytic.data[i]));
    }
    BOOST_TEST(max_ref > 0.0);
    BOOST_TEST(max_err <= tol * max_ref,
               what << ": max |fd - analytic| = " << max_err << ", max |analytic| = " << max_ref);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(embedding_with_and_without_positions) {
  Env e;
  const int B = 2, T = 5, C = 8, V = 7;
  Tensor wte = e.randn({V, C}), wpe = e.randn({T + 3, C});
  auto tokens = e.ids(B * T, V);
  tokens[3] = tokens[0];  // repeated ids must accumulate
  Tensor out = e.zeros({B, T, C}), r = e.randn({B, T, C});
  for (bool positions : {true, false}) {
    Tensor pos = positions ? wpe : Tensor{};
    auto loss = [&] {
      e.be->embedding_forward(out, tokens, wte, pos);
      return dot(out, r);
    };
    Tensor dwte = e.zeros(wte.shape), dwpe = positions ? e.zeros(wpe.shape) : Tensor{};
    e.be->embedding_backward(dwte, dwpe, tokens, r);
    check_grad("embedding dwte", wte, dwte, loss);
    if (positions) check_grad("embedding dwpe", wpe, dwpe, loss);
  }
  std::vector<int32_t> bad(B * T, V);  // out of range
  BOOST_CHECK_THROW(e.be->embedding_forward(out, bad, wte, wpe), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(layernorm_and_rmsnorm) {
  Env e;
  const int N = 6, C = 16;
  Tensor x = e.randn({N, C}), w = e.randn({C}), b = e.randn({C}), r = e.randn({N, C});
  Tensor out = e.zeros({N, C}), mean = e.zeros({N}), rstd = e.zeros({N});
  for (bool with_bias : {true, false}) {
    Tensor bias = with_bias ? b : Tensor{};
    auto loss = [&] {
      e.be->layernorm_forward(out, mean, rstd, x, w, bias, 1e-5f);
      return dot(out, r);
    };
    loss();
    Tensor dx = e.zeros(x.shape), dw = e.zeros(w.shape),
           db = with_bias ? e.zeros(b.shape) : Tensor{};
    e.be->layernorm_backward(dx, dw, db, r, x, w, mean, rstd);
    check_grad("layernorm dinp", x, dx, loss);
    check_grad("layernorm dweight", w, dw, loss);
    if (with_bias) check_grad("layernorm dbias", b, db, loss);
  }
  auto rms_loss = [&] {
    e.be->rmsnorm_forward(out, rstd, x, w, 1e-5f);
    return dot(out, r);
  };
  rms_loss();
  Tensor dx = e.zeros(x.shape), dw = e.zeros(w.shape);
  e.be->rmsnorm_backward(dx, dw, r, x, w, rstd);
  check_grad("rmsnorm dinp", x, dx, rms_loss);
  check_grad("rmsnorm dweight", w, dw, rms_loss);
  // dinp accumulates (it is the residual stream's gradient).
  Tensor dx2 = e.clone(dx), dw2 = e.zeros(w.shape);
  e.be->rmsnorm_backward(dx2, dw2, r, x, w, rstd);
  for (int64_t i = 0; i < dx.numel(); ++i) BOOST_TEST(dx2.data[i] == 2 * dx.data[i]);
  Tensor wrong = e.zeros({C + 1});
  BOOST_CHECK_THROW(e.be->rmsnorm_forward(out, rstd, x, wrong, 1e-5f), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(matmul_with_and_without_bias) {
  Env e;
  const int B = 2, T = 3, C = 5, OC = 7;
  Tensor x = e.randn({B, T, C}), w = e.randn({OC, C}), b = e.randn({OC}), r = e.randn({B, T, OC});
  Tensor out = e.zeros({B, T, OC});
  for (bool with_bias : {true, false}) {
    Tensor bias = with_bias ? b : Tensor{};
    auto loss = [&] {
      e.be->matmul_forward(out, x, w, bias);
      return dot(out, r);
    };
    Tensor dx = e.randn(x.shape);  // overwritten, whatever it held
    Tensor dw = e.zeros(w.shape), db = with_bias ? e.zeros(b.shape) : Tensor{};
    e.be->matmul_backward(dx, dw, db, r, x, w);
    check_grad("matmul dinp", x, dx, loss);
    check_grad("matmul dweight", w, dw, loss);
    if (with_bias) check_grad("matmul dbias", b, db, loss);
  }
  Tensor wrong = e.zeros({B, T, OC + 1});
  Tensor none;
  BOOST_CHECK_THROW(e.be->matmul_forward(wrong, x, w, none), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(rope_rotates_q_and_k_only) {
  Env e;
  const int B = 2, T = 6, NH = 4, KV = 2, hd = 8, W = (NH + 2 * KV) * hd;
  Tensor x = e.randn({B, T, W}), r = e.randn({B, T, W}), y = e.zeros({B, T, W});
  auto loss = [&] {
    e.be->copy(y, x);
    e.be->rope_forward(y, NH, KV, 10000.0f);
    return dot(y, r);
  };
  loss();
  // Position 0 is the identity; v is never rotated.
  for (int64_t c = 0; c < W; ++c) BOOST_TEST(y.data[c] == x.data[c]);
  for (int64_t c = (NH + KV) * hd; c < W; ++c) BOOST_TEST(y.data[3 * W + c] == x.data[3 * W + c]);
  // Rotations keep norms.
  double nx = 0, ny = 0;
  for (int64_t c = 0; c < hd; ++c)
    nx += x.data[4 * W + c] * x.data[4 * W + c], ny += y.data[4 * W + c] * y.data[4 * W + c];
  BOOST_TEST(std::abs(nx - ny) < 1e-4 * nx);
  Tensor dx = e.clone(r);
  e.be->rope_backward(dx, NH, KV, 10000.0f);
  check_grad("rope", x, dx, loss);

  // A chunk of rows [2, 6) rotated from position 2 equals those rows of the whole rotation,
  // forward and backward (context parallelism's chunks).
  loss();  // y again from the unperturbed x
  Tensor chunk = e.clone(x.slice(2 * W, Shape{1, 4, W}));
  e.be->rope_forward_from(chunk, NH, KV, 10000.0f, 2);
  Tensor dchunk = e.clone(r.slice(2 * W, Shape{1, 4, W}));
  e.be->rope_backward_from(dchunk, NH, KV, 10000.0f, 2);
  for (int64_t i = 0; i < chunk.numel(); ++i) {
    BOOST_TEST(chunk.data[i] == y.data[2 * W + i]);
    BOOST_TEST(dchunk.data[i] == dx.data[2 * W + i]);
  }
}

namespace {
// Reference causal GQA attention in fp64, straight from the definition.
std::vector<double> naive_attention(const Tensor& qkv, int NH, int KV) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2), hd = W / (NH + 2 * KV);
  std::vector<double> out(B * T * NH * hd, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t kvh = h / (NH / KV);
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv.data + (b * T + t) * W + h * hd;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          const float* k = qkv.data + (b * T + j) * W + (NH + kvh) * hd;
          double acc = 0;
          for (int64_t d = 0; d < hd; ++d) acc += double(q[d]) * k[d];
          s[j] = acc / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= t; ++j) {
          const float* v = qkv.data + (b * T + j) * W + (NH + KV + kvh) * hd;
          for (int64_t d = 0; d < hd; ++d)
            out[((b * T + t) * NH + h) * hd + d] += s[j] / sum * v[d];
        }
      }
    }
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(attention_forward_matches_naive_and_gradients_check) {
  Env e;
  // T = 70 crosses the 64-row score block; (4 heads, 2 kv heads) is GQA, (2, 2) is MHA.
  for (auto [NH, KV] : {std::pair{4, 2}, std::pair{2, 2}}) {
    const int B = 2, T = 70, hd = 8, W = (NH + 2 * KV) * hd;
    Tensor qkv = e.randn({B, T, W}), r = e.randn({B, T, NH * hd});
    Tensor out = e.zeros({B, T, NH * hd}), att = e.zeros({B, NH, T, T}), lse = e.zeros({B, NH, T});
    Tensor none;
    e.be->attention_forward(out, att, lse, qkv, NH, KV);
    const auto ref = naive_attention(qkv, NH, KV);
    double max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      max_err = std::max(max_err, std::abs(ref[i] - out.data[i]));
    BOOST_TEST(max_err < 1e-5);
    // Selective (att not kept) gives the same output.
    Tensor out2 = e.zeros(out.shape);
    e.be->attention_forward(out2, none, lse, qkv, NH, KV);
    for (int64_t i = 0; i < out.numel(); ++i) BOOST_TEST(out2.data[i] == out.data[i]);

    Tensor dqkv = e.randn(qkv.shape), dqkv_rc = e.randn(qkv.shape);
    e.be->attention_backward(dqkv, r, out, qkv, att, lse, NH, KV);
    e.be->attention_backward(dqkv_rc, r, out, qkv, none, lse, NH, KV);
    double diff = 0, mag = 0;
    for (int64_t i = 0; i < dqkv.numel(); ++i) {
      diff = std::max(diff, double(std::abs(dqkv.data[i] - dqkv_rc.data[i])));
      mag = std::max(mag, double(std::abs(dqkv.data[i])));
    }
    BOOST_TEST(diff <= 1e-5 * mag);
    auto loss = [&] {
      e.be->attention_forward(out2, none, lse, qkv, NH, KV);
      return dot(out2, r);
    };
    check_grad(NH == KV ? "attention dqkv (MHA)" : "attention dqkv (GQA)", qkv, dqkv, loss, 1e-2,
               1e-2, 600);
  }
  Tensor qkv = e.zeros({1, 4, 30});
  Tensor out = e.zeros({1, 4, 12}), lse = e.zeros({1, 3, 4}), none;
  BOOST_CHECK_THROW(e.be->attention_forward(out, none, lse, qkv, 3, 2), std::invalid_argument);
}

// Context parallelism's pieces: attention over blocks of keys (some read from a packed K,V
// copy), merged by the online softmax, equals one attention; the blocks' backward sums to its
// backward. Blocks that see no key at all (queries before every key) leave the merge alone.
BOOST_AUTO_TEST_CASE(attention_blocks_merge_to_one_attention) {
  Env e;
  const int NH = 4, KV = 2;
  const int64_t B = 2, T = 70, hd = 8, W = (NH + 2 * KV) * hd, C = NH * hd;
  Tensor qkv = e.randn({B, T, W}), dy = e.randn({B, T, C});
  Tensor out = e.zeros({B, T, C}), lse = e.zeros({B, NH, T}), none;
  e.be->attention_forward(out, none, lse, qkv, NH, KV);
  Tensor dqkv = e.zeros(qkv.shape);
  e.be->attention_backward(dqkv, dy, out, qkv, none, lse, NH, KV);

  Tensor packed = e.zeros({B, T, 2 * KV * hd});  // K,V alone, as they travel between ranks
  e.be->copy_block(packed, 0, 0, qkv, 0, C, B * T, 2 * KV * hd);
  const std::vector<TokenSpan> queries{{0, 35, 0}, {35, 35, 35}};
  const std::vector<TokenSpan> keys{{0, 20, 0}, {20, 30, 20}, {50, 20, 50}};
  Tensor merged = e.zeros(out.shape), merged_lse = e.zeros(lse.shape);
  e.be->fill(merged_lse, -INFINITY);
  Tensor part = e.zeros(out.shape), part_lse = e.zeros(lse.shape);
  for (const TokenSpan& q : queries) {
    for (size_t k = 0; k < keys.size(); ++k) {
      const Tensor& kv = k == 1 ? packed : qkv;
      e.be->attention_block_forward(part, part_lse, qkv, q, kv, keys[k], NH, KV);
      e.be->attention_merge(merged, merged_lse, part, part_lse, q);
    }
  }
  double out_err = 0, lse_err = 0;
  for (int64_t i = 0; i < out.numel(); ++i)
    out_err = std::max(out_err, double(std::abs(out.data[i] - merged.data[i])));
  for (int64_t i = 0; i < lse.numel(); ++i)
    lse_err = std::max(lse_err, double(std::abs(lse.data[i] - merged_lse.data[i])));
  BOOST_TEST(out_err <= 1e-5);
  BOOST_TEST(lse_err <= 1e-5);
  // Queries 0..34 see nothing of the last key block: the output is zero, the lse -inf.
  e.be->attention_block_forward(part, part_lse, qkv, queries[0], qkv, keys[2], NH, KV);
  BOOST_TEST(std::isinf(part_lse.data[0]));
  BOOST_TEST(part.data[0] == 0.0f);

  Tensor dblocks = e.zeros(qkv.shape), dpacked = e.zeros(packed.shape);
  for (const TokenSpan& q : queries) {
    for (size_t k = 0; k < keys.size(); ++k) {
      Tensor& dkv = k == 1 ? dpacked : dblocks;
      e.be->attention_block_backward(dblocks, dkv, dy, out, lse, qkv, q, k == 1 ? packed : qkv,
                                     keys[k], NH, KV);
    }
  }
  // The packed block's dK,dV land in dblocks' K,V columns of rows [20,50).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 20; t < 50; ++t)
      for (int64_t j = 0; j < 2 * KV * hd; ++j)
        dblocks.data[(b * T + t) * W + C + j] += dpacked.data[(b * T + t) * 2 * KV * hd + j];
  double d_err = 0, d_mag = 0;
  for (int64_t i = 0; i < dqkv.numel(); ++i) {
    d_err = std::max(d_err, double(std::abs(dqkv.data[i] - dblocks.data[i])));
    d_mag = std::max(d_mag, double(std::abs(dqkv.data[i])));
  }
  BOOST_TEST(d_err <= 1e-5 * d_mag);
  BOOST_CHECK_THROW(e.be->attention_block_forward(part, part_lse, qkv, TokenSpan{60, 20, 60}, qkv,
                                                  keys[0], NH, KV),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(gelu_swiglu_residual) {
  Env e;
  Tensor x = e.randn({4, 12}, 2.0f), r = e.randn({4, 12}), y = e.zeros({4, 12});
  auto gelu_loss = [&] {
    e.be->gelu_forward(y, x);
    return dot(y, r);
  };
  gelu_loss();
  // GELU(x) ~= x * Phi(x); the tanh form is within 1e-3 of the exact one.
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double exact = 0.5 * x.data[i] * (1 + std::erf(x.data[i] / std::sqrt(2.0)));
    BOOST_TEST(std::abs(exact - y.data[i]) < 1e-3);
  }
  Tensor dx = e.zeros(x.shape);
  e.be->gelu_backward(dx, r, x);
  check_grad("gelu", x, dx, gelu_loss);

  Tensor gu = e.randn({3, 10}, 2.0f), rs = e.randn({3, 5}), s = e.zeros({3, 5});
  auto swiglu_loss = [&] {
    e.be->swiglu_forward(s, gu);
    return dot(s, rs);
  };
  swiglu_loss();
  const float g0 = gu.data[0], u0 = gu.data[5];
  BOOST_TEST(std::abs(s.data[0] - g0 / (1 + std::exp(-g0)) * u0) < 1e-5);
  Tensor dgu = e.zeros(gu.shape);
  e.be->swiglu_backward(dgu, rs, gu);
  check_grad("swiglu", gu, dgu, swiglu_loss);

  Tensor a = e.randn({5}), b = e.randn({5}), o = e.zeros({5});
  e.be->residual_forward(o, a, b);
  for (int i = 0; i < 5; ++i) BOOST_TEST(o.data[i] == a.data[i] + b.data[i]);
  Tensor da = e.clone(a);
  e.be->residual_backward(da, b);
  for (int i = 0; i < 5; ++i) BOOST_TEST(da.data[i] == a.data[i] + b.data[i]);
}

BOOST_AUTO_TEST_CASE(crossentropy) {
  Env e;
  const int N = 6, V = 11;
  Tensor logits = e.randn({N, V}, 3.0f), losses = e.zeros({N});
  auto targets = e.ids(N, V);
  const float scale = 0.25f;
  auto loss = [&] {
    e.be->crossentropy_forward(losses, logits, targets);
    double s = 0;
    for (int i = 0; i < N; ++i) s += losses.data[i];
    return s * scale;
  };
  loss();
  double lse = 0, mx = *std::max_element(logits.data, logits.data + V);
  for (int j = 0; j < V; ++j) lse += std::exp(double(logits.data[j]) - mx);
  BOOST_TEST(std::abs(losses.data[0] - (mx + std::log(lse) - logits.data[targets[0]])) < 1e-5);
  Tensor d = e.zeros(logits.shape);
  e.be->crossentropy_softmax_backward(d, logits, targets, scale);
  check_grad("crossentropy", logits, d, loss, 1e-2, 1e-2);
  // In place (dlogits aliasing logits) gives the same result.
  Tensor in_place = e.clone(logits);
  e.be->crossentropy_softmax_backward(in_place, in_place, targets, scale);
  for (int64_t i = 0; i < d.numel(); ++i) BOOST_TEST(in_place.data[i] == d.data[i]);
  std::vector<int32_t> few(N - 1, 0);
  BOOST_CHECK_THROW(e.be->crossentropy_forward(losses, logits, few), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(adamw_and_reductions) {
  Env e;
  Tensor p = e.randn({3}), g = e.randn({3}), m = e.zeros({3}), v = e.zeros({3});
  std::vector<double> pd(p.data, p.data + 3), md(3, 0), vd(3, 0);
  AdamWStep s;
  s.lr = 0.1f;
  s.weight_decay = 0.5f;
  for (int step = 1; step <= 3; ++step) {
    s.step = step;
    e.be->adamw_update(p, g, m, v, s);
    for (int i = 0; i < 3; ++i) {
      pd[i] *= 1 - 0.1 * 0.5;
      md[i] = 0.9 * md[i] + 0.1 * g.data[i];
      vd[i] = 0.95 * vd[i] + 0.05 * g.data[i] * g.data[i];
      const double mh = md[i] / (1 - std::pow(0.9, step)), vh = vd[i] / (1 - std::pow(0.95, step));
      pd[i] -= 0.1 * mh / (std::sqrt(vh) + 1e-8);
    }
  }
  for (int i = 0; i < 3; ++i) BOOST_TEST(std::abs(p.data[i] - pd[i]) < 1e-5);
  Tensor t = e.randn({1000});
  double ss = 0;
  for (int i = 0; i < 1000; ++i) ss += double(t.data[i]) * t.data[i];
  BOOST_TEST(std::abs(e.be->sum_squares(t) - ss) < 1e-9 * ss);
  e.be->scale(t, 0.5f);
  BOOST_TEST(std::abs(e.be->sum_squares(t) - ss / 4) < 1e-9 * ss);
}

// ---- blocks: gradients by finite differences, recompute modes against none -----------------
namespace {

TransformerConfig tiny(bool llama) {
  ModelSpec s;
  s.name = llama ? "tiny-llama" : "tiny-gpt2";
  s.layers = 2;
  s.hidden = 16;
  s.heads = 4;
  s.kv_heads = llama ? 2 : 4;
  s.ffn_hidden = llama ? 24 : 64;
  s.vocab = 19;
  s.seq_len = 12;
  if (llama) {
    s.norm = Norm::rmsnorm;
    s.activation = Activation::swiglu;
    s.position = Position::rope;
    s.tied_embeddings = false;
    s.bias = false;
  }
  return transformer_config(s);
}

struct BlockGrads {
  std::vector<float> dx, dparams;
};

// A block's saved tensors: its normalized input and the core's activations.
struct BlockActs {
  Tensor xn, mean, rstd;
  AttentionActs attn;
  MlpActs mlp;
};

BlockActs allocate_block(Backend& be, const TransformerConfig& c, int B, int T, bool attention,
                         Recompute mode) {
  BlockActs a;
  a.xn = be.allocate(Shape{B, T, c.hidden});
  if (c.norm == Norm::layernorm) a.mean = be.allocate(Shape{B, T});
  a.rstd = be.allocate(Shape{B, T});
  if (attention) {
    a.attn.qkv = be.allocate(Shape{B, T, c.qkv_width()});
    if (mode == Recompute::none) a.attn.att = be.allocate(Shape{B, c.heads, T, T});
    a.attn.lse = be.allocate(Shape{B, c.heads, T});
    a.attn.out = be.allocate(Shape{B, T, c.attn_width()});
  } else {
    a.mlp.fc1_out = be.allocate(Shape{B, T, c.fc1_width()});
    a.mlp.act_out = be.allocate(Shape{B, T, c.ffn_hidden});
  }
  return a;
}

// x_out = x_in + block(norm(x_in)), composed from the pieces as the executor runs them.
void block_forward(Backend& be, const TransformerConfig& c, const LayerWeights& w, bool attention,
                   const Tensor& x_in, Tensor& x_out, BlockActs& a) {
  const Tensor& nw = attention ? w.attn_norm_w : w.mlp_norm_w;
  const Tensor& nb = attention ? w.attn_norm_b : w.mlp_norm_b;
  norm_forward(be, c, x_in, nw, nb, a.xn, a.mean, a.rstd);
  if (attention)
    attention_forward(be, c, w, a.xn, x_out, a.attn, true);
  else
    mlp_forward(be, c, w, a.xn, x_out, a.mlp, true);
  be.residual_forward(x_out, x_out, x_in);
}

// dx holds dL/dx_out on entry and dL/dx_in on exit.
void block_backward(Backend& be, const TransformerConfig& c, const LayerWeights& w, LayerWeights& g,
                    bool attention, const Tensor& x_in, Tensor& dx, const BlockActs& a,
                    Workspace& ws) {
  Tensor d_xn = be.allocate(x_in.shape);
  if (attention)
    attention_backward(be, c, w, g, dx, a.xn, d_xn, a.attn, ws);
  else
    mlp_backward(be, c, w, g, dx, a.xn, d_xn, a.mlp, ws);
  if (attention)
    norm_backward(be, c, dx, g.attn_norm_w, g.attn_norm_b, d_xn, x_in, w.attn_norm_w, a.mean,
                  a.rstd);
  else
    norm_backward(be, c, dx, g.mlp_norm_w, g.mlp_norm_b, d_xn, x_in, w.mlp_norm_w, a.mean, a.rstd);
}

// Runs one attention or mlp block forward+backward for dL/dx_out = r, the way the executor
// would under `mode`.
BlockGrads run_block(Backend& be, const TransformerConfig& c, Model& m, bool attention,
                     const Tensor& x_in, const Tensor& r, Recompute mode) {
  const int B = static_cast<int>(x_in.dim(0)), T = static_cast<int>(x_in.dim(1));
  be.fill(m.grads, 0.0f);
  Workspace ws = allocate_workspace(be, c, B, T);
  Tensor x_out = be.allocate(x_in.shape), dx = be.allocate(x_in.shape);
  be.copy(dx, r);
  const LayerWeights& w = m.weights.layer(1);
  LayerWeights& g = m.grad_weights.layer(1);
  BlockActs a = allocate_block(be, c, B, T, attention, mode);
  block_forward(be, c, w, attention, x_in, x_out, a);
  if (mode == Recompute::full) {
    // Full: nothing kept but x_in; forward again right before backward.
    BlockActs fresh = allocate_block(be, c, B, T, attention, Recompute::none);
    Tensor sink = be.allocate(x_in.shape);
    block_forward(be, c, w, attention, x_in, sink, fresh);
    block_backward(be, c, w, g, attention, x_in, dx, fresh, ws);
  } else {
    block_backward(be, c, w, g, attention, x_in, dx, a, ws);
  }
  return {std::vector<float>(dx.data, dx.data + dx.numel()),
          std::vector<float>(m.grads.data, m.grads.data + m.grads.numel())};
}

double rel_maxnorm(const std::vector<float>& a, const std::vector<float>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, double(std::abs(a[i] - ref[i])));
    mag = std::max(mag, double(std::abs(ref[i])));
  }
  return mag > 0 ? err / mag : err;
}

}  // namespace

BOOST_AUTO_TEST_CASE(blocks_gradcheck_and_recompute_modes) {
  for (bool llama : {false, true}) {
    for (bool attention : {true, false}) {
      BOOST_TEST_CONTEXT((llama ? "llama " : "gpt2 ") << (attention ? "attention" : "mlp")) {
        Env e;
        const TransformerConfig c = tiny(llama);
        Model m = make_model(*e.be, c, 7);
        // Larger weights than the 0.02 init so every path carries a visible gradient, and
        // norm weights away from 1 so their gradients are tested too.
        for (const ParamInfo& p : m.table.entries()) {
          Tensor t = m.params.slice(p.offset, p.shape);
          if (p.shape.ndim() == 2)
            e.be->scale(t, 10.0f);
          else
            for (int64_t i = 0; i < t.numel(); ++i) t.data[i] += 0.1f * std::sin(float(i));
        }
        Tensor x_in = e.randn({2, 12, c.hidden}), r = e.randn({2, 12, c.hidden});
        const BlockGrads none = run_block(*e.be, c, m, attention, x_in, r, Recompute::none);
        for (Recompute mode : {Recompute::selective, Recompute::full}) {
          const BlockGrads g = run_block(*e.be, c, m, attention, x_in, r, mode);
          BOOST_TEST(rel_maxnorm(g.dx, none.dx) < 1e-5);
          BOOST_TEST(rel_maxnorm(g.dparams, none.dparams) < 1e-5);
        }
        // Finite differences of sum(x_out * r) in x_in and in the layer's parameters.
        BlockActs acts = allocate_block(*e.be, c, 2, 12, attention, Recompute::selective);
        Tensor x_out = e.be->allocate(x_in.shape);
        auto loss = [&] {
          block_forward(*e.be, c, m.weights.layer(1), attention, x_in, x_out, acts);
          return dot(x_out, r);
        };
        Tensor dx{const_cast<float*>(none.dx.data()), x_in.shape, nullptr};
        check_grad("block dx_in", x_in, dx, loss, 1e-2, 2e-2, 200);
        Tensor grads{const_cast<float*>(none.dparams.data()), m.grads.shape, nullptr};
        const std::string pre = "layers.1.";
        for (const ParamInfo& p : m.table.entries()) {
          if (p.name.rfind(pre + (attention ? "attn." : "mlp."), 0) != 0) continue;
          Tensor param = m.params.slice(p.offset, p.shape);
          Tensor grad = grads.slice(p.offset, p.shape);
          check_grad(p.name.c_str(), param, grad, loss, 1e-2, 2e-2, 100);
        }
      }
    }
  }
}

// The MoE kernels: the router's gradient through the combine weights and the load-balancing
// loss (finite differences away from top-k ties), and the weighted combine's.
BOOST_AUTO_TEST_CASE(moe_router_and_combine) {
  Env e;
  const int N = 6, E = 5, K = 2, C = 8;
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    Tensor logits = e.randn({N, E}, 2.0f), r = e.randn({N, K});
    Tensor scores = e.zeros({N, E}), weights = e.zeros({N, K});
    std::vector<int32_t> chosen(N * K);
    const double coeff = 0.3;
    auto loss = [&] {
      e.be->moe_router_forward(scores, weights, chosen, logits, score);
      return dot(weights, r) + e.be->moe_aux_loss(scores, chosen, K, score, coeff);
    };
    loss();
    const std::vector<int32_t> picked = chosen;
    Tensor dlogits = e.zeros({N, E});
    e.be->moe_router_backward(dlogits, r, scores, weights, chosen, score, coeff);
    // A step of 1e-3 must not change the choice (the data keeps scores apart): checked below.
    check_grad(score == RouterScore::softmax ? "router softmax" : "router sigmoid", logits, dlogits,
               loss, 1e-3);
    loss();
    BOOST_TEST(chosen == picked);
  }
  // Combine: slots a permutation of the N*K rows.
  Tensor inp = e.randn({N * K, C}), w = e.randn({N, K}), g = e.randn({N, C});
  std::vector<int32_t> slots(N * K);
  for (int i = 0; i < N * K; ++i) slots[size_t(i)] = (i * 7) % (N * K);
  Tensor out = e.zeros({N, C});
  auto combine_loss = [&] {
    e.be->moe_combine_forward(out, inp, w, slots);
    return dot(out, g);
  };
  Tensor dinp = e.zeros(inp.shape), dw = e.zeros(w.shape);
  e.be->moe_combine_backward(dinp, dw, g, inp, w, slots);
  check_grad("combine dinp", inp, dinp, combine_loss);
  check_grad("combine dweights", w, dw, combine_loss);
  // The permutation's gather and its backward (the copies summed).
  Tensor gathered = e.zeros({N * K, C});
  std::vector<int32_t> rows(N * K);
  for (int i = 0; i < N * K; ++i) rows[size_t(i)] = i / K;
  e.be->gather_rows(gathered, g, rows);
  BOOST_TEST(gathered.data[(2 * K + 1) * C + 3] == g.data[2 * C + 3]);
  BOOST_CHECK_THROW(e.be->gather_rows(gathered, inp, std::vector<int32_t>(N * K, 99)),
                    std::invalid_argument);
}
