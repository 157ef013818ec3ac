// The MoE FFN's work, bytes and parameters on one rank (see stratagem/workload_moe.hpp).
#include "stratagem/workload_moe.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace stratagem {

namespace {
int ffn_gemm_width(const ModelSpec& m) {
  return m.activation == Activation::swiglu ? 2 : 1;
}
// The tokens of a rank's share of the stream: the sequence shard under sequence parallelism.
int64_t stream_tokens(const ModelSpec& m, const LayerStrategy& s, int samples) {
  const int64_t T = int64_t(samples) * m.seq_len;
  return s.sequence_parallel ? T / s.tp : T;
}
}  // namespace

MoeShape moe_shape(const ModelSpec& m, const LayerStrategy& s, int samples, double load) {
  MoeShape x;
  const int64_t T = int64_t(samples) * m.seq_len;
  x.tokens = T / s.tp;
  x.copies = x.tokens * m.moe.top_k;
  x.local_experts = m.moe.experts / s.ep;
  // Balanced: the etp x ep ranks of an expert-parallel replica send C copies each to its
  // experts; the busiest rank's experts take `load` times that.
  const double mean = double(s.etp) * s.ep * double(x.copies) / m.moe.experts;
  x.expert_rows = int64_t(std::ceil(mean * std::max(1.0, load)));
  x.expert_width = m.moe.expert_ffn_hidden / s.etp;
  x.shared_width = int64_t(m.moe.shared_experts) * m.moe.expert_ffn_hidden / s.tp;
  return x;
}

const BlockWork& MoeWork::part(Block b) const {
  switch (b) {
    case Block::router:
      return router;
    case Block::experts:
      return experts;
    case Block::combine:
      return combine;
    default:
      throw std::logic_error("MoeWork: only the router, experts and combine parts");
  }
}

MoeWork moe_forward_work(const ModelSpec& m, const LayerStrategy& s, int samples, double load) {
  const MoeShape x = moe_shape(m, s, samples, load);
  const int64_t T = int64_t(samples) * m.seq_len, Tn = stream_tokens(m, s, samples);
  const int64_t h = m.hidden, E = m.moe.experts;
  const int w = ffn_gemm_width(m);
  const double e = 2;
  MoeWork out;
  BlockWork& r = out.router;
  r.elementwise_bytes += e * Tn * h * 2;  // norm read + write
  r.kernels += 1;
  r.add({x.tokens, E, h});  // router logits
  // Scores (softmax or sigmoid) and top-k over fp32 logits; then the permutation reads the
  // tokens and writes their C copies grouped by expert.
  r.elementwise_bytes += 4.0 * x.tokens * E * 3 + e * h * double(x.tokens + x.copies);
  r.kernels += 3;
  if (x.shared_width > 0) {
    r.add({T, w * x.shared_width, h});  // shared experts' fc1 (gate and up under SwiGLU)
    r.add({T, h, x.shared_width});      // their fc2
    r.elementwise_bytes += e * T * x.shared_width * (w + 1);
    r.kernels += 1;
  }
  BlockWork& g = out.experts;
  const int64_t n = x.local_experts;
  g.add({x.expert_rows, w * x.expert_width, h, n});  // grouped fc1 over the local experts
  g.add({x.expert_rows, h, x.expert_width, n});      // grouped fc2
  g.elementwise_bytes += e * double(x.expert_rows) * n * x.expert_width * (w + 1);
  g.kernels += 1;
  BlockWork& c = out.combine;
  // Un-permute the expert outputs and sum each token's top_k weighted by its scores, then the
  // residual (read 2, write 1) and its dropout.
  c.elementwise_bytes += e * h * double(x.copies + x.tokens) + e * Tn * h * 3;
  c.kernels += 2;
  return out;
}

MoeWork moe_backward_work(const ModelSpec& m, const LayerStrategy& s, int samples, double load) {
  const MoeWork f = moe_forward_work(m, s, samples, load);
  return {backward_of(f.router), backward_of(f.experts), backward_of(f.combine)};
}

int64_t moe_dispatch_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt) {
  return moe_shape(m, s, samples).copies * m.hidden * dtype_bytes(dt);
}

int64_t moe_expert_tp_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt) {
  return s.etp * moe_dispatch_bytes(m, s, samples, dt);
}

int64_t moe_aux_sums_bytes(const ModelSpec& m, const LayerStrategy& s) {
  if (s.tp == 1 || m.moe.aux_loss_coeff == 0) return 0;
  return 2 * int64_t(m.moe.experts) * int64_t(sizeof(double));
}

int64_t moe_router_parameters(const ModelSpec& m) {
  const int64_t E = m.moe.experts;
  // DeepSeek-V3's sigmoid router adds a per-expert bias for its auxiliary-loss-free balancing.
  return int64_t(m.hidden) * E + (m.moe.router_score == RouterScore::sigmoid ? E : 0);
}

int64_t moe_dense_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s) {
  const int64_t h = m.hidden;
  const int w = ffn_gemm_width(m);
  int64_t p = replicated_block_parameters(m, Block::mlp);  // the norm
  p += moe_router_parameters(m);
  const int64_t fs = int64_t(m.moe.shared_experts) * m.moe.expert_ffn_hidden;
  if (fs > 0) {
    p += (w + 1) * h * fs / s.tp;
    if (m.bias) p += w * fs / s.tp + h;
  }
  return p;
}

int64_t moe_expert_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s) {
  const int64_t h = m.hidden, f = m.moe.expert_ffn_hidden / s.etp;
  const int w = ffn_gemm_width(m);
  int64_t one = (w + 1) * h * f;
  if (m.bias) one += w * f + h;
  return int64_t(m.moe.experts / s.ep) * one;
}

LayerStrategy expert_strategy(const LayerStrategy& s) {
  LayerStrategy x = s;
  x.dp = expert_dp(s);
  x.tp = 1;
  x.cp = 1;
  x.sequence_parallel = false;
  return x;
}

int64_t moe_kept_activation_bytes(const ModelSpec& m, const LayerStrategy& s, int samples,
                                  Recompute rc, Dtype dt, double load) {
  if (rc == Recompute::full) return 0;  // the layer input is kept by the attention block
  const MoeShape x = moe_shape(m, s, samples, load);
  const int64_t T = int64_t(samples) * m.seq_len, Tn = stream_tokens(m, s, samples);
  const int64_t h = m.hidden, E = m.moe.experts, e = dtype_bytes(dt);
  const int w = ffn_gemm_width(m);
  int64_t b = 0;
  b += e * Tn * h;                                       // norm input
  b += e * Tn * h;                                       // router and shared experts' input
  b += 4 * x.tokens * E;                                 // fp32 router scores, for their backward
  b += 12 * x.copies;                                    // top-k indices (int64) and weights (fp32)
  const int64_t rows = x.expert_rows * x.local_experts;  // copies the rank's experts take
  b += e * rows * h;                                     // permuted copies: the experts' fc1 input
  b += e * rows * w * x.expert_width;                    // fc1 output(s): activation input
  b += e * rows * x.expert_width;                        // activation output: fc2 input
  b += e * x.copies * h;                                 // expert outputs, for the scores' gradient
  if (x.shared_width > 0) b += e * T * (w + 1) * x.shared_width;
  if (m.dropout) b += Tn * h;                         // dropout mask
  b += 4 * Tn * (m.norm == Norm::layernorm ? 2 : 1);  // norm statistics
  return b;
}

int64_t moe_expert_workspace_bytes(const ModelSpec& m, const LayerStrategy& s, int samples,
                                   Dtype dt, double load) {
  const MoeShape x = moe_shape(m, s, samples, load);
  const int64_t e = dtype_bytes(dt), h = m.hidden, T = int64_t(samples) * m.seq_len;
  const int w = ffn_gemm_width(m);
  // The rows the rank's experts take (gathered over expert_tp), and of them a member's.
  const int64_t rows = x.expert_rows * x.local_experts, member_rows = rows / s.etp;
  // The experts' backward: their output's gradient rows, their input's, d_fc1 and d_act. Every
  // all-to-all holds no more (its send and receive: the rank's copies, at most its rows, and
  // the rows).
  int64_t b = e * rows * (2 * h + (w + 1) * x.expert_width);
  // At etp > 1 the all-gather of the output's gradient: the members' rows, their gathered
  // copy, and the member's own.
  if (s.etp > 1) b = std::max(b, e * (2 * rows + member_rows) * h);
  // The router's backward: the copies' gradient beside the shared experts' backward over the
  // whole stream (d_fc1, d_act and their input's gradient), or the router's input gradient.
  const int64_t shared = x.shared_width > 0 ? T * ((w + 1) * x.shared_width + h) : x.tokens * h;
  b = std::max(b, e * (x.copies * h + shared));
  // Beside each: the combine weights' gradient, held from the combine's backward to the
  // router's.
  return b + e * x.copies;
}

int64_t moe_layer_workspace_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt,
                                  double load, bool pipelined) {
  const int64_t T = int64_t(samples) * m.seq_len, e = dtype_bytes(dt);
  const int w = ffn_gemm_width(m);
  // The dense FFN's gradients (d_fc1, d_act) leave; the expert path's come in.
  const int64_t b = layer_workspace_bytes(m, s, samples, dt, pipelined) -
                    e * T * (w + 1) * int64_t(m.ffn_hidden) / s.tp;
  return std::max<int64_t>(b, 0) + moe_expert_workspace_bytes(m, s, samples, dt, load);
}

int64_t layer_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s, int layer) {
  if (!m.is_moe_layer(layer)) return layer_parameters_per_rank(m, s.tp);
  return block_parameters_per_rank(m, s.tp, Block::attention) +
         moe_dense_parameters_per_rank(m, s) + moe_expert_parameters_per_rank(m, s);
}

int64_t dp_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s, int layer) {
  return layer_parameters_per_rank(m, s, layer) - expert_dp_parameters_per_rank(m, s, layer);
}

int64_t expert_dp_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s, int layer) {
  if (!m.is_moe_layer(layer) || s.ep * s.etp == 1) return 0;
  return moe_expert_parameters_per_rank(m, s);
}

}  // namespace stratagem
