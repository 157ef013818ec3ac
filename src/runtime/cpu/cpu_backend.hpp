// CpuBackend: the Backend on host memory. Kernels live in one file per family
// (cpu_norm.cpp, cpu_attention.cpp, ...); this header is internal to src/runtime/cpu.
#pragma once
#include <vector>

#include "stratagem/backend.hpp"

namespace stratagem::cpu {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  Tensor allocate(Shape shape) override;
  void fill(Tensor& t, float value) override;
  void copy(Tensor& dst, const Tensor& src) override;
  void upload(Tensor& dst, const float* host) override;
  void download(float* host, const Tensor& src) override;
  void copy_block(Tensor& dst, int64_t dst_row0, int64_t dst_col0, const Tensor& src,
                  int64_t src_row0, int64_t src_col0, int64_t rows, int64_t cols) override;

  void embedding_forward(Tensor& out, std::span<const int32_t> tokens, const Tensor& wte,
                         const Tensor& wpe) override;
  void embedding_backward(Tensor& dwte, Tensor& dwpe, std::span<const int32_t> tokens,
                          const Tensor& dout) override;

  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias, float eps) override;
  void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd) override;
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       float eps) override;
  void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd) override;

  void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias) override;
  void matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight) override;

  void rope_forward(Tensor& qkv, int heads, int kv_heads, float theta) override;
  void rope_backward(Tensor& dqkv, int heads, int kv_heads, float theta) override;
  void rope_forward_from(Tensor& qkv, int heads, int kv_heads, float theta, int64_t pos0) override;
  void rope_backward_from(Tensor& dqkv, int heads, int kv_heads, float theta,
                          int64_t pos0) override;

  void attention_forward(Tensor& out, Tensor& att, Tensor& lse, const Tensor& qkv, int heads,
                         int kv_heads) override;
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& qkv,
                          const Tensor& att, const Tensor& lse, int heads, int kv_heads) override;

  void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& q, TokenSpan qs,
                               const Tensor& kv, TokenSpan ks, int heads, int kv_heads) override;
  void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse,
                       TokenSpan span) override;
  void attention_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& out,
                                const Tensor& lse, const Tensor& q, TokenSpan qs, const Tensor& kv,
                                TokenSpan ks, int heads, int kv_heads) override;

  void gelu_forward(Tensor& out, const Tensor& inp) override;
  void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void swiglu_forward(Tensor& out, const Tensor& inp) override;
  void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) override;
  void residual_forward(Tensor& out, const Tensor& a, const Tensor& b) override;
  void residual_backward(Tensor& dinp, const Tensor& dout) override;

  void crossentropy_forward(Tensor& losses, const Tensor& logits,
                            std::span<const int32_t> targets) override;
  void crossentropy_softmax_backward(Tensor& dlogits, const Tensor& logits,
                                     std::span<const int32_t> targets, float scale) override;

  void crossentropy_row_max(Tensor& max, const Tensor& logits, int64_t valid) override;
  void crossentropy_sums(Tensor& sums, const Tensor& logits, const Tensor& max,
                         std::span<const int32_t> targets, int64_t vocab_begin,
                         int64_t valid) override;
  void crossentropy_shard_backward(Tensor& dlogits, const Tensor& logits, const Tensor& max,
                                   const Tensor& sums, std::span<const int32_t> targets,
                                   int64_t vocab_begin, int64_t valid, float scale) override;

  double sum_squares(const Tensor& t) override;
  void scale(Tensor& t, float factor) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWStep& step) override;

 private:
  // Per-thread scratch for attention score blocks; grown outside parallel regions only, so
  // after the first step no kernel allocates.
  float* thread_scratch(int thread, size_t floats_per_thread);
  void reserve_scratch(size_t floats_per_thread);
  // cos/sin table (>= T, hd/2) for RoPE (row t: position t), rebuilt only when more rows are
  // needed or hd or theta change.
  const float* rope_table(int64_t T, int64_t hd, float theta);

  std::vector<float> scratch_;
  size_t scratch_per_thread_ = 0;
  std::vector<float> rope_cos_sin_;
  int64_t rope_T_ = 0, rope_hd_ = 0;
  float rope_theta_ = 0;
};

}  // namespace stratagem::cpu
