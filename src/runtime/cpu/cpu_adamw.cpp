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
  const math::AdamWScalars k =
      math::adamw_scalars(s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step);
  float* p = param.data;
  float* mm = m.data;
  float* vv = v.data;
  const float* g = grad.data;
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) math::adamw_element(&p[i], g[i], &mm[i], &vv[i], k);
}

}  // namespace stratagem::cpu
