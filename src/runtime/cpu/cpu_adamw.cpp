// AdamW, written as torch.optim.AdamW computes it (same operation order) so that the
// reference test can hold ten steps to a tight tolerance.
#include <cmath>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {

void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamWStep& s) {
  check_adamw(param, grad, m, v, s.step);
  const int64_t n = grad.numel();
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
