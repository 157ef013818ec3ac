// The CUDA kernels' launchers: plain pointers and sizes, so the .cu files need nothing newer
// than C++17 (nvcc's standard here) and the Backend methods (C++20, in .cpp files) do every
// shape check before launching. Shapes in comments as in backend.hpp. All launch on `s`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "stratagem/kernel_math.hpp"

namespace stratagem::cuda {

// ---- elementwise --------------------------------------------------------------------------
void launch_fill(float* p, int64_t n, float value, cudaStream_t s);
void launch_add(float* out, const float* a, const float* b, int64_t n, cudaStream_t s);
// out (rows, cols) += bias (cols), row-major.
void launch_add_bias(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t s);
void launch_scale(float* p, int64_t n, float factor, cudaStream_t s);
void launch_to_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t s);
void launch_gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t s);
void launch_gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n,
                          cudaStream_t s);
void launch_swiglu_forward(float* out, const float* inp, int64_t N, int64_t F, cudaStream_t s);
void launch_swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F,
                            cudaStream_t s);
void launch_adamw(float* p, const float* g, float* m, float* v, int64_t n,
                  const math::AdamWScalars& k, cudaStream_t s);
// partials (blocks) = per-block sums of squares in fp64, then total (1) = their sum.
int sum_squares_blocks(int64_t n);
void launch_sum_squares(double* partials, double* total, const float* p, int64_t n, cudaStream_t s);

// ---- embedding, rope ----------------------------------------------------------------------
// out (BT,C) = wte[tok] (+ wpe[t]); tok -1: zero (+ wpe[t]).
void launch_embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                              int64_t BT, int64_t T, int64_t C, cudaStream_t s);
// dwte[tok] += dout (atomic adds: the order of repeated ids is not fixed); dwpe[t] += sum_b.
void launch_embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const float* dout,
                               int64_t B, int64_t T, int64_t C, cudaStream_t s);
// In place on the first `rotated_heads` heads of each (width) row; table (T, hd/2, 2).
void launch_rope(float* qkv, const float* table, int64_t BT, int64_t T, int64_t width, int64_t hd,
                 int rotated_heads, float sign, cudaStream_t s);

// ---- normalization (rows of C) ------------------------------------------------------------
// bias, mean may be null (RMSNorm: mean null means 0, no bias).
void launch_norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int64_t N, int64_t C, float eps, cudaStream_t s);
// dinp += ...; mean null = RMSNorm.
void launch_norm_backward_dinp(float* dinp, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int64_t N, int64_t C,
                               cudaStream_t s);
// dw += sum_rows dout * n (n normalized input); db += sum_rows dout (db may be null).
void launch_norm_backward_params(float* dw, float* db, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int64_t N, int64_t C,
                                 cudaStream_t s);
// out (C) += column sums of in (N,C).
void launch_column_sums(float* out, const float* in, int64_t N, int64_t C, cudaStream_t s);

// ---- cross-entropy (rows of V, first `valid` columns real) -------------------------------
// max (N) of the valid columns.
void launch_ce_row_max(float* max, const float* logits, int64_t N, int64_t V, int64_t valid,
                       cudaStream_t s);
// sums (N,2) = [sum exp(x - max), x[target - vocab_begin] or 0].
void launch_ce_sums(float* sums, const float* logits, const float* max, const int32_t* targets,
                    int64_t N, int64_t V, int64_t vocab_begin, int64_t valid, cudaStream_t s);
// losses (N) = max + log(sums0) - sums1.
void launch_ce_losses(float* losses, const float* max, const float* sums, int64_t N,
                      cudaStream_t s);
// dlogits = (exp(x - max - log sums0) - onehot) * scale on valid columns, 0 on padding.
void launch_ce_backward(float* dlogits, const float* logits, const float* max, const float* sums,
                        const int32_t* targets, int64_t N, int64_t V, int64_t vocab_begin,
                        int64_t valid, float scale, cudaStream_t s);

// ---- attention ----------------------------------------------------------------------------
// qkv (B,T,W) <-> q (B,NH,T,hd), k (B,KV,T,hd), v (B,KV,T,hd). to_heads: gather; else
// scatter (overwriting the qkv rows).
void launch_qkv_permute(float* qkv, float* q, float* k, float* v, int64_t B, int64_t T, int64_t NH,
                        int64_t KV, int64_t hd, bool to_heads, cudaStream_t s);
// y (B,NH,T,hd) <-> out (B,T,NH*hd).
void launch_heads_permute(float* heads, float* out, int64_t B, int64_t T, int64_t NH, int64_t hd,
                          bool to_heads, cudaStream_t s);
// In place on scores (rows = B*NH*T, each T wide, row t of its head masked beyond t):
// P = softmax(scores), lse (rows) = max + log(sum).
void launch_causal_softmax(float* scores, float* lse, int64_t rows, int64_t T, cudaStream_t s);
// P = exp(scores - lse) below the diagonal, 0 above (the selective recompute).
void launch_causal_probs(float* scores, const float* lse, int64_t rows, int64_t T, cudaStream_t s);
// d (rows) = sum_e dout_e * out_e over each head row; dout, out (B,T,NH*hd), d (B,NH,T).
void launch_attention_d(float* d, const float* dout, const float* out, int64_t B, int64_t T,
                        int64_t NH, int64_t hd, cudaStream_t s);
// In place on dp: dS = P * (dP - D) below the diagonal, 0 above.
void launch_softmax_dscore(float* dp, const float* p, const float* d, int64_t rows, int64_t T,
                           cudaStream_t s);

}  // namespace stratagem::cuda
