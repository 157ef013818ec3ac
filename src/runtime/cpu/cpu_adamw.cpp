// AdamW, written as torch.optim.AdamW computes it (same operation order) so that the
// reference test can hold ten steps to a tight tolerance.
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {

void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamWStep& s) {
  const int64_t n = grad.numel();
  for (const Tensor* t : {&param, &m, &v})
    if (t->numel() != n)
      throw std::invalid_argument(kernel_error(
          "adamw_update",
          "param/m/v must hold " + std::to_string(n) + " floats like grad, got " + t->shape.str()));
  if (s.step < 1) throw std::invalid_argument("adamw_update: step must be >= 1");
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - s.lr * s.weight_decay;
  const float b1 = s.beta1, b2 = s.beta2, eps = s.eps;
  float* p = param.data;
  float* mm = m.data;
  float* vv = v.data;
  const float* g = grad.data;
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    p[i] *= decay;
    mm[i] = b1 * mm[i] + (1.0f - b1) * g[i];
    vv[i] = b2 * vv[i] + (1.0f - b2) * g[i] * g[i];
    const float denom = std::sqrt(vv[i]) / bc2_sqrt + eps;
    p[i] -= step_size * mm[i] / denom;
  }
}

}  // namespace stratagem::cpu
