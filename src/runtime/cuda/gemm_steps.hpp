// The CUDA backend's GEMM-based ops as sequences of steps (column-major GEMMs and the kernels
// between them), written once over an `Ops` type. CudaBackend runs them with cuBLASLt and its
// kernels; test/unit/test_gemm_steps.cpp runs them with naive host loops of the same
// semantics and compares with the CPU backend, so the operand layouts, strides and batch
// shapes (the easiest things to get wrong here) are checked in every CI run without a GPU.
// Plain C++: no CUDA header.
//
// Ops provides:
//   gemm(m, n, k, a, b, c, ldc, stride_c, batch, alpha, beta, bias)   see GemmOperand
//   qkv_permute(qkv, q, k, v, B, T, NH, KV, hd, to_heads)            kernels.hpp
//   heads_permute(heads, out, B, T, NH, hd, to_heads)
//   causal_softmax(s, lse, rows, T), causal_probs(s, lse, rows, T)
//   attention_d(d, dout, out, B, T, NH, hd), softmax_dscore(dp, p, d, rows, T)
//   column_sums(out, in, N, C)
//   float* scratch(int64_t floats)    (valid until the op returns)
#pragma once
#include <cmath>
#include <cstdint>

namespace stratagem::cuda {

// One GEMM operand as stored, column-major: `rows x cols` with leading dimension `ld`, used
// transposed or not, and `stride` elements between consecutive matrices of a batch.
struct GemmOperand {
  const float* data;
  bool transposed;
  int64_t ld, stride, rows, cols;
};

// A row-major tensor (r, c) is, column-major, the (c x r) matrix with ld c: every product
// below is written for its transpose. Shapes as in backend.hpp.

// out (N,OC) = inp (N,C) @ W^T + bias:  out^T (OC x N) = op_T(W stored C x OC) @ inp^T.
template <class Ops>
void matmul_forward_steps(Ops& ops, int64_t N, int64_t C, int64_t OC, const float* inp,
                          const float* weight, const float* bias, float* out) {
  ops.gemm(OC, N, C, GemmOperand{weight, true, C, 0, C, OC}, GemmOperand{inp, false, C, 0, C, N},
           out, OC, 0, 1, 1.0f, 0.0f, bias);
}

// dinp (N,C) = dout @ W (when dinp), dW (OC,C) += dout^T @ inp (when dweight), dbias += column
// sums of dout (when dbias).
template <class Ops>
void matmul_backward_steps(Ops& ops, int64_t N, int64_t C, int64_t OC, const float* dout,
                           const float* inp, const float* weight, float* dinp, float* dweight,
                           float* dbias) {
  // dinp^T (C x N) = W stored (C x OC) @ dout^T stored (OC x N).
  if (dinp)
    ops.gemm(C, N, OC, GemmOperand{weight, false, C, 0, C, OC},
             GemmOperand{dout, false, OC, 0, OC, N}, dinp, C, 0, 1, 1.0f, 0.0f, nullptr);
  // dW^T (C x OC) += inp^T stored (C x N) @ op_T(dout^T stored OC x N).
  if (dweight)
    ops.gemm(C, OC, N, GemmOperand{inp, false, C, 0, C, N}, GemmOperand{dout, true, OC, 0, OC, N},
             dweight, C, 0, 1, 1.0f, 1.0f, nullptr);
  if (dbias) ops.column_sums(dbias, dout, N, OC);
}

// Attention (see cuda_attention.cpp for the algebra). Buffers: q (B,NH,T,hd), k and v
// (B,KV,T,hd), one (b, kv head) per batch entry, its `group` query heads consecutive rows.
struct AttentionShape {
  int64_t B, T, NH, KV, hd;
  int64_t group() const { return NH / KV; }
  int64_t batch() const { return B * KV; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hd)); }
  // (group*T, hd) row-major per batch entry: column-major hd x gT.
  GemmOperand q_like(const float* p, bool t = false) const {
    return {p, t, hd, group() * T * hd, hd, group() * T};
  }
  // (T, hd) row-major: hd x T.
  GemmOperand kv_like(const float* p, bool t = false) const { return {p, t, hd, T * hd, hd, T}; }
  // (group*T, T) row-major: T x gT.
  GemmOperand scores_like(const float* p, bool t = false) const {
    return {p, t, T, group() * T * T, T, group() * T};
  }
};

// out (B,T,NH*hd), lse (B,NH,T); s (B,NH,T,T) receives the probabilities.
template <class Ops>
void attention_forward_steps(Ops& ops, const AttentionShape& a, float* qkv, float* s, float* lse,
                             float* out) {
  const int64_t B = a.B, T = a.T, NH = a.NH, KV = a.KV, hd = a.hd, gT = a.group() * T;
  float* q = ops.scratch(B * NH * T * hd);
  float* k = ops.scratch(B * KV * T * hd);
  float* v = ops.scratch(B * KV * T * hd);
  float* y = ops.scratch(B * NH * T * hd);
  ops.qkv_permute(qkv, q, k, v, B, T, NH, KV, hd, true);
  // S^T (T x gT) = scale * op_T(K stored hd x T) @ Q stored (hd x gT).
  ops.gemm(T, gT, hd, a.kv_like(k, true), a.q_like(q), s, T, gT * T, a.batch(), a.scale(), 0.0f,
           nullptr);
  ops.causal_softmax(s, lse, B * NH * T, T);
  // Y^T (hd x gT) = V stored (hd x T) @ P stored (T x gT).
  ops.gemm(hd, gT, T, a.kv_like(v), a.scores_like(s), y, hd, gT * hd, a.batch(), 1.0f, 0.0f,
           nullptr);
  ops.heads_permute(y, out, B, T, NH, hd, false);
}

// dqkv (B,T,W) overwritten. `p` holds the probabilities, or nullptr: they are recomputed
// from qkv and lse.
template <class Ops>
void attention_backward_steps(Ops& ops, const AttentionShape& a, float* qkv, const float* p,
                              const float* lse, float* dout, const float* out, float* dqkv) {
  const int64_t B = a.B, T = a.T, NH = a.NH, KV = a.KV, hd = a.hd, gT = a.group() * T;
  float* q = ops.scratch(B * NH * T * hd);
  float* k = ops.scratch(B * KV * T * hd);
  float* v = ops.scratch(B * KV * T * hd);
  float* dy = ops.scratch(B * NH * T * hd);
  float* dsum = ops.scratch(B * NH * T);
  float* ds = ops.scratch(B * NH * T * T);
  float* dq = ops.scratch(B * NH * T * hd);
  float* dk = ops.scratch(B * KV * T * hd);
  float* dv = ops.scratch(B * KV * T * hd);
  ops.qkv_permute(qkv, q, k, v, B, T, NH, KV, hd, true);
  ops.heads_permute(dy, dout, B, T, NH, hd, true);
  ops.attention_d(dsum, dout, out, B, T, NH, hd);
  if (!p) {  // selective recompute: P = exp(scale * q k^T - lse)
    float* rebuilt = ops.scratch(B * NH * T * T);
    ops.gemm(T, gT, hd, a.kv_like(k, true), a.q_like(q), rebuilt, T, gT * T, a.batch(), a.scale(),
             0.0f, nullptr);
    ops.causal_probs(rebuilt, lse, B * NH * T, T);
    p = rebuilt;
  }
  // dP^T (T x gT) = op_T(V stored hd x T) @ dY stored (hd x gT); then dS in place.
  ops.gemm(T, gT, hd, a.kv_like(v, true), a.q_like(dy), ds, T, gT * T, a.batch(), 1.0f, 0.0f,
           nullptr);
  ops.softmax_dscore(ds, p, dsum, B * NH * T, T);
  // dQ^T (hd x gT) = scale * K stored (hd x T) @ dS stored (T x gT).
  ops.gemm(hd, gT, T, a.kv_like(k), a.scores_like(ds), dq, hd, gT * hd, a.batch(), a.scale(), 0.0f,
           nullptr);
  // dK^T (hd x T) = scale * Q stored (hd x gT) @ op_T(dS stored T x gT): the group's heads sum
  // inside the GEMM's reduction.
  ops.gemm(hd, T, gT, a.q_like(q), a.scores_like(ds, true), dk, hd, T * hd, a.batch(), a.scale(),
           0.0f, nullptr);
  // dV^T (hd x T) = dY stored (hd x gT) @ op_T(P stored T x gT).
  ops.gemm(hd, T, gT, a.q_like(dy), a.scores_like(p, true), dv, hd, T * hd, a.batch(), 1.0f, 0.0f,
           nullptr);
  ops.qkv_permute(dqkv, dq, dk, dv, B, T, NH, KV, hd, false);
}

}  // namespace stratagem::cuda
