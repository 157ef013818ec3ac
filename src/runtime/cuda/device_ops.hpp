// The Ops of gemm_steps.hpp on a CudaBackend: cuBLASLt GEMMs and the kernels of kernels.hpp,
// all on the backend's compute stream; scratch comes from its caching pool and lives as long
// as this object (one Backend call). Internal to src/runtime/cuda.
#pragma once
#include <vector>

#include "src/runtime/cuda/cuda_backend.hpp"
#include "src/runtime/cuda/kernels.hpp"

namespace stratagem::cuda {

struct CudaBackend::DeviceOps {
  CudaBackend& be;
  std::vector<Tensor> held;

  float* scratch(int64_t floats) {
    held.push_back(be.scratch(Shape{floats}));
    return held.back().data;
  }
  void gemm(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, float* c,
            int64_t ldc, int64_t stride_c, int64_t batch, float alpha, float beta,
            const float* bias) {
    be.gemm(m, n, k, a, b, c, ldc, stride_c, batch, alpha, beta, bias);
  }
  void qkv_permute(float* qkv, float* q, float* k, float* v, int64_t B, int64_t T, int64_t NH,
                   int64_t KV, int64_t hd, bool to_heads) {
    launch_qkv_permute(qkv, q, k, v, B, T, NH, KV, hd, to_heads, be.stream_);
  }
  void heads_permute(float* heads, float* out, int64_t B, int64_t T, int64_t NH, int64_t hd,
                     bool to_heads) {
    launch_heads_permute(heads, out, B, T, NH, hd, to_heads, be.stream_);
  }
  void causal_softmax(float* s, float* lse, int64_t rows, int64_t T) {
    launch_causal_softmax(s, lse, rows, T, be.stream_);
  }
  void causal_probs(float* s, const float* lse, int64_t rows, int64_t T) {
    launch_causal_probs(s, lse, rows, T, be.stream_);
  }
  void attention_d(float* d, const float* dout, const float* out, int64_t B, int64_t T, int64_t NH,
                   int64_t hd) {
    launch_attention_d(d, dout, out, B, T, NH, hd, be.stream_);
  }
  void softmax_dscore(float* dp, const float* p, const float* d, int64_t rows, int64_t T) {
    launch_softmax_dscore(dp, p, d, rows, T, be.stream_);
  }
  void column_sums(float* out, const float* in, int64_t N, int64_t C) {
    launch_column_sums(out, in, N, C, be.stream_);
  }
};

}  // namespace stratagem::cuda
