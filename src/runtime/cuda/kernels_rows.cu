// Row kernels: embedding, RoPE, LayerNorm/RMSNorm, column sums, cross-entropy. One block per
// row where a row reduces (its statistics in registers and shared memory); per-element math
// from kernel_math.hpp.
#include "src/runtime/cuda/check.hpp"
#include "src/runtime/cuda/kernel_bodies.hpp"
#include "src/runtime/cuda/kernels.hpp"
#include "src/runtime/cuda/reduce.cuh"

namespace stratagem::cuda {
namespace {
constexpr int kThreads = 256;
int blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}
// One block per row; rows beyond the grid's y limit are walked by a stride.
dim3 row_grid(int64_t rows) {
  return dim3(static_cast<unsigned>(rows < 1 ? 1 : (rows > 2147483647 ? 2147483647 : rows)));
}
#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// ---- embedding ----------------------------------------------------------------------------
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t BT, int64_t T, int64_t C) {
  GRID_STRIDE(i, BT * C) body::embedding_forward(i, out, tokens, wte, wpe, T, C);
}
__global__ void embedding_dwte_kernel(float* dwte, const int32_t* tokens, const float* dout,
                                      int64_t BT, int64_t C) {
  GRID_STRIDE(i, BT * C) {
    const int64_t bt = i / C, c = i % C;
    const int32_t tok = tokens[bt];
    if (tok >= 0) atomicAdd(&dwte[tok * C + c], dout[i]);
  }
}
// dwpe[t,c] += sum over b, in b order.
__global__ void embedding_dwpe_kernel(float* dwpe, const float* dout, int64_t B, int64_t T,
                                      int64_t C) {
  GRID_STRIDE(i, T * C) {
    float acc = 0;
    for (int64_t b = 0; b < B; ++b) acc += dout[b * T * C + i];
    dwpe[i] += acc;
  }
}

// ---- rope ---------------------------------------------------------------------------------
__global__ void rope_kernel(float* qkv, const float* table, int64_t BT, int64_t T, int64_t width,
                            int64_t hd, int heads, float sign) {
  GRID_STRIDE(idx, BT * heads * (hd / 2)) body::rope(idx, qkv, table, T, width, hd, heads, sign);
}

// ---- normalization ------------------------------------------------------------------------
__global__ void norm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                    const float* w, const float* b, int64_t N, int64_t C,
                                    float eps) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* x = inp + r * C;
    float m = 0;
    if (mean) {
      float sum = 0;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += x[c];
      m = block_sum(sum, shared) / C;
    }
    float sq = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sq += (x[c] - m) * (x[c] - m);
    const float s = math::rstd_of(block_sum(sq, shared) / C, eps);
    float* o = out + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      o[c] = b ? math::norm_apply(x[c], m, s, w[c], b[c]) : math::norm_apply(x[c], m, s, w[c]);
    if (threadIdx.x == 0) {
      if (mean) mean[r] = m;
      rstd[r] = s;
    }
  }
}
__global__ void norm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                          const float* w, const float* mean, const float* rstd,
                                          int64_t N, int64_t C) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* x = inp + r * C;
    const float* g = dout + r * C;
    const float m = mean ? mean[r] : 0.0f, s = rstd[r];
    float sum_dn = 0, sum_dn_n = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float dn = g[c] * w[c];
      sum_dn += dn;
      sum_dn_n += dn * (x[c] - m) * s;
    }
    const float a = mean ? block_sum(sum_dn, shared) / C : 0.0f;
    const float bb = block_sum(sum_dn_n, shared) / C;
    float* dx = dinp + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      dx[c] += math::norm_dinp(g[c], w[c], x[c], m, s, a, bb);
  }
}
// Block (32, 8): 32 columns per block, 8 row lanes summed in shared memory in a fixed order.
__global__ void norm_backward_params_kernel(float* dw, float* db, const float* dout,
                                            const float* inp, const float* mean, const float* rstd,
                                            int64_t N, int64_t C) {
  __shared__ float sw[8][33], sb[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float aw = 0, ab = 0;
  if (c < C)
    for (int64_t r = threadIdx.y; r < N; r += 8) {
      const float g = dout[r * C + c];
      const float m = mean ? mean[r] : 0.0f;
      aw += g * (inp[r * C + c] - m) * rstd[r];
      ab += g;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0, tb = 0;
    for (int y = 0; y < 8; ++y) tw += sw[y][threadIdx.x], tb += sb[y][threadIdx.x];
    dw[c] += tw;
    if (db) db[c] += tb;
  }
}
__global__ void column_sums_kernel(float* out, const float* in, int64_t N, int64_t C) {
  __shared__ float sh[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float a = 0;
  if (c < C)
    for (int64_t r = threadIdx.y; r < N; r += 8) a += in[r * C + c];
  sh[threadIdx.y][threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0;
    for (int y = 0; y < 8; ++y) t += sh[y][threadIdx.x];
    out[c] += t;
  }
}

// ---- cross-entropy ------------------------------------------------------------------------
__global__ void ce_row_max_kernel(float* max, const float* logits, int64_t N, int64_t V,
                                  int64_t valid) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* row = logits + r * V;
    float mx = -FLT_MAX;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = block_max(mx, shared);
    if (threadIdx.x == 0) max[r] = mx;
  }
}
__global__ void ce_sums_kernel(float* sums, const float* logits, const float* max,
                               const int32_t* targets, int64_t N, int64_t V, int64_t vocab_begin,
                               int64_t valid) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* row = logits + r * V;
    const float mx = max[r];
    float sum = 0;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) sum += math::fast_exp(row[j] - mx);
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) {
      const int64_t t = int64_t(targets[r]) - vocab_begin;
      sums[2 * r] = sum;
      sums[2 * r + 1] = t >= 0 && t < valid ? row[t] : 0.0f;
    }
  }
}
__global__ void ce_losses_kernel(float* losses, const float* max, const float* sums, int64_t N) {
  GRID_STRIDE(r, N) losses[r] = (max[r] + logf(sums[2 * r])) - sums[2 * r + 1];
}
__global__ void ce_backward_kernel(float* dlogits, const float* logits, const float* max,
                                   const float* sums, const int32_t* targets, int64_t N, int64_t V,
                                   int64_t vocab_begin, int64_t valid, float scale) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* row = logits + r * V;
    float* drow = dlogits + r * V;  // may alias row: each element is read, then written once
    const float lse = max[r] + logf(sums[2 * r]);
    const int64_t t = int64_t(targets[r]) - vocab_begin;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      if (j >= valid) {
        drow[j] = 0.0f;
        continue;
      }
      const float d = math::prob_from_lse(row[j], lse) * scale;
      drow[j] = j == t ? d - scale : d;
    }
  }
}

// ---- attention helpers --------------------------------------------------------------------
__global__ void qkv_permute_kernel(float* qkv, float* q, float* k, float* v, int64_t B, int64_t T,
                                   int64_t NH, int64_t KV, int64_t hd, bool to_heads) {
  GRID_STRIDE(i, B * T * (NH + 2 * KV) * hd)
  body::qkv_permute(i, qkv, q, k, v, T, NH, KV, hd, to_heads);
}
__global__ void heads_permute_kernel(float* heads, float* out, int64_t B, int64_t T, int64_t NH,
                                     int64_t hd, bool to_heads) {
  GRID_STRIDE(i, B * T * NH * hd) body::heads_permute(i, heads, out, T, NH, hd, to_heads);
}
// The CPU backend's order: max, then p = exp(s - max) and their sum, then p *= 1/sum.
__global__ void causal_softmax_kernel(float* scores, float* lse, int64_t rows, int64_t T) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = r % T;
    float* row = scores + r * T;
    float mx = -FLT_MAX;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = block_max(mx, shared);
    float sum = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) {
      const float e = math::fast_exp(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    sum = block_sum(sum, shared);
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= t ? row[j] * inv : 0.0f;
    if (threadIdx.x == 0) lse[r] = mx + logf(sum);
  }
}
__global__ void causal_probs_kernel(float* scores, const float* lse, int64_t rows, int64_t T) {
  GRID_STRIDE(i, rows * T) body::causal_probs(i, scores, lse, T);
}
// One warp per (b,h,t) row of head_dim elements.
__global__ void attention_d_kernel(float* d, const float* dout, const float* out, int64_t B,
                                   int64_t T, int64_t NH, int64_t hd) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; w < B * NH * T;
       w += warps) {
    const int64_t t = w % T, h = (w / T) % NH, b = w / (T * NH);
    const int64_t base = (b * T + t) * NH * hd + h * hd;
    float acc = 0;
    for (int64_t e = lane; e < hd; e += 32) acc += dout[base + e] * out[base + e];
    acc = warp_sum(acc);
    if (lane == 0) d[w] = acc;
  }
}
__global__ void softmax_dscore_kernel(float* dp, const float* p, const float* d, int64_t rows,
                                      int64_t T) {
  GRID_STRIDE(i, rows * T) body::softmax_dscore(i, dp, p, d, T);
}
}  // namespace

void launch_embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                              int64_t BT, int64_t T, int64_t C, cudaStream_t s) {
  if (BT * C == 0) return;
  embedding_forward_kernel<<<blocks(BT * C), kThreads, 0, s>>>(out, tokens, wte, wpe, BT, T, C);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const float* dout,
                               int64_t B, int64_t T, int64_t C, cudaStream_t s) {
  if (B * T * C == 0) return;
  embedding_dwte_kernel<<<blocks(B * T * C), kThreads, 0, s>>>(dwte, tokens, dout, B * T, C);
  STRATAGEM_CUDA_CHECK_LAUNCH();
  if (dwpe) {
    embedding_dwpe_kernel<<<blocks(T * C), kThreads, 0, s>>>(dwpe, dout, B, T, C);
    STRATAGEM_CUDA_CHECK_LAUNCH();
  }
}
void launch_rope(float* qkv, const float* table, int64_t BT, int64_t T, int64_t width, int64_t hd,
                 int rotated_heads, float sign, cudaStream_t s) {
  const int64_t n = BT * rotated_heads * (hd / 2);
  if (n == 0) return;
  rope_kernel<<<blocks(n), kThreads, 0, s>>>(qkv, table, BT, T, width, hd, rotated_heads, sign);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int64_t N, int64_t C, float eps, cudaStream_t s) {
  if (N == 0) return;
  norm_forward_kernel<<<row_grid(N), kThreads, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_norm_backward_dinp(float* dinp, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int64_t N, int64_t C,
                               cudaStream_t s) {
  if (N == 0) return;
  norm_backward_dinp_kernel<<<row_grid(N), kThreads, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_norm_backward_params(float* dw, float* db, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int64_t N, int64_t C,
                                 cudaStream_t s) {
  if (C == 0) return;
  norm_backward_params_kernel<<<static_cast<unsigned>((C + 31) / 32), dim3(32, 8), 0, s>>>(
      dw, db, dout, inp, mean, rstd, N, C);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_column_sums(float* out, const float* in, int64_t N, int64_t C, cudaStream_t s) {
  if (C == 0) return;
  column_sums_kernel<<<static_cast<unsigned>((C + 31) / 32), dim3(32, 8), 0, s>>>(out, in, N, C);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_ce_row_max(float* max, const float* logits, int64_t N, int64_t V, int64_t valid,
                       cudaStream_t s) {
  if (N == 0) return;
  ce_row_max_kernel<<<row_grid(N), kThreads, 0, s>>>(max, logits, N, V, valid);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_ce_sums(float* sums, const float* logits, const float* max, const int32_t* targets,
                    int64_t N, int64_t V, int64_t vocab_begin, int64_t valid, cudaStream_t s) {
  if (N == 0) return;
  ce_sums_kernel<<<row_grid(N), kThreads, 0, s>>>(sums, logits, max, targets, N, V, vocab_begin,
                                                  valid);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_ce_losses(float* losses, const float* max, const float* sums, int64_t N,
                      cudaStream_t s) {
  if (N == 0) return;
  ce_losses_kernel<<<blocks(N), kThreads, 0, s>>>(losses, max, sums, N);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_ce_backward(float* dlogits, const float* logits, const float* max, const float* sums,
                        const int32_t* targets, int64_t N, int64_t V, int64_t vocab_begin,
                        int64_t valid, float scale, cudaStream_t s) {
  if (N == 0) return;
  ce_backward_kernel<<<row_grid(N), kThreads, 0, s>>>(dlogits, logits, max, sums, targets, N, V,
                                                      vocab_begin, valid, scale);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_qkv_permute(float* qkv, float* q, float* k, float* v, int64_t B, int64_t T, int64_t NH,
                        int64_t KV, int64_t hd, bool to_heads, cudaStream_t s) {
  const int64_t n = B * T * (NH + 2 * KV) * hd;
  if (n == 0) return;
  qkv_permute_kernel<<<blocks(n), kThreads, 0, s>>>(qkv, q, k, v, B, T, NH, KV, hd, to_heads);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_heads_permute(float* heads, float* out, int64_t B, int64_t T, int64_t NH, int64_t hd,
                          bool to_heads, cudaStream_t s) {
  const int64_t n = B * T * NH * hd;
  if (n == 0) return;
  heads_permute_kernel<<<blocks(n), kThreads, 0, s>>>(heads, out, B, T, NH, hd, to_heads);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_causal_softmax(float* scores, float* lse, int64_t rows, int64_t T, cudaStream_t s) {
  if (rows == 0) return;
  causal_softmax_kernel<<<row_grid(rows), kThreads, 0, s>>>(scores, lse, rows, T);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_causal_probs(float* scores, const float* lse, int64_t rows, int64_t T, cudaStream_t s) {
  if (rows * T == 0) return;
  causal_probs_kernel<<<blocks(rows * T), kThreads, 0, s>>>(scores, lse, rows, T);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_attention_d(float* d, const float* dout, const float* out, int64_t B, int64_t T,
                        int64_t NH, int64_t hd, cudaStream_t s) {
  const int64_t rows = B * NH * T;
  if (rows == 0) return;
  attention_d_kernel<<<blocks(rows * 32), kThreads, 0, s>>>(d, dout, out, B, T, NH, hd);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}
void launch_softmax_dscore(float* dp, const float* p, const float* d, int64_t rows, int64_t T,
                           cudaStream_t s) {
  if (rows * T == 0) return;
  softmax_dscore_kernel<<<blocks(rows * T), kThreads, 0, s>>>(dp, p, d, rows, T);
  STRATAGEM_CUDA_CHECK_LAUNCH();
}

}  // namespace stratagem::cuda
