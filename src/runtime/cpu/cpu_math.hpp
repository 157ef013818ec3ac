// Small numeric helpers shared by the CPU kernels (internal).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

// GCC 12 reports false -Wmaybe-uninitialized inside Eigen's AVX-512 transpose intrinsics
// (it cannot see that every lane is written); silence it for Eigen only, before any
// intrinsics header is seen, and for the rest of these translation units.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>

#include "stratagem/tensor.hpp"

namespace stratagem::cpu {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
// A row-major block whose rows are `stride` floats apart (a head inside a (B,T,3C) buffer).
using StridedMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

// exp(x) built from arithmetic and bit operations only, so `#pragma omp simd` loops vectorize
// it (std::exp does not without -ffast-math). Cephes' single-precision polynomial: within
// 2 ulp over the clamped range; inputs below -87.3 give ~1e-38 rather than 0.
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
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
  return p * std::bit_cast<float>(bits);
}

// tanh through exp: 1 - 2/(e^{2x}+1) saturates cleanly to +-1 and vectorizes.
inline float fast_tanh(float x) {
  return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}

inline float sigmoid(float x) {
  return 1.0f / (1.0f + fast_exp(-x));
}

// Below this many floats of work a kernel runs on the calling thread: a parallel region costs
// microseconds, and far more when MPI ranks oversubscribe the cores (tiny test models).
inline constexpr int64_t kMinParallelWork = int64_t{1} << 15;

inline std::string kernel_error(const char* kernel, const std::string& what) {
  return std::string(kernel) + ": " + what;
}

}  // namespace stratagem::cpu
