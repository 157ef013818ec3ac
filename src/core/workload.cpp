#include "stratagem/workload.hpp"

#include <algorithm>
#include <stdexcept>

#include "src/core/workload_mla.hpp"
#include "stratagem/program.hpp"

namespace stratagem {

double BlockWork::gemm_flops() const {
  double f = 0;
  for (int i = 0; i < num_gemms; ++i) f += gemms[i].flops();
  return f;
}

void BlockWork::add(Gemm g) {
  if (num_gemms == kMaxGemms) throw std::logic_error("BlockWork: too many GEMMs");
  gemms[num_gemms++] = g;
  ++kernels;
}

namespace {
// Shapes of one rank's share of a layer: T tokens, Tn tokens seen by replicated parts (norms,
// dropout, residual), which sequence parallelism splits across the tp group. Under context
// parallelism a rank holds s = seq_len / cp tokens of each sample, whose queries attend to the
// whole sequence (s_kv keys): the rank's share of the full-length attention.
struct Shape {
  int64_t T, Tn, h, s, s_kv, a, kvh, f, t, b;
  int ffn_gemm_width;  // 1 for GELU (fc1 is f wide), 2 for SwiGLU (gate and up)
};

Shape shape_of(const ModelSpec& m, const LayerStrategy& st, int samples) {
  Shape sh;
  sh.b = samples;
  sh.s = m.seq_len / st.cp;
  sh.s_kv = m.seq_len;
  sh.T = int64_t(samples) * sh.s;
  sh.t = st.tp;
  sh.Tn = st.sequence_parallel ? sh.T / st.tp : sh.T;
  sh.h = m.hidden;
  sh.a = m.heads;
  sh.kvh = m.kv_hidden();
  sh.f = m.ffn_hidden;
  sh.ffn_gemm_width = m.activation == Activation::swiglu ? 2 : 1;
  return sh;
}
}  // namespace

BlockWork attention_core_work(const ModelSpec& m, const LayerStrategy& st, int samples,
                              bool flash) {
  if (m.attention == AttentionKind::mla) return mla::core_work(m, st, samples, flash);
  Shape x = shape_of(m, st, samples);
  BlockWork w;
  const int e = 2;
  // QK^T and AV over all (s x s) positions, as Megatron counts them: 4 b s^2 h / t; a cp rank
  // takes its s / cp queries against all s keys, 1 / cp of it (the ring's and the all-gather's
  // chunk order balance the causal triangle; an all-to-all rank takes heads / cp whole).
  w.attention_flops = 4.0 * x.b * x.s * x.s_kv * x.h / x.t;
  w.flash_attention = flash;
  if (flash) {
    w.kernels += 1;
    w.elementwise_bytes += double(e) * x.T * (x.h + 2 * x.kvh) / x.t + double(e) * x.T * x.h / x.t;
  } else {
    w.kernels += 4;  // QK^T, scale+mask+softmax, dropout, AV
    const double scores = double(x.b) * (x.a / x.t) * x.s * x.s_kv;
    w.elementwise_bytes += scores * e * 4;  // softmax read/write, dropout read/write
  }
  return w;
}

BlockWork selective_recompute_work(const ModelSpec& m, const LayerStrategy& st, int samples) {
  BlockWork core = attention_core_work(m, st, samples, false);
  core.attention_flops /= 2;  // QK^T only
  return core;
}

BlockWork forward_work(const ModelSpec& m, const LayerStrategy& st, Block b, int samples,
                       bool flash) {
  Shape x = shape_of(m, st, samples);
  const double e = 2;
  BlockWork w;
  if (b == Block::attention && m.attention == AttentionKind::mla) {
    return mla::forward_work(m, st, samples, flash);
  } else if (b == Block::attention) {
    w.add({x.T, (x.h + 2 * x.kvh) / x.t, x.h});  // QKV projection
    BlockWork core = attention_core_work(m, st, samples, flash);
    w.attention_flops = core.attention_flops;
    w.flash_attention = core.flash_attention;
    w.elementwise_bytes += core.elementwise_bytes;
    w.kernels += core.kernels;
    w.add({x.T, x.h, x.h / x.t});               // output projection
    w.elementwise_bytes += e * x.Tn * x.h * 2;  // norm read + write
    w.elementwise_bytes += e * x.Tn * x.h * 3;  // dropout + residual: read 2, write 1
    w.kernels += 2;
    if (m.position == Position::rope) {
      w.elementwise_bytes += e * x.T * (x.h + x.kvh) / x.t * 2;
      w.kernels += 1;
    }
  } else if (b == Block::mlp) {
    w.add({x.T, x.ffn_gemm_width * x.f / x.t, x.h});  // fc1 (gate+up for SwiGLU)
    w.add({x.T, x.h, x.f / x.t});                     // fc2
    w.elementwise_bytes += e * x.T * x.f / x.t * (x.ffn_gemm_width + 1);  // activation
    w.elementwise_bytes += e * x.Tn * x.h * 2 + e * x.Tn * x.h * 3;       // norm, residual
    w.kernels += 3;
  } else {
    throw std::logic_error("forward_work: only attention and mlp blocks");
  }
  return w;
}

BlockWork backward_work(const ModelSpec& m, const LayerStrategy& st, Block b, int samples,
                        bool flash) {
  return backward_of(forward_work(m, st, b, samples, flash));
}

BlockWork backward_of(const BlockWork& f) {
  BlockWork w;
  for (int i = 0; i < f.num_gemms; ++i) {
    const Gemm& g = f.gemms[i];
    w.add({g.m, g.k, g.n, g.count});  // data gradient: dY (m,n) x W^T (n,k)
    w.add({g.k, g.n, g.m, g.count});  // weight gradient: X^T (k,m) x dY (m,n)
  }
  w.attention_flops = 2 * f.attention_flops;
  w.flash_attention = f.flash_attention;
  w.elementwise_bytes = 2 * f.elementwise_bytes;
  w.kernels += 2 * (f.kernels - f.num_gemms);
  return w;
}

BlockWork input_grad_of(const BlockWork& f) {
  BlockWork w;
  for (int i = 0; i < f.num_gemms; ++i) {
    const Gemm& g = f.gemms[i];
    w.add({g.m, g.k, g.n, g.count});  // dY (m,n) x W^T (n,k), as backward_of
  }
  w.attention_flops = 2 * f.attention_flops;
  w.flash_attention = f.flash_attention;
  w.elementwise_bytes = 2 * f.elementwise_bytes;
  w.kernels += 2 * (f.kernels - f.num_gemms);
  return w;
}

BlockWork weight_grad_of(const BlockWork& f) {
  BlockWork w;
  for (int i = 0; i < f.num_gemms; ++i) {
    const Gemm& g = f.gemms[i];
    w.add({g.k, g.n, g.m, g.count});  // X^T (k,m) x dY (m,n), as backward_of
  }
  return w;
}

namespace {
// The forward GEMMs of a block whose weight gradients W computes (MLA is refused by the zb
// schedules' check: its GEMM inputs are not all among its saved tensors).
BlockWork weight_gemms(const ModelSpec& m, const LayerStrategy& s, Block b, int samples) {
  return forward_work(m, s, b, samples, /*flash_attention=*/false);
}
}  // namespace

int64_t weight_input_bytes(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                           Dtype dt) {
  if (s.recompute == Recompute::full) return 0;  // the recompute's buffers hold them (program)
  const BlockWork f = weight_gemms(m, s, b, samples);
  int64_t elems = 0;
  // Under sequence parallelism the first GEMM's saved input is a shard: W takes the gathered
  // one from B (weight_stash_bytes).
  for (int i = s.sequence_parallel && s.tp > 1 ? 1 : 0; i < f.num_gemms; ++i)
    elems += f.gemms[i].m * f.gemms[i].k * f.gemms[i].count;
  return elems * dtype_bytes(dt);
}

int64_t weight_stash_bytes(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                           Dtype dt) {
  const BlockWork f = weight_gemms(m, s, b, samples);
  int64_t elems = 0;
  for (int i = 0; i < f.num_gemms; ++i) elems += f.gemms[i].m * f.gemms[i].n * f.gemms[i].count;
  if (s.sequence_parallel && s.tp > 1 && f.num_gemms > 0)
    elems += f.gemms[0].m * f.gemms[0].k * f.gemms[0].count;
  return elems * dtype_bytes(dt);
}

int64_t kept_activation_bytes(const ModelSpec& m, const LayerStrategy& st, Block b, int samples,
                              Recompute rc, bool flash, Dtype dt) {
  int64_t bytes = saved_activation_bytes(m, st, b, samples, rc, flash, dt);
  if (rc == Recompute::full || (b != Block::attention && b != Block::mlp)) return bytes;
  const Shape x = shape_of(m, st, samples);
  bytes += 4 * x.Tn * (m.norm == Norm::layernorm ? 2 : 1);                    // norm statistics
  if (b == Block::attention && !flash) bytes += 4 * x.b * (x.a / x.t) * x.s;  // log-sum-exp
  if (b == Block::attention && m.attention == AttentionKind::mla)
    bytes += 4 * x.T * (m.mla.q_lora_rank > 0 ? 2 : 1);  // the latents' 1/rms
  return bytes;
}

int64_t recomputed_activation_bytes(const ModelSpec& m, const LayerStrategy& st, Block b,
                                    int samples, bool flash, Dtype dt) {
  if (st.recompute == Recompute::none) return 0;
  return kept_activation_bytes(m, st, b, samples, Recompute::none, flash, dt) -
         kept_activation_bytes(m, st, b, samples, st.recompute, flash, dt);
}

int64_t token_stream_bytes(const ModelSpec& m, int samples, Dtype dt, int cp) {
  return int64_t(dtype_bytes(dt)) * samples * (m.seq_len / cp) * m.hidden;
}

int64_t saved_activation_bytes(const ModelSpec& m, const LayerStrategy& st, Block b, int samples,
                               Recompute rc, bool flash, Dtype dt) {
  Shape x = shape_of(m, st, samples);
  const int64_t e = dtype_bytes(dt);
  const int64_t mask = m.dropout ? 1 : 0;  // dropout masks are one byte per element
  if (rc == Recompute::full) {
    // Only the layer input survives; the rest is rebuilt right before backward.
    return b == Block::attention ? e * x.Tn * x.h : 0;
  }
  int64_t bytes = 0;
  if (b == Block::attention && m.attention == AttentionKind::mla) {
    bytes = mla::saved_activation_bytes(m, st, samples, rc, flash, dt);
  } else if (b == Block::attention) {
    bytes += e * x.Tn * x.h;                 // norm input
    bytes += e * x.Tn * x.h;                 // QKV GEMM input (sequence-sharded under sp)
    bytes += e * x.T * (x.h + x.kvh) / x.t;  // Q and K, for QK^T backward
    bytes += e * x.T * x.kvh / x.t;          // V, for AV backward
    bytes += e * x.T * x.h / x.t;            // attention output = projection input
    // DeepSpeed-Ulysses (cp a2a): the core attends a head group over the whole sequence and
    // saves its own output, which the core's backward reads; the projection saves the output
    // after the all-to-all back. Q, K and V are the head group's (the same size as the local).
    if (st.cp > 1 && st.cp_kind == CpKind::a2a) bytes += e * x.T * x.h / x.t;
    bytes += mask * x.Tn * x.h;  // dropout mask after the projection
    if (flash) {
      bytes += 4 * x.b * (x.a / x.t) * x.s;  // softmax log-sum-exp, fp32
    } else if (rc == Recompute::none) {
      const int64_t scores = x.b * (x.a / x.t) * x.s * x.s_kv;
      bytes += e * scores;                 // softmax output
      bytes += mask * scores;              // attention dropout mask
      if (m.dropout) bytes += e * scores;  // dropout output, input of AV
    }
  } else if (b == Block::mlp) {
    bytes += e * x.Tn * x.h;                          // norm input
    bytes += e * x.Tn * x.h;                          // fc1 input
    bytes += e * x.T * x.ffn_gemm_width * x.f / x.t;  // fc1 output(s): activation input
    bytes += e * x.T * x.f / x.t;                     // activation output = fc2 input
    bytes += mask * x.Tn * x.h;                       // dropout mask
  }
  return bytes;
}

namespace {
// The token-stream tensors shared by layers and embeddings, as many as the runtime holds at
// once (src/runtime/exec/ops_comm.cpp, ops_compute.cpp).
int64_t stream_workspace(const Shape& x, const LayerStrategy& st, int64_t e, bool pipelined) {
  // The stream's value or gradient between ops (a token shard under sequence parallelism).
  int64_t bytes = e * x.Tn * x.h;
  if (st.tp > 1) {
    // Sequence parallel: the backward's two whole-sequence gathers (the output gradient and the
    // normalized input). Otherwise a block's partial sum, reduced in place.
    bytes += (st.sequence_parallel ? 2 : 1) * e * x.T * x.h;
  }
  // A fully recomputed layer's backward rebuilds the stream from its saved input beside the
  // gradient it carries.
  if (st.recompute == Recompute::full) bytes += e * x.Tn * x.h;
  // Beside a pipeline, a send and a receive in flight with the stream: they are the stream
  // tensors themselves (a send hands its tensor over, a receive becomes the next), so they
  // raise the count to three, not by two.
  if (pipelined) bytes = std::max(bytes, 3 * e * x.Tn * x.h);
  return bytes;
}
}  // namespace

int64_t layer_workspace_bytes(const ModelSpec& m, const LayerStrategy& st, int samples, Dtype dt,
                              bool pipelined) {
  Shape x = shape_of(m, st, samples);
  const int64_t e = dtype_bytes(dt);
  int64_t bytes = stream_workspace(x, st, e, pipelined);
  // d_qkv, d_attn (MLA: its projections' outputs), d_fc1 (gate and up), d_act
  if (m.attention == AttentionKind::mla)
    return bytes + mla::workspace_bytes(m, st, samples, dt) +
           e * x.T * (x.ffn_gemm_width + 1) * x.f / x.t;
  bytes += e * x.T * ((x.h + 2 * x.kvh) / x.t + x.h / x.t + (x.ffn_gemm_width + 1) * x.f / x.t);
  return bytes;
}

int64_t embedding_workspace_bytes(const ModelSpec& m, const LayerStrategy& st, int samples,
                                  Dtype dt) {
  return stream_workspace(shape_of(m, st, samples), st, dtype_bytes(dt), false);
}

int64_t staged_gradient_bytes(const LayerStrategy& s, int64_t params, Dtype dt, bool staging) {
  return staging && s.zero >= 2 && s.dp_cp() > 1 ? params * dtype_bytes(dt) : 0;
}

int64_t boundary_activation_bytes(const ModelSpec& m, const LayerStrategy& st, int samples,
                                  Dtype dt) {
  Shape x = shape_of(m, st, samples);
  return dtype_bytes(dt) * x.Tn * x.h;
}

namespace {
int64_t norm_params(const ModelSpec& m) {
  return m.norm == Norm::layernorm && m.bias ? 2LL * m.hidden : m.hidden;
}
}  // namespace

int64_t block_parameters_per_rank(const ModelSpec& m, int tp, Block b) {
  const int64_t h = m.hidden, f = m.ffn_hidden, kv = m.kv_hidden();
  const int w = m.activation == Activation::swiglu ? 2 : 1;
  if (b == Block::attention && m.attention == AttentionKind::mla)
    return mla::block_parameters_per_rank(m, tp);
  if (b == Block::attention) {
    int64_t p = (h * (h + 2 * kv) + h * h) / tp + norm_params(m);
    if (m.bias) p += (h + 2 * kv) / tp + h;
    return p;
  }
  if (b == Block::mlp) {
    int64_t p = (w + 1) * h * f / tp + norm_params(m);
    if (m.bias) p += w * f / tp + h;
    return p;
  }
  throw std::logic_error("block_parameters_per_rank: only attention and mlp blocks");
}

int64_t layer_parameters_per_rank(const ModelSpec& m, int tp) {
  return block_parameters_per_rank(m, tp, Block::attention) +
         block_parameters_per_rank(m, tp, Block::mlp);
}

int64_t replicated_block_parameters(const ModelSpec& m, Block b) {
  if (b != Block::attention && b != Block::mlp)
    throw std::logic_error("replicated_block_parameters: only attention and mlp blocks");
  return norm_params(m);
}

int64_t replicated_head_parameters(const ModelSpec& m) {
  return norm_params(m);
}

int64_t vocab_rows_per_rank(const ModelSpec& m, int tp) {
  return (int64_t(m.vocab) + tp - 1) / tp;
}

int64_t embedding_parameters_per_rank(const ModelSpec& m, int tp) {
  // Vocabulary-parallel word embedding; positions, types and the BERT norm are replicated.
  return m.embedding_parameters() - int64_t(m.vocab) * m.hidden +
         vocab_rows_per_rank(m, tp) * m.hidden;
}

int64_t head_parameters_per_rank(const ModelSpec& m, int tp) {
  int64_t p = m.head_parameters();
  if (m.arch == Arch::decoder && !m.tied_embeddings)
    p = p - int64_t(m.vocab) * m.hidden + vocab_rows_per_rank(m, tp) * m.hidden;
  return p;
}

int64_t head_compute_parameters_per_rank(const ModelSpec& m, int tp) {
  // A tied head multiplies by the word embedding (the first stage's, or the last stage's copy).
  return head_parameters_per_rank(m, tp) +
         (m.tied_embeddings ? vocab_rows_per_rank(m, tp) * m.hidden : 0);
}

double model_flops_per_iteration(const ModelSpec& m, int64_t global_batch) {
  const double h = m.hidden, s = m.seq_len, f = m.ffn_hidden, kv = m.kv_hidden();
  const double w = m.activation == Activation::swiglu ? 3 : 2;
  const bool mla = m.attention == AttentionKind::mla;
  const double attention_gemm = mla ? double(mla::gemm_weights(m)) : h * (h + 2 * kv) + h * h;
  const double attention_core = mla ? mla::core_flops_per_token(m) : 4.0 * s * h;
  const double gemm_params = attention_gemm + w * h * f;
  // Forward: 2 FLOPs per GEMM weight per token plus 4 s h for attention; backward is twice that.
  const double per_token_layer = 3.0 * (2.0 * gemm_params + attention_core);
  const double per_token_logits = 3.0 * 2.0 * double(m.vocab) * h;
  double per_token = m.layers * per_token_layer;
  if (m.moe.enabled()) {
    // Megatron's count for MoE layers (training.py num_floating_point_operations): the top_k
    // routed and the shared experts a token passes through; the router's GEMM is not counted.
    const int moe_layers = m.layers - m.moe.dense_layers;
    const double experts = m.moe.top_k + m.moe.shared_experts;
    const double moe_gemm = attention_gemm + experts * w * h * m.moe.expert_ffn_hidden;
    per_token = (m.layers - moe_layers) * per_token_layer +
                moe_layers * 3.0 * (2.0 * moe_gemm + attention_core);
  }
  return double(global_batch) * s * (per_token + per_token_logits);
}

}  // namespace stratagem
