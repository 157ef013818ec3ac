// The MoE FFN's pieces (see moe_block.hpp). Only Backend kernels touch tensor data, so the same
// code runs on any backend; the experts' grouped GEMM is one matmul per held expert over its
// contiguous rows (an expert without rows is skipped: its gradient gets nothing).
#include "stratagem/moe_block.hpp"

#include <stdexcept>
#include <string>

namespace stratagem {
namespace {

struct Rows {
  int64_t n, c;
};
Rows rows_of(const Tensor& t, const char* where) {
  if (!t.defined() || t.ndim() < 2)
    throw std::invalid_argument(std::string(where) + ": expected (...,C) rows, got " +
                                t.shape.str());
  return {t.numel() / t.dim(-1), t.dim(-1)};
}

Tensor flat2(const Tensor& t) {
  return t.view(Shape{t.numel() / t.dim(-1), t.dim(-1)});
}

// A saved tensor of `shape`, reusing `t` when it already has that shape (a recompute).
void ensure(Backend& be, const MoeActs& a, Tensor& t, Shape shape) {
  if (!t.defined() || !(t.shape == shape)) t = a.save(be, shape);
}

int64_t sum(std::span<const int64_t> v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// The local expert FFN width (an etp share of expert_ffn_hidden).
int64_t expert_width(const LayerWeights& w) {
  return w.expert_fc2_w.empty() ? 0 : w.expert_fc2_w[0].dim(1);
}

}  // namespace

MoeRouting route_tokens(std::span<const int32_t> chosen, int experts, int top_k) {
  if (top_k < 1 || chosen.size() % size_t(top_k))
    throw std::invalid_argument("route_tokens: " + std::to_string(chosen.size()) +
                                " choices are not a multiple of top_k " + std::to_string(top_k));
  MoeRouting r;
  r.experts = experts;
  r.top_k = top_k;
  r.chosen.assign(chosen.begin(), chosen.end());
  r.counts = moe_math::expert_counts(chosen, experts);
  std::vector<int64_t> next(size_t(experts), 0);
  for (int e = 1; e < experts; ++e) next[size_t(e)] = next[size_t(e - 1)] + r.counts[size_t(e - 1)];
  r.slots.resize(chosen.size());
  r.source.resize(chosen.size());
  for (size_t i = 0; i < chosen.size(); ++i) {
    const int64_t slot = next[size_t(chosen[i])]++;
    r.slots[i] = int32_t(slot);
    r.source[size_t(slot)] = int32_t(i / size_t(top_k));
  }
  return r;
}

void moe_router_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                        const Tensor& xn, MoeActs& a) {
  const auto [N, C] = rows_of(xn, "moe_router_forward");
  const MoeSpec& moe = cfg.moe;
  if (!w.router_w.defined())
    throw std::logic_error("moe_router_forward: the layer holds no router (not an MoE layer)");
  a.logits = a.temp(be, Shape{N, moe.experts});  // backward reads the scores only
  ensure(be, a, a.scores, Shape{N, moe.experts});
  ensure(be, a, a.weights, Shape{N, moe.top_k});
  const Tensor none;
  be.matmul_forward(a.logits, flat2(xn), w.router_w, none);
  std::vector<int32_t> chosen(size_t(N * moe.top_k));
  be.moe_router_forward(a.scores, a.weights, chosen, a.logits, moe.router_score);
  a.routing = route_tokens(chosen, moe.experts, moe.top_k);
  a.logits = Tensor{};
  a.aux_sums.assign(size_t(2 * moe.experts), 0.0);
  a.aux_tokens = double(N);
  if (moe.aux_loss_coeff != 0)
    be.moe_aux_sums(a.scores, a.routing.chosen, moe.router_score, a.aux_sums);
  moe_aux_loss_of(cfg, a);
  (void)C;
}

void moe_aux_loss_of(const TransformerConfig& cfg, MoeActs& a) {
  const MoeSpec& moe = cfg.moe;
  a.aux_loss = moe.aux_loss_coeff == 0
                   ? 0.0
                   : moe_math::aux_loss_of(a.aux_sums.data(), moe.experts, a.aux_tokens, moe.top_k,
                                           moe.aux_loss_coeff);
}

void moe_router_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                         LayerWeights& g, const Tensor& d_weights, const Tensor& xn,
                         const MoeActs& a, double aux_scale, Tensor& d_xn) {
  const auto [N, C] = rows_of(xn, "moe_router_backward");
  const MoeSpec& moe = cfg.moe;
  Tensor d_logits = a.temp(be, a.scores.shape);
  const double scale = aux_scale * moe.aux_loss_coeff;
  const std::vector<double> aux =
      moe_math::aux_grad(a.aux_sums.data(), moe.experts, a.aux_tokens, moe.top_k, scale);
  be.moe_router_backward_aux(d_logits, d_weights, a.scores, a.weights, a.routing.chosen,
                             moe.router_score,
                             scale != 0 ? std::span<const double>(aux) : std::span<const double>());
  Tensor d_router_in = a.temp(be, Shape{N, C});
  Tensor no_bias;
  be.matmul_backward(d_router_in, g.router_w, no_bias, d_logits, flat2(xn), w.router_w);
  Tensor dx = flat2(d_xn);
  be.residual_backward(dx, d_router_in);
}

void moe_permute_forward(Backend& be, const Tensor& xn, const MoeRouting& r, Tensor& permuted) {
  be.gather_rows(permuted, flat2(xn), r.source);
}

void moe_permute_backward(Backend& be, const Tensor& d_permuted, const MoeRouting& r,
                          Tensor& d_xn) {
  Tensor dx = flat2(d_xn);
  const Tensor ones;
  be.moe_combine_forward(dx, d_permuted, ones, r.slots);
}

void moe_experts_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                         const Tensor& in, std::span<const int64_t> counts, MoeActs& a,
                         Tensor& out) {
  const auto [M, C] = rows_of(in, "moe_experts_forward");
  if (counts.size() != w.expert_fc1_w.size() || sum(counts) != M)
    throw std::invalid_argument("moe_experts_forward: " + std::to_string(M) + " rows for " +
                                std::to_string(w.expert_fc1_w.size()) +
                                " held experts whose counts sum to " + std::to_string(sum(counts)));
  const int64_t F = expert_width(w), F1 = cfg.fc1_rows(int(F));
  ensure(be, a, a.fc1_out, Shape{M, F1});
  ensure(be, a, a.act_out, Shape{M, F});
  a.local_counts.assign(counts.begin(), counts.end());
  const Tensor x = flat2(in), none;
  Tensor y = flat2(out);
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    Tensor fc1 = a.fc1_out.rows(row, row + n), act = a.act_out.rows(row, row + n);
    Tensor ye = y.rows(row, row + n);
    be.matmul_forward(fc1, x.rows(row, row + n), w.expert_fc1_w[e], none);
    if (cfg.activation == Activation::swiglu)
      be.swiglu_forward(act, fc1);
    else
      be.gelu_forward(act, fc1);
    be.matmul_forward(ye, act, w.expert_fc2_w[e], none);
    row += n;
  }
  (void)C;
}

void moe_experts_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                          LayerWeights& g, const Tensor& dout, const Tensor& in,
                          std::span<const int64_t> counts, const MoeActs& a, Tensor& d_in) {
  const auto [M, C] = rows_of(in, "moe_experts_backward");
  if (counts.size() != w.expert_fc1_w.size() || sum(counts) != M)
    throw std::invalid_argument("moe_experts_backward: counts do not match the rows");
  const int64_t F = expert_width(w), F1 = cfg.fc1_rows(int(F));
  Tensor d_act = a.temp(be, Shape{M, F}), d_fc1 = a.temp(be, Shape{M, F1});
  const Tensor x = flat2(in), g_out = flat2(dout);
  Tensor dx = flat2(d_in), no_bias;
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    Tensor da = d_act.rows(row, row + n), df = d_fc1.rows(row, row + n),
           dxe = dx.rows(row, row + n);
    be.matmul_backward(da, g.expert_fc2_w[e], no_bias, g_out.rows(row, row + n),
                       a.act_out.rows(row, row + n), w.expert_fc2_w[e]);
    if (cfg.activation == Activation::swiglu)
      be.swiglu_backward(df, da, a.fc1_out.rows(row, row + n));
    else
      be.gelu_backward(df, da, a.fc1_out.rows(row, row + n));
    be.matmul_backward(dxe, g.expert_fc1_w[e], no_bias, df, x.rows(row, row + n),
                       w.expert_fc1_w[e]);
    row += n;
  }
  (void)C;
}

void moe_combine_forward(Backend& be, const Tensor& expert_rows, const MoeActs& a, Tensor& y) {
  Tensor out = flat2(y);
  be.moe_combine_forward(out, flat2(expert_rows), a.weights, a.routing.slots);
}

void moe_combine_backward(Backend& be, const Tensor& dy, const MoeActs& a, Tensor& d_expert_rows,
                          Tensor& d_weights) {
  Tensor dr = flat2(d_expert_rows);
  be.moe_combine_backward(dr, d_weights, flat2(dy), a.combined_in, a.weights, a.routing.slots);
}

void moe_shared_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                        const Tensor& xn, MoeActs& a, Tensor& y) {
  if (!w.shared_fc1_w.defined()) return;
  const auto [N, C] = rows_of(xn, "moe_shared_forward");
  const int64_t F = w.shared_fc2_w.dim(1);
  ensure(be, a, a.shared_fc1_out, Shape{N, cfg.fc1_rows(int(F))});
  ensure(be, a, a.shared_act_out, Shape{N, F});
  const Tensor none;
  be.matmul_forward(a.shared_fc1_out, flat2(xn), w.shared_fc1_w, none);
  if (cfg.activation == Activation::swiglu)
    be.swiglu_forward(a.shared_act_out, a.shared_fc1_out);
  else
    be.gelu_forward(a.shared_act_out, a.shared_fc1_out);
  Tensor out = a.temp(be, Shape{N, C}), yy = flat2(y);
  be.matmul_forward(out, a.shared_act_out, w.shared_fc2_w, none);
  be.residual_forward(yy, yy, out);
}

void moe_shared_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                         LayerWeights& g, const Tensor& dy, const Tensor& xn, const MoeActs& a,
                         Tensor& d_xn) {
  if (!w.shared_fc1_w.defined()) return;
  const auto [N, C] = rows_of(xn, "moe_shared_backward");
  const int64_t F = w.shared_fc2_w.dim(1);
  Tensor d_act = a.temp(be, Shape{N, F}), d_fc1 = a.temp(be, Shape{N, cfg.fc1_rows(int(F))});
  Tensor d_in = a.temp(be, Shape{N, C}), no_bias;
  be.matmul_backward(d_act, g.shared_fc2_w, no_bias, flat2(dy), a.shared_act_out, w.shared_fc2_w);
  if (cfg.activation == Activation::swiglu)
    be.swiglu_backward(d_fc1, d_act, a.shared_fc1_out);
  else
    be.gelu_backward(d_fc1, d_act, a.shared_fc1_out);
  be.matmul_backward(d_in, g.shared_fc1_w, no_bias, d_fc1, flat2(xn), w.shared_fc1_w);
  Tensor dx = flat2(d_xn);
  be.residual_backward(dx, d_in);
}

void moe_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w, const Tensor& xn,
                 Tensor& y, MoeActs& a) {
  const auto [N, C] = rows_of(xn, "moe_forward");
  if (int(w.expert_fc1_w.size()) != cfg.moe.experts)
    throw std::logic_error(
        "moe_forward: runs a layer whose rank holds every expert; this one "
        "holds " +
        std::to_string(w.expert_fc1_w.size()) + " of " + std::to_string(cfg.moe.experts));
  moe_router_forward(be, cfg, w, xn, a);
  const int64_t M = N * cfg.moe.top_k;
  ensure(be, a, a.expert_in, Shape{M, C});
  ensure(be, a, a.expert_out, Shape{M, C});
  moe_permute_forward(be, xn, a.routing, a.expert_in);
  moe_experts_forward(be, cfg, w, a.expert_in, a.routing.counts, a, a.expert_out);
  a.combined_in = a.expert_out;
  moe_combine_forward(be, a.combined_in, a, y);
  moe_shared_forward(be, cfg, w, xn, a, y);
}

void moe_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w, LayerWeights& g,
                  const Tensor& dy, const Tensor& xn, const MoeActs& a, double aux_scale,
                  Tensor& d_xn) {
  const auto [N, C] = rows_of(xn, "moe_backward");
  const int64_t M = N * cfg.moe.top_k;
  Tensor d_rows = a.temp(be, Shape{M, C}), d_in = a.temp(be, Shape{M, C});
  Tensor d_weights = a.temp(be, a.weights.shape);
  moe_combine_backward(be, dy, a, d_rows, d_weights);
  moe_experts_backward(be, cfg, w, g, d_rows, a.expert_in, a.routing.counts, a, d_in);
  moe_permute_backward(be, d_in, a.routing, d_xn);
  moe_router_backward(be, cfg, w, g, d_weights, xn, a, aux_scale, d_xn);
  moe_shared_backward(be, cfg, w, g, dy, xn, a, d_xn);
}

}  // namespace stratagem
