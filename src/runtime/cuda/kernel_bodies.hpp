// The per-index bodies of the CUDA backend's elementwise kernels: what thread `i` of the
// grid-stride loop does. The .cu kernels call them; the unit tests call them in plain loops
// on CPU (test_gemm_steps, test_kernel_bodies), so the indexing of these kernels is tested in
// every CI run. Shapes as in kernels.hpp. C++17, __host__ __device__ under nvcc.
#pragma once
#include <cstdint>

#include "stratagem/kernel_math.hpp"

namespace stratagem::cuda::body {

// qkv (B,T,W) element i <-> its place in q (B,NH,T,hd), k or v (B,KV,T,hd).
STRATAGEM_HD void qkv_permute(int64_t i, float* qkv, float* q, float* k, float* v, int64_t T,
                              int64_t NH, int64_t KV, int64_t hd, bool to_heads) {
  const int64_t W = (NH + 2 * KV) * hd;
  const int64_t bt = i / W, col = i % W, b = bt / T, t = bt % T;
  const int64_t head = col / hd, e = col % hd;
  float* dst = head < NH        ? q + ((b * NH + head) * T + t) * hd + e
               : head < NH + KV ? k + ((b * KV + head - NH) * T + t) * hd + e
                                : v + ((b * KV + head - NH - KV) * T + t) * hd + e;
  if (to_heads)
    *dst = qkv[i];
  else
    qkv[i] = *dst;
}

// out (B,T,NH*hd) element i <-> heads (B,NH,T,hd).
STRATAGEM_HD void heads_permute(int64_t i, float* heads, float* out, int64_t T, int64_t NH,
                                int64_t hd, bool to_heads) {
  const int64_t C = NH * hd;
  const int64_t bt = i / C, col = i % C, b = bt / T, t = bt % T;
  float* hp = heads + ((b * NH + col / hd) * T + t) * hd + col % hd;
  if (to_heads)
    *hp = out[i];
  else
    out[i] = *hp;
}

// Scores (rows, T), row r at position t = r % T: probabilities rebuilt below the diagonal.
STRATAGEM_HD void causal_probs(int64_t i, float* s, const float* lse, int64_t T) {
  const int64_t r = i / T, j = i % T;
  s[i] = j <= r % T ? math::prob_from_lse(s[i], lse[r]) : 0.0f;
}
STRATAGEM_HD void softmax_dscore(int64_t i, float* dp, const float* p, const float* d, int64_t T) {
  const int64_t r = i / T, j = i % T;
  dp[i] = j <= r % T ? math::softmax_dscore(p[i], dp[i], d[r]) : 0.0f;
}

// out (BT,C) element i = wte[token] (+ wpe[t]); token -1: another shard's (only wpe).
STRATAGEM_HD void embedding_forward(int64_t i, float* out, const int32_t* tokens, const float* wte,
                                    const float* wpe, int64_t T, int64_t C) {
  const int64_t bt = i / C, c = i % C;
  const int32_t tok = tokens[bt];
  const float p = wpe ? wpe[(bt % T) * C + c] : 0.0f;
  out[i] = tok < 0 ? p : (wpe ? wte[tok * C + c] + p : wte[tok * C + c]);
}

// Pair i of (BT, heads, hd/2): rotates x[i], x[i + hd/2] of one head; table (T, hd/2, 2).
STRATAGEM_HD void rope(int64_t idx, float* qkv, const float* table, int64_t T, int64_t width,
                       int64_t hd, int heads, float sign) {
  const int64_t half = hd / 2;
  const int64_t i = idx % half, h = (idx / half) % heads, bt = idx / (half * heads);
  const float* cs = table + ((bt % T) * half + i) * 2;
  float* x = qkv + bt * width + h * hd;
  math::rope_rotate(x[i], x[i + half], cs[0], sign * cs[1], &x[i], &x[i + half]);
}

// inp (N,2F) = [gate | up]; element i of out (N,F).
STRATAGEM_HD void swiglu_forward(int64_t i, float* out, const float* inp, int64_t F) {
  const int64_t r = i / F, j = i % F;
  out[i] = math::swiglu_forward(inp[r * 2 * F + j], inp[r * 2 * F + F + j]);
}
STRATAGEM_HD void swiglu_backward(int64_t i, float* dinp, const float* dout, const float* inp,
                                  int64_t F) {
  const int64_t r = i / F, j = i % F;
  math::swiglu_backward(inp[r * 2 * F + j], inp[r * 2 * F + F + j], dout[i], &dinp[r * 2 * F + j],
                        &dinp[r * 2 * F + F + j]);
}

// out (rows, cols) row-major, element i += bias[column].
STRATAGEM_HD void add_bias(int64_t i, float* out, const float* bias, int64_t cols) {
  out[i] += bias[i % cols];
}

}  // namespace stratagem::cuda::body
