// The shape checks of the Backend kernels, shared by every backend so that a wrong call fails
// with the same message on each (internal to src/runtime). Each throws std::invalid_argument
// "<kernel>: <what>".
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "stratagem/tensor.hpp"

namespace stratagem::checks {

inline std::string kernel_error(const char* kernel, const std::string& what) {
  return std::string(kernel) + ": " + what;
}

inline void expect_numel(const char* kernel, const char* what, const Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() != n)
    throw std::invalid_argument(kernel_error(
        kernel,
        std::string(what) + " must hold " + std::to_string(n) + " floats, got " + t.shape.str()));
}

inline void expect_same_numel(const char* kernel, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel())
    throw std::invalid_argument(
        kernel_error(kernel, "sizes differ: " + a.shape.str() + " vs " + b.shape.str()));
}

// Rows of the last dimension C, for the norms: (N, C) with weight (C).
struct Rows {
  int64_t n, c;
};
inline Rows norm_rows(const char* kernel, const Tensor& x, const Tensor& weight) {
  if (!x.defined() || x.ndim() < 1)
    throw std::invalid_argument(kernel_error(kernel, "input is undefined"));
  const int64_t C = x.dim(-1);
  expect_shape(weight, Shape{C}, kernel, "weight");
  return {x.numel() / std::max<int64_t>(C, 1), C};
}

// Every operand of each norm kernel (backend.hpp states the shapes), for both backends.
inline Rows check_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                    const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const Rows r = norm_rows("layernorm_forward", inp, weight);
  expect_shape(out, inp.shape, "layernorm_forward", "out");
  expect_numel("layernorm_forward", "mean", mean, r.n);
  expect_numel("layernorm_forward", "rstd", rstd, r.n);
  if (bias.defined()) expect_shape(bias, Shape{r.c}, "layernorm_forward", "bias");
  return r;
}
inline Rows check_layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd) {
  const Rows r = norm_rows("layernorm_backward", inp, weight);
  expect_shape(dout, inp.shape, "layernorm_backward", "dout");
  expect_shape(dinp, inp.shape, "layernorm_backward", "dinp");
  expect_shape(dweight, Shape{r.c}, "layernorm_backward", "dweight");
  if (dbias.defined()) expect_shape(dbias, Shape{r.c}, "layernorm_backward", "dbias");
  expect_numel("layernorm_backward", "mean", mean, r.n);
  expect_numel("layernorm_backward", "rstd", rstd, r.n);
  return r;
}
inline Rows check_rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                                  const Tensor& weight) {
  const Rows r = norm_rows("rmsnorm_forward", inp, weight);
  expect_shape(out, inp.shape, "rmsnorm_forward", "out");
  expect_numel("rmsnorm_forward", "rstd", rstd, r.n);
  return r;
}
inline Rows check_rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const Rows r = norm_rows("rmsnorm_backward", inp, weight);
  expect_shape(dout, inp.shape, "rmsnorm_backward", "dout");
  expect_shape(dinp, inp.shape, "rmsnorm_backward", "dinp");
  expect_shape(dweight, Shape{r.c}, "rmsnorm_backward", "dweight");
  expect_numel("rmsnorm_backward", "rstd", rstd, r.n);
  return r;
}

// SwiGLU: inp (...,2F), out (...,F).
struct SwigluDims {
  int64_t n, f;
};
inline SwigluDims swiglu_dims(const char* kernel, const Tensor& inp, const Tensor& out) {
  if (!inp.defined() || inp.ndim() < 1 || inp.dim(-1) % 2 != 0)
    throw std::invalid_argument(
        kernel_error(kernel, "inp must be (...,2F), got " + inp.shape.str()));
  const int64_t F = inp.dim(-1) / 2;
  const int64_t N = inp.numel() / inp.dim(-1);
  if (!out.defined() || out.dim(-1) != F || out.numel() != N * F)
    throw std::invalid_argument(kernel_error(kernel, "out must be (...," + std::to_string(F) +
                                                         ") with " + std::to_string(N) +
                                                         " rows, got " + out.shape.str()));
  return {N, F};
}

// qkv (B,T,(NH+2KV)*hd) for attention and RoPE.
struct QkvDims {
  int64_t B, T, W, hd, NH, KV, group;
};
inline QkvDims qkv_dims(const char* kernel, const Tensor& qkv, int heads, int kv_heads) {
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    throw std::invalid_argument(
        kernel_error(kernel, "kv_heads must divide heads, got heads=" + std::to_string(heads) +
                                 " kv_heads=" + std::to_string(kv_heads)));
  if (!qkv.defined() || qkv.ndim() != 3 || qkv.dim(2) % (heads + 2 * kv_heads) != 0)
    throw std::invalid_argument(
        kernel_error(kernel, "qkv must be (B,T,(NH+2KV)*hd), got " + qkv.shape.str()));
  return {qkv.dim(0), qkv.dim(1), qkv.dim(2),      qkv.dim(2) / (heads + 2 * kv_heads),
          heads,      kv_heads,   heads / kv_heads};
}
inline QkvDims rope_dims(const char* kernel, const Tensor& qkv, int heads, int kv_heads) {
  const QkvDims d = qkv_dims(kernel, qkv, heads, kv_heads);
  if (d.hd % 2 != 0)
    throw std::invalid_argument(
        kernel_error(kernel, "head_dim must be even, got " + std::to_string(d.hd)));
  return d;
}

// Embedding: ids in [0, vocab) or -1 (another shard's), activation (B,T,C), wte (V,C),
// wpe (maxT>=T, C) when defined.
inline void check_tokens(const char* kernel, std::span<const int32_t> tokens, int64_t n,
                         int64_t vocab) {
  if (static_cast<int64_t>(tokens.size()) != n)
    throw std::invalid_argument(kernel_error(
        kernel,
        "got " + std::to_string(tokens.size()) + " tokens, expected B*T = " + std::to_string(n)));
  for (int32_t t : tokens)
    if (t < -1 || t >= vocab)
      throw std::invalid_argument(kernel_error(kernel, "token id " + std::to_string(t) +
                                                           " outside [0," + std::to_string(vocab) +
                                                           ") (or -1: another shard's)"));
}
inline void check_embedding_shapes(const char* kernel, const Tensor& x, const Tensor& wte,
                                   const Tensor& wpe) {
  if (x.ndim() != 3)
    throw std::invalid_argument(
        kernel_error(kernel, "activation must be (B,T,C), got " + x.shape.str()));
  const int64_t T = x.dim(1), C = x.dim(2);
  if (!wte.defined() || wte.ndim() != 2 || wte.dim(1) != C)
    throw std::invalid_argument(
        kernel_error(kernel, "wte must be (V," + std::to_string(C) + "), got " + wte.shape.str()));
  if (wpe.defined() && (wpe.ndim() != 2 || wpe.dim(1) != C || wpe.dim(0) < T))
    throw std::invalid_argument(kernel_error(kernel, "wpe must be (maxT>=" + std::to_string(T) +
                                                         "," + std::to_string(C) + "), got " +
                                                         wpe.shape.str()));
}

// Linear: weight (OC,C), inp (...,C), out (...,OC) with the same rows.
struct LinearDims {
  int64_t n, c, oc;
};
inline LinearDims linear_dims(const char* kernel, const Tensor& inp, const Tensor& weight,
                              const Tensor& out, const char* out_name) {
  if (!weight.defined() || weight.ndim() != 2)
    throw std::invalid_argument(
        kernel_error(kernel, "weight must be (OC,C), got " + weight.shape.str()));
  const int64_t OC = weight.dim(0), C = weight.dim(1);
  if (!inp.defined() || inp.ndim() < 2 || inp.dim(-1) != C)
    throw std::invalid_argument(kernel_error(kernel, "inp must be (...," + std::to_string(C) +
                                                         ") to match weight " + weight.shape.str() +
                                                         ", got " + inp.shape.str()));
  const int64_t N = inp.numel() / C;
  if (!out.defined() || out.dim(-1) != OC || out.numel() != N * OC)
    throw std::invalid_argument(
        kernel_error(kernel, std::string(out_name) + " must be (...," + std::to_string(OC) +
                                 ") with " + std::to_string(N) + " rows, got " + out.shape.str()));
  return {N, C, OC};
}

// Cross-entropy over the whole vocabulary: logits (N,V), targets (N) in [0,V).
struct LossDims {
  int64_t n, v;
};
inline LossDims loss_dims(const char* kernel, const Tensor& logits,
                          std::span<const int32_t> targets) {
  if (!logits.defined() || logits.ndim() < 2)
    throw std::invalid_argument(
        kernel_error(kernel, "logits must be (N,V), got " + logits.shape.str()));
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  if (static_cast<int64_t>(targets.size()) != N)
    throw std::invalid_argument(kernel_error(kernel, "got " + std::to_string(targets.size()) +
                                                         " targets for " + std::to_string(N) +
                                                         " logit rows"));
  for (int32_t t : targets)
    if (t < 0 || t >= V)
      throw std::invalid_argument(kernel_error(
          kernel, "target " + std::to_string(t) + " outside [0," + std::to_string(V) + ")"));
  return {N, V};
}
// The vocabulary-parallel kernels: logits (N,Vl) with `valid` real columns; targets (N) when
// given (any ids: those outside the shard count as absent).
inline LossDims shard_dims(const char* kernel, const Tensor& logits,
                           std::span<const int32_t> targets, int64_t valid) {
  if (!logits.defined() || logits.ndim() != 2)
    throw std::invalid_argument(
        kernel_error(kernel, "logits must be (N,Vl), got " + logits.shape.str()));
  const int64_t N = logits.dim(0), V = logits.dim(1);
  if (valid < 1 || valid > V)
    throw std::invalid_argument(kernel_error(kernel, "valid columns " + std::to_string(valid) +
                                                         " outside [1," + std::to_string(V) + "]"));
  if (targets.data() && static_cast<int64_t>(targets.size()) != N)
    throw std::invalid_argument(kernel_error(kernel, "got " + std::to_string(targets.size()) +
                                                         " targets for " + std::to_string(N) +
                                                         " logit rows"));
  return {N, V};
}

// The vocabulary-parallel kernels' reduced statistics: max (N), sums (N,2).
inline LossDims check_crossentropy_row_max(const Tensor& max, const Tensor& logits, int64_t valid) {
  const LossDims d = shard_dims("crossentropy_row_max", logits, {}, valid);
  expect_numel("crossentropy_row_max", "max", max, d.n);
  return d;
}
inline LossDims check_crossentropy_sums(const Tensor& sums, const Tensor& logits, const Tensor& max,
                                        std::span<const int32_t> targets, int64_t valid) {
  const LossDims d = shard_dims("crossentropy_sums", logits, targets, valid);
  expect_numel("crossentropy_sums", "max", max, d.n);
  expect_numel("crossentropy_sums", "sums", sums, 2 * d.n);
  return d;
}
inline LossDims check_crossentropy_shard_backward(const Tensor& dlogits, const Tensor& logits,
                                                  const Tensor& max, const Tensor& sums,
                                                  std::span<const int32_t> targets, int64_t valid) {
  const LossDims d = shard_dims("crossentropy_shard_backward", logits, targets, valid);
  expect_shape(dlogits, logits.shape, "crossentropy_shard_backward", "dlogits");
  expect_numel("crossentropy_shard_backward", "max", max, d.n);
  expect_numel("crossentropy_shard_backward", "sums", sums, 2 * d.n);
  return d;
}

// AdamW: param, m, v hold as many floats as grad; step >= 1.
inline void check_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                        int64_t step) {
  const int64_t n = grad.numel();
  for (const Tensor* t : {&param, &m, &v})
    if (t->numel() != n)
      throw std::invalid_argument(kernel_error(
          "adamw_update",
          "param/m/v must hold " + std::to_string(n) + " floats like grad, got " + t->shape.str()));
  if (step < 1) throw std::invalid_argument("adamw_update: step must be >= 1");
}

}  // namespace stratagem::checks
