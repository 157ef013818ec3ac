// Causal attention with GQA as batched GEMMs plus a row softmax: simple enough to check line
// by line against the CPU backend (a flash kernel comes once a GPU run has checked this one).
// q, k, v are first gathered into head-major buffers: q (B,NH,T,hd), k and v (B,KV,T,hd).
// Query head h = kvh * group + g, so the `group` query heads of one kv head are consecutive
// (group*T, hd) rows, and every product is one strided batch of B*KV matrices:
//   S  (group*T, T)  = scale * Q K^T          Y  (group*T, hd) = P V
//   dP (group*T, T)  = dY V^T                 dS = P * (dP - D),  D = rowsum(dY * Y)
//   dQ (group*T, hd) = scale * dS K           dK (T, hd) = scale * dS^T Q   dV = P^T dY
// (dK and dV sum over the group's heads inside the GEMM's reduction, with no atomics.)
// The steps, with their column-major operands, are in gemm_steps.hpp (tested on CPU).
#include "src/runtime/cuda/cuda_backend.hpp"
#include "src/runtime/cuda/device_ops.hpp"
#include "src/runtime/kernel_checks.hpp"

namespace stratagem::cuda {

void CudaBackend::attention_forward(Tensor& out, Tensor& att, Tensor& lse, const Tensor& qkv,
                                    int heads, int kv_heads) {
  const checks::QkvDims d = checks::qkv_dims("attention_forward", qkv, heads, kv_heads);
  const int64_t B = d.B, T = d.T, hd = d.hd, NH = d.NH;
  expect_shape(out, Shape{B, T, NH * hd}, "attention_forward", "out");
  expect_shape(lse, Shape{B, NH, T}, "attention_forward", "lse");
  if (att.defined()) expect_shape(att, Shape{B, NH, T, T}, "attention_forward", "att");
  DeviceOps ops{*this, {}};
  float* s = att.defined() ? att.data : ops.scratch(B * NH * T * T);
  attention_forward_steps(ops, AttentionShape{B, T, NH, d.KV, hd}, qkv.data, s, lse.data, out.data);
}

void CudaBackend::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out,
                                     const Tensor& qkv, const Tensor& att, const Tensor& lse,
                                     int heads, int kv_heads) {
  const checks::QkvDims d = checks::qkv_dims("attention_backward", qkv, heads, kv_heads);
  const int64_t B = d.B, T = d.T, hd = d.hd, NH = d.NH, C = NH * hd;
  expect_shape(dqkv, qkv.shape, "attention_backward", "dqkv");
  expect_shape(dout, Shape{B, T, C}, "attention_backward", "dout");
  expect_shape(out, Shape{B, T, C}, "attention_backward", "out");
  expect_shape(lse, Shape{B, NH, T}, "attention_backward", "lse");
  if (att.defined()) expect_shape(att, Shape{B, NH, T, T}, "attention_backward", "att");
  DeviceOps ops{*this, {}};
  attention_backward_steps(ops, AttentionShape{B, T, NH, d.KV, hd}, qkv.data, att.data, lse.data,
                           dout.data, out.data, dqkv.data);
}

}  // namespace stratagem::cuda
