// AdamW over a flat parameter range, global grad-norm clipping and the cosine LR schedule.
// Everything works on a contiguous range of the flat buffers (see ParamTable in
// transformer.hpp), so the same code updates the whole model or one ZeRO-1 shard of it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "stratagem/backend.hpp"

namespace stratagem {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to 2-D weights only (ParamSpan::decay)
};

// Linear warm-up from max_lr/warmup_steps to max_lr over `warmup_steps` steps, then a cosine
// from max_lr down to min_lr at `total_steps`, then min_lr (llm.c/nanoGPT convention).
// total_steps <= warmup_steps means constant max_lr after warm-up. Steps are 0-based.
struct LrSchedule {
  float max_lr = 6e-4f;
  float min_lr = 6e-5f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  float at(int64_t step) const;
};

// A run of a flat buffer that AdamW treats alike; `offset` is relative to the range updated.
struct ParamSpan {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = false;
};

// Optimizer state (m, v) for `numel` consecutive floats of the flat parameter buffer.
class AdamW {
 public:
  AdamW(Backend& backend, int64_t numel, AdamWConfig config = {});
  // State in memory the caller provides (the Program's optimizer buffer); zeroed here.
  AdamW(Backend& backend, Tensor m, Tensor v, AdamWConfig config = {});

  // One step on params/grads (each `numel` floats, the same range as the state); `spans`
  // covers the range and says where weight decay applies.
  void step(Backend& backend, Tensor& params, const Tensor& grads, std::span<const ParamSpan> spans,
            float lr);
  // One piece of the state's range: `params` and `grads` whose state starts at `state_offset`
  // (spans relative to the piece).
  struct Run {
    Tensor params, grads;
    int64_t state_offset = 0;
    std::vector<ParamSpan> spans;
  };
  // One step over pieces that together cover the state once (ZeRO stages that differ by layer
  // leave a rank's optimizer range scattered over its weights and gradients).
  void step(Backend& backend, std::span<const Run> runs, float lr);

  const AdamWConfig& config() const { return config_; }
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }  // when restoring a checkpoint
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }

 private:
  AdamWConfig config_;
  Tensor m_, v_;
  int64_t steps_ = 0;
};

// Global-norm clipping split in two so data-parallel/ZeRO callers can all-reduce the squared
// norm of their shards between the halves.
double grad_norm_squared(Backend& backend, const Tensor& grads);
// torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)); max_norm <= 0
// disables clipping (factor 1).
float clip_coefficient(double norm, float max_norm);
// Both halves on one rank; returns the norm before clipping.
float clip_grad_norm(Backend& backend, Tensor& grads, float max_norm);

}  // namespace stratagem
