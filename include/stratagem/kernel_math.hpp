// The per-element math of the Transformer kernels, shared by the CPU backend (src/runtime/cpu)
// and the CUDA backend (src/runtime/cuda). Each function is `__host__ __device__` under nvcc
// and a plain inline function elsewhere, so the CPU reference tests in every CI run check the
// formulas the GPU kernels use; a GPU run only has indexing and launch left to check.
// Everything here is fp32 and branch-light so `#pragma omp simd` loops vectorize it.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if __cplusplus >= 202002L && !defined(__CUDACC__)
#include <bit>
#endif

#if defined(__CUDACC__)
#define STRATAGEM_HD __host__ __device__ __forceinline__
#else
#define STRATAGEM_HD inline
#endif

namespace stratagem::math {

STRATAGEM_HD float float_from_bits(int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#elif __cplusplus >= 202002L && !defined(__CUDACC__)
  return std::bit_cast<float>(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

STRATAGEM_HD uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__float_as_int(x));
#elif __cplusplus >= 202002L && !defined(__CUDACC__)
  return std::bit_cast<uint32_t>(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

// ---- bf16: the upper 16 bits of an fp32 ----------------------------------------------------
// Round to nearest, ties to even (what __float2bfloat16_rn does); NaN stays a quiet NaN.
STRATAGEM_HD uint16_t bf16_from_float(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
STRATAGEM_HD float float_from_bf16(uint16_t b) {
  return float_from_bits(static_cast<int32_t>(static_cast<uint32_t>(b) << 16));
}

// exp(x) built from arithmetic and bit operations only, so `#pragma omp simd` loops vectorize
// it (std::exp does not without -ffast-math). Cephes' single-precision polynomial: within
// 2 ulp over the clamped range; inputs below -87.3 give ~1e-38 rather than 0. The GPU uses the
// same polynomial so that both backends round alike.
STRATAGEM_HD float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * float_from_bits(bits);
}

// tanh through exp: 1 - 2/(e^{2x}+1) saturates cleanly to +-1 and vectorizes.
STRATAGEM_HD float fast_tanh(float x) {
  return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}

STRATAGEM_HD float sigmoid(float x) {
  return 1.0f / (1.0f + fast_exp(-x));
}

// ---- GELU, tanh approximation (GPT-2, llm.c) -------------------------------------------------
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;

STRATAGEM_HD float gelu_forward(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  return 0.5f * x * (1.0f + fast_tanh(u));
}
// d gelu(x)/dx * dout
STRATAGEM_HD float gelu_backward(float x, float dout) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  const float t = fast_tanh(u);
  const float local = 0.5f * (1.0f + t) +
                      0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
  return local * dout;
}

// ---- SwiGLU: silu(gate) * up -----------------------------------------------------------------
STRATAGEM_HD float swiglu_forward(float gate, float up) {
  return gate * sigmoid(gate) * up;
}
STRATAGEM_HD void swiglu_backward(float gate, float up, float dout, float* dgate, float* dup) {
  const float s = sigmoid(gate);
  *dup = dout * (gate * s);
  // d silu(x)/dx = s * (1 + x * (1 - s))
  *dgate = dout * up * s * (1.0f + gate * (1.0f - s));
}

// ---- normalization: per element, given the row's statistics --------------------------------
// LayerNorm out = (x - mean) * rstd * w + b; RMSNorm is the same with mean 0 and b 0.
STRATAGEM_HD float norm_apply(float x, float mean, float rstd, float w, float b) {
  return (x - mean) * rstd * w + b;
}
STRATAGEM_HD float norm_apply(float x, float mean, float rstd, float w) {
  return (x - mean) * rstd * w;
}
STRATAGEM_HD float rstd_of(float mean_square, float eps) {
  return 1.0f / sqrtf(mean_square + eps);
}
// LayerNorm's input gradient: with n = (x - mean) * rstd and dn = dout * w,
//   dx = rstd * (dn - mean(dn) - n * mean(dn * n)).
// `mean_dn` is mean(dn) (0 for RMSNorm, with mean 0) and `mean_dn_n` is mean(dn * n).
STRATAGEM_HD float norm_dinp(float dout, float w, float x, float mean, float rstd, float mean_dn,
                             float mean_dn_n) {
  return rstd * (dout * w - mean_dn - (x - mean) * rstd * mean_dn_n);
}

// ---- rotary positions (rotate the pair (x1, x2) = (x[i], x[i + hd/2]) by angle a) ----------
// `sin_a` carries the sign: the backward applies the transpose with -sin.
STRATAGEM_HD void rope_rotate(float x1, float x2, float cos_a, float sin_a, float* o1, float* o2) {
  *o1 = x1 * cos_a - x2 * sin_a;
  *o2 = x2 * cos_a + x1 * sin_a;
}

// ---- softmax / cross-entropy -----------------------------------------------------------------
// A probability rebuilt from a score and its row's log-sum-exp.
STRATAGEM_HD float prob_from_lse(float score, float lse) {
  return fast_exp(score - lse);
}
// Softmax backward through the probabilities: dS = P * (dP - D), D = sum_j P_j dP_j.
STRATAGEM_HD float softmax_dscore(float p, float dp, float d) {
  return p * (dp - d);
}

// ---- AdamW (torch.optim.AdamW's operation order) --------------------------------------------
// The step's scalars, computed once on the host in fp64 and rounded as the CPU backend does.
struct AdamWScalars {
  float decay;  // 1 - lr * weight_decay
  float beta1, beta2, eps;
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
};
STRATAGEM_HD void adamw_element(float* p, float g, float* m, float* v, const AdamWScalars& s) {
  float pp = *p * s.decay;
  const float mm = s.beta1 * *m + (1.0f - s.beta1) * g;
  const float vv = s.beta2 * *v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(vv) / s.bc2_sqrt + s.eps;
  pp -= s.step_size * mm / denom;
  *p = pp;
  *m = mm;
  *v = vv;
}

}  // namespace stratagem::math

namespace stratagem::math {
// AdamW's per-step scalars from its hyperparameters (host only: fp64 bias corrections).
inline AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float eps, float weight_decay,
                                  int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  return {1.0f - lr * weight_decay,          beta1, beta2, eps, static_cast<float>(lr / bc1),
          static_cast<float>(std::sqrt(bc2))};
}
}  // namespace stratagem::math

namespace stratagem::math {
// RoPE's (T, hd/2, 2) table of cos, sin at position t for pair i: angle t * theta^(-2i/hd).
// Angles in fp64 so long sequences keep their accuracy. Host only; the CUDA backend uploads it.
inline void fill_rope_table(float* cos_sin, int64_t T, int64_t hd, float theta) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / hd);
    for (int64_t t = 0; t < T; ++t) {
      const double a = t * inv_freq;
      cos_sin[(t * half + i) * 2] = static_cast<float>(std::cos(a));
      cos_sin[(t * half + i) * 2 + 1] = static_cast<float>(std::sin(a));
    }
  }
}
}  // namespace stratagem::math
