// AdamW driver, grad-norm clipping and the LR schedule (the per-element math is the
// backend's adamw_update kernel).
#include "stratagem/optimizer.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace stratagem {

float LrSchedule::at(int64_t step) const {
  if (step < warmup_steps)
    return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (total_steps <= warmup_steps) return max_lr;
  if (step >= total_steps) return min_lr;
  const double ratio =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return static_cast<float>(min_lr + coeff * (max_lr - min_lr));
}

AdamW::AdamW(Backend& backend, int64_t numel, AdamWConfig config) : config_(config) {
  if (numel < 0) throw std::invalid_argument("AdamW: negative size");
  m_ = backend.zeros(Shape{numel});
  v_ = backend.zeros(Shape{numel});
}

AdamW::AdamW(Backend& backend, Tensor m, Tensor v, AdamWConfig config)
    : config_(config), m_(std::move(m)), v_(std::move(v)) {
  if (m_.numel() != v_.numel()) throw std::invalid_argument("AdamW: m and v differ in size");
  backend.fill(m_, 0.0f);
  backend.fill(v_, 0.0f);
}

void AdamW::step(Backend& backend, Tensor& params, const Tensor& grads,
                 std::span<const ParamSpan> spans, float lr) {
  const int64_t n = m_.numel();
  if (params.numel() != n || grads.numel() != n)
    throw std::invalid_argument("AdamW::step: params and grads must hold " + std::to_string(n) +
                                " floats like the optimizer state, got " +
                                std::to_string(params.numel()) + " and " +
                                std::to_string(grads.numel()));
  const Run run{params, grads, 0, std::vector<ParamSpan>(spans.begin(), spans.end())};
  step(backend, std::span<const Run>(&run, 1), lr);
}

void AdamW::step(Backend& backend, std::span<const Run> runs, float lr) {
  const int64_t n = m_.numel();
  ++steps_;
  AdamWStep s;
  s.lr = lr;
  s.beta1 = config_.beta1;
  s.beta2 = config_.beta2;
  s.eps = config_.eps;
  s.step = steps_;
  int64_t covered = 0;
  for (const Run& run : runs) {
    for (const ParamSpan& sp : run.spans) {
      if (sp.offset < 0 || sp.numel < 0 || sp.offset + sp.numel > run.params.numel() ||
          sp.offset + sp.numel > run.grads.numel() || run.state_offset < 0 ||
          run.state_offset + sp.offset + sp.numel > n)
        throw std::invalid_argument("AdamW::step: span outside the optimizer's range");
      covered += sp.numel;
      s.weight_decay = sp.decay ? config_.weight_decay : 0.0f;
      const Shape shape{sp.numel};
      Tensor p = run.params.slice(sp.offset, shape);
      Tensor m = m_.slice(run.state_offset + sp.offset, shape);
      Tensor v = v_.slice(run.state_offset + sp.offset, shape);
      backend.adamw_update(p, run.grads.slice(sp.offset, shape), m, v, s);
    }
  }
  if (covered != n)
    throw std::invalid_argument("AdamW::step: spans cover " + std::to_string(covered) + " of " +
                                std::to_string(n) + " floats");
}

double grad_norm_squared(Backend& backend, const Tensor& grads) {
  return backend.sum_squares(grads);
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

float clip_grad_norm(Backend& backend, Tensor& grads, float max_norm) {
  const double norm = std::sqrt(grad_norm_squared(backend, grads));
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f) backend.scale(grads, coef);
  return static_cast<float>(norm);
}

}  // namespace stratagem
