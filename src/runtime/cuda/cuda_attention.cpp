// Causal attention with GQA as batched GEMMs plus a row softmax: simple enough to check line
// by line against the CPU backend (a flash kernel comes once a GPU run has checked this one).
// q, k, v are first gathered into head-major buffers: q (B,NH,T,hd), k and v (B,KV,T,hd).
// Query head h = kvh * group + g, so the `group` query heads of one kv head are consecutive
// (group*T, hd) rows, and every product is one strided batch of B*KV matrices:
//   S  (group*T, T)  = scale * Q K^T          Y  (group*T, hd) = P V
//   dP (group*T, T)  = dY V^T                 dS = P * (dP - D),  D = rowsum(dY * Y)
//   dQ (group*T, hd) = scale * dS K           dK (T, hd) = scale * dS^T Q   dV = P^T dY
// (dK and dV sum over the group's heads inside the GEMM's reduction, with no atomics.)
// In column-major terms each row-major (r, c) block is a (c x r) matrix; see the comments.
#include <cmath>
#include <stdexcept>
#include <string>

#include "src/runtime/cuda/cuda_backend.hpp"
#include "src/runtime/cuda/kernels.hpp"
#include "src/runtime/kernel_checks.hpp"

namespace stratagem::cuda {
namespace {
using AttnDims = checks::QkvDims;
using Op = CudaBackend::GemmOperand;
// Operands of one (b, kvh) batch entry, stored column-major.
Op q_like(const float* p, const AttnDims& d) {  // (group*T, hd) row-major: hd x gT
  return {p, false, d.hd, d.group * d.T * d.hd, d.hd, d.group * d.T};
}
Op kv_like(const float* p, const AttnDims& d) {  // (T, hd) row-major: hd x T
  return {p, false, d.hd, d.T * d.hd, d.hd, d.T};
}
Op scores_like(const float* p, const AttnDims& d) {  // (group*T, T) row-major: T x gT
  return {p, false, d.T, d.group * d.T * d.T, d.T, d.group * d.T};
}
Op t(Op o) {
  o.transposed = true;
  return o;
}
}  // namespace

void CudaBackend::attention_forward(Tensor& out, Tensor& att, Tensor& lse, const Tensor& qkv,
                                    int heads, int kv_heads) {
  const AttnDims d = checks::qkv_dims("attention_forward", qkv, heads, kv_heads);
  const int64_t B = d.B, T = d.T, hd = d.hd, NH = d.NH, KV = d.KV, gT = d.group * T;
  expect_shape(out, Shape{B, T, NH * hd}, "attention_forward", "out");
  expect_shape(lse, Shape{B, NH, T}, "attention_forward", "lse");
  if (att.defined()) expect_shape(att, Shape{B, NH, T, T}, "attention_forward", "att");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor q = scratch(Shape{B, NH, T, hd}), k = scratch(Shape{B, KV, T, hd}),
         v = scratch(Shape{B, KV, T, hd});
  launch_qkv_permute(qkv.data, q.data, k.data, v.data, B, T, NH, KV, hd, true, stream_);
  Tensor s = att.defined() ? att : scratch(Shape{B, NH, T, T});
  // S^T (T x gT) = K^T... : op_T(K stored hd x T) @ Q stored (hd x gT).
  gemm(T, gT, hd, t(kv_like(k.data, d)), q_like(q.data, d), s.data, T, gT * T, B * KV, scale, 0.0f);
  launch_causal_softmax(s.data, lse.data, B * NH * T, T, stream_);
  // Y^T (hd x gT) = V stored (hd x T) @ P stored (T x gT).
  Tensor y = scratch(Shape{B, NH, T, hd});
  gemm(hd, gT, T, kv_like(v.data, d), scores_like(s.data, d), y.data, hd, gT * hd, B * KV, 1.0f,
       0.0f);
  launch_heads_permute(y.data, out.data, B, T, NH, hd, false, stream_);
}

void CudaBackend::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out,
                                     const Tensor& qkv, const Tensor& att, const Tensor& lse,
                                     int heads, int kv_heads) {
  const AttnDims d = checks::qkv_dims("attention_backward", qkv, heads, kv_heads);
  const int64_t B = d.B, T = d.T, hd = d.hd, NH = d.NH, KV = d.KV, gT = d.group * T;
  const int64_t C = NH * hd;
  expect_shape(dqkv, qkv.shape, "attention_backward", "dqkv");
  expect_shape(dout, Shape{B, T, C}, "attention_backward", "dout");
  expect_shape(out, Shape{B, T, C}, "attention_backward", "out");
  expect_shape(lse, Shape{B, NH, T}, "attention_backward", "lse");
  if (att.defined()) expect_shape(att, Shape{B, NH, T, T}, "attention_backward", "att");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor q = scratch(Shape{B, NH, T, hd}), k = scratch(Shape{B, KV, T, hd}),
         v = scratch(Shape{B, KV, T, hd});
  launch_qkv_permute(qkv.data, q.data, k.data, v.data, B, T, NH, KV, hd, true, stream_);
  Tensor dy = scratch(Shape{B, NH, T, hd});
  launch_heads_permute(dy.data, dout.data, B, T, NH, hd, true, stream_);
  Tensor dsum = scratch(Shape{B, NH, T});
  launch_attention_d(dsum.data, dout.data, out.data, B, T, NH, hd, stream_);

  Tensor p = att;
  if (!p.defined()) {  // selective recompute: P = exp(scale * q k^T - lse)
    p = scratch(Shape{B, NH, T, T});
    gemm(T, gT, hd, t(kv_like(k.data, d)), q_like(q.data, d), p.data, T, gT * T, B * KV, scale,
         0.0f);
    launch_causal_probs(p.data, lse.data, B * NH * T, T, stream_);
  }
  // dP^T (T x gT) = op_T(V stored hd x T) @ dY stored (hd x gT); then dS in place.
  Tensor ds = scratch(Shape{B, NH, T, T});
  gemm(T, gT, hd, t(kv_like(v.data, d)), q_like(dy.data, d), ds.data, T, gT * T, B * KV, 1.0f,
       0.0f);
  launch_softmax_dscore(ds.data, p.data, dsum.data, B * NH * T, T, stream_);
  // dQ^T (hd x gT) = scale * K stored (hd x T) @ dS stored (T x gT).
  Tensor dq = scratch(Shape{B, NH, T, hd}), dk = scratch(Shape{B, KV, T, hd}),
         dv = scratch(Shape{B, KV, T, hd});
  gemm(hd, gT, T, kv_like(k.data, d), scores_like(ds.data, d), dq.data, hd, gT * hd, B * KV, scale,
       0.0f);
  // dK^T (hd x T) = scale * Q stored (hd x gT) @ op_T(dS stored T x gT).
  gemm(hd, T, gT, q_like(q.data, d), t(scores_like(ds.data, d)), dk.data, hd, T * hd, B * KV, scale,
       0.0f);
  // dV^T (hd x T) = dY stored (hd x gT) @ op_T(P stored T x gT).
  gemm(hd, T, gT, q_like(dy.data, d), t(scores_like(p.data, d)), dv.data, hd, T * hd, B * KV, 1.0f,
       0.0f);
  launch_qkv_permute(dqkv.data, dq.data, dk.data, dv.data, B, T, NH, KV, hd, false, stream_);
}

}  // namespace stratagem::cuda
