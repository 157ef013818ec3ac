// Multi-head Latent Attention's work, from DeepSeek-V3's modeling_deepseek.py
// (DeepseekV3Attention.forward) and Megatron-Core's multi_latent_attention.py:
//   q = q_b_proj(rmsnorm(q_a_proj(x)))            (or q_proj(x) when q_lora_rank is 0)
//   [c, k_rope] = kv_a_proj_with_mqa(x)           c: kv_lora_rank, k_rope: one RoPE key
//   [k_nope, v] = kv_b_proj(rmsnorm(c))           per head: qk_nope_head_dim, v_head_dim
//   k = [k_nope, rope(k_rope) broadcast to heads], q = [q_nope, rope(q_rope)]
//   o_proj(softmax(q k^T) v)
// Counted as the multi-head rules of workload.cpp count: attention over all s x s positions,
// Megatron's saved tensors, 2 bytes per element of the model's dtype.
#include "src/core/workload_mla.hpp"

#include "stratagem/error.hpp"

namespace stratagem::mla {
namespace {
struct Shape {
  int64_t T, b, s, h, a, q, c, dn, dr, dv;
  int64_t qk() const { return dn + dr; }
  int64_t q_in() const { return q > 0 ? q : h; }  // the query up-projection's input width
};

Shape shape_of(const ModelSpec& m, int samples) {
  Shape x;
  x.b = samples;
  x.s = m.seq_len;
  x.T = int64_t(samples) * m.seq_len;
  x.h = m.hidden;
  x.a = m.heads;
  x.q = m.mla.q_lora_rank;
  x.c = m.mla.kv_lora_rank;
  x.dn = m.mla.qk_nope_head_dim;
  x.dr = m.mla.qk_rope_head_dim;
  x.dv = m.mla.v_head_dim;
  return x;
}
}  // namespace

int64_t gemm_weights(const ModelSpec& m) {
  const Shape x = shape_of(m, 1);
  const int64_t query = (x.q > 0 ? x.h * x.q : 0) + x.q_in() * x.a * x.qk();
  const int64_t key_value = x.h * (x.c + x.dr) + x.c * x.a * (x.dn + x.dv);
  return query + key_value + x.a * x.dv * x.h;
}

double core_flops_per_token(const ModelSpec& m) {
  const Shape x = shape_of(m, 1);
  return 2.0 * x.s * x.a * double(x.qk() + x.dv);
}

void check_supported(const ModelSpec& m, const LayerStrategy& s) {
  if (s.tp > 1)
    throw InputError("model " + m.name +
                     ": MLA attention with tp > 1 is not supported yet (issue #26): give --tp 1");
}

BlockWork core_work(const ModelSpec& m, const LayerStrategy& st, int samples, bool flash) {
  check_supported(m, st);
  const Shape x = shape_of(m, samples);
  const double e = 2;
  BlockWork w;
  w.attention_flops = double(x.b) * x.s * core_flops_per_token(m);
  w.flash_attention = flash;
  if (flash) {
    // Read Q, K (every head's, the RoPE key broadcast) and V; write the output.
    w.kernels += 1;
    w.elementwise_bytes += e * x.T * x.a * (2 * x.qk() + x.dv) + e * x.T * x.a * x.dv;
  } else {
    w.kernels += 4;  // QK^T, scale+mask+softmax, dropout, AV
    const double scores = double(x.b) * x.a * x.s * x.s;
    w.elementwise_bytes += scores * e * 4;  // softmax read/write, dropout read/write
  }
  return w;
}

BlockWork forward_work(const ModelSpec& m, const LayerStrategy& st, int samples, bool flash) {
  check_supported(m, st);
  const Shape x = shape_of(m, samples);
  const double e = 2;
  BlockWork w;
  if (x.q > 0) w.add({x.T, x.q, x.h});     // q_a_proj
  w.add({x.T, x.a * x.qk(), x.q_in()});    // q_b_proj (q_proj)
  w.add({x.T, x.c + x.dr, x.h});           // kv_a_proj_with_mqa
  w.add({x.T, x.a * (x.dn + x.dv), x.c});  // kv_b_proj
  const BlockWork core = core_work(m, st, samples, flash);
  w.attention_flops = core.attention_flops;
  w.flash_attention = core.flash_attention;
  w.elementwise_bytes += core.elementwise_bytes;
  w.kernels += core.kernels;
  w.add({x.T, x.h, x.a * x.dv});                          // o_proj
  w.elementwise_bytes += e * x.T * x.h * 2;               // input norm read + write
  w.elementwise_bytes += e * x.T * (x.q + x.c) * 2;       // the latents' norms
  w.elementwise_bytes += e * x.T * (x.a + 1) * x.dr * 2;  // RoPE on the query and shared key
  w.elementwise_bytes += e * x.T * x.a * x.qk() * 2;      // the key assembled for every head
  w.elementwise_bytes += e * x.T * x.h * 3;               // dropout + residual: read 2, write 1
  w.kernels += 2 + (x.q > 0 ? 2 : 1) + 2;
  return w;
}

int64_t saved_activation_bytes(const ModelSpec& m, const LayerStrategy& st, int samples,
                               Recompute rc, bool flash, Dtype dt) {
  check_supported(m, st);
  const Shape x = shape_of(m, samples);
  const int64_t e = dtype_bytes(dt);
  const int64_t mask = m.dropout ? 1 : 0;
  int64_t bytes = 0;
  bytes += e * x.T * x.h;                           // norm input
  bytes += e * x.T * x.h;                           // the down-projections' input
  if (x.q > 0) bytes += 2 * e * x.T * x.q;          // the query latent: norm input, q_b input
  bytes += e * x.T * (x.c + x.dr) + e * x.T * x.c;  // KV latent and RoPE key; kv_b input
  bytes += 2 * e * x.T * x.a * x.qk();              // Q and K, for QK^T backward
  bytes += e * x.T * x.a * x.dv;                    // V, for AV backward
  bytes += e * x.T * x.a * x.dv;                    // attention output = o_proj input
  bytes += mask * x.T * x.h;                        // dropout mask after o_proj
  if (flash) {
    bytes += 4 * x.b * x.a * x.s;  // softmax log-sum-exp, fp32
  } else if (rc == Recompute::none) {
    const int64_t scores = x.b * x.a * x.s * x.s;
    bytes += e * scores;                 // softmax output
    bytes += mask * scores;              // attention dropout mask
    if (m.dropout) bytes += e * scores;  // dropout output, input of AV
  }
  return bytes;
}

int64_t workspace_bytes(const ModelSpec& m, const LayerStrategy& st, int samples, Dtype dt) {
  check_supported(m, st);
  const Shape x = shape_of(m, samples);
  // The gradients of q_a, q_b, kv_a and kv_b's outputs and of the attention output.
  return dtype_bytes(dt) * x.T *
         (x.q + x.a * x.qk() + x.c + x.dr + x.a * (x.dn + x.dv) + x.a * x.dv);
}

int64_t block_parameters_per_rank(const ModelSpec& m, int tp) {
  if (tp > 1)
    throw InputError("model " + m.name +
                     ": MLA attention with tp > 1 is not supported yet (issue #26): give --tp 1");
  return m.attention_parameters();
}

}  // namespace stratagem::mla
