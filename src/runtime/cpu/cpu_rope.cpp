// Rotary position embedding, LLaMA/HF convention: within each head of dim hd, element i is
// paired with element i + hd/2 and rotated by angle t * theta^(-2i/hd).
#include <cmath>
#include <stdexcept>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {

// sign = +1 rotates forward; -1 applies the transpose (the backward of a rotation).
void rotate(float* base, const float* table, const QkvDims& d, int rotated_heads, float sign) {
  const int64_t half = d.hd / 2;
#pragma omp parallel for schedule(static) if (d.B * d.T * d.W >= kMinParallelWork)
  for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
    const float* cs = table + (bt % d.T) * half * 2;  // (hd/2, 2) cos,sin at position t
    float* row = base + bt * d.W;
    for (int h = 0; h < rotated_heads; ++h) {
      float* x = row + h * d.hd;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        math::rope_rotate(x[i], x[i + half], cs[2 * i], sign * cs[2 * i + 1], &x[i], &x[i + half]);
      }
    }
  }
}
}  // namespace

const float* CpuBackend::rope_table(int64_t T, int64_t hd, float theta) {
  if (T > rope_T_ || hd != rope_hd_ || theta != rope_theta_) {
    rope_cos_sin_.resize(static_cast<size_t>(T * (hd / 2) * 2));
    math::fill_rope_table(rope_cos_sin_.data(), T, hd, theta);
    rope_T_ = T, rope_hd_ = hd, rope_theta_ = theta;
  }
  return rope_cos_sin_.data();
}

void CpuBackend::rope_forward(Tensor& qkv, int heads, int kv_heads, float theta) {
  rope_forward_from(qkv, heads, kv_heads, theta, 0);
}

void CpuBackend::rope_backward(Tensor& dqkv, int heads, int kv_heads, float theta) {
  rope_backward_from(dqkv, heads, kv_heads, theta, 0);
}

void CpuBackend::rope_forward_from(Tensor& qkv, int heads, int kv_heads, float theta,
                                   int64_t pos0) {
  const QkvDims d = rope_dims("rope_forward", qkv, heads, kv_heads);
  if (pos0 < 0) throw std::invalid_argument("rope_forward: negative first position");
  // q and k heads are adjacent at the start of each token's row: rotate NH+KV heads.
  const float* table = rope_table(pos0 + d.T, d.hd, theta) + pos0 * (d.hd / 2) * 2;
  rotate(qkv.data, table, d, heads + kv_heads, 1.0f);
}

void CpuBackend::rope_backward_from(Tensor& dqkv, int heads, int kv_heads, float theta,
                                    int64_t pos0) {
  const QkvDims d = rope_dims("rope_backward", dqkv, heads, kv_heads);
  if (pos0 < 0) throw std::invalid_argument("rope_backward: negative first position");
  const float* table = rope_table(pos0 + d.T, d.hd, theta) + pos0 * (d.hd / 2) * 2;
  rotate(dqkv.data, table, d, heads + kv_heads, -1.0f);
}

}  // namespace stratagem::cpu
