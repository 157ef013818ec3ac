// Tolerances derived from fp32 arithmetic, for the C++ tests that compare the CPU kernels with a
// reference (PyTorch in float64, or another ordering of the same sums). The derivation, the
// rounding model and the constants are test/runtime/tolerance.py's, which the equals-serial
// scripts use; this header states the same formulas for C++ tests and must stay equal to it.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <vector>

#include "stratagem/model.hpp"

namespace stratagem::test {

inline constexpr double kUnitRoundoff = 0x1p-24;  // fp32
// The probabilistic bound's multiplier: a chance failure below 2 exp(-32) per bound.
inline constexpr double kRoundingLambda = 8.0;

// Relative error of a chain of independent fp32 reductions of the given lengths, against the
// exact result (Higham and Mary 2019; errors of successive reductions add in quadrature).
inline double reductions_rtol(const std::vector<int64_t>& lengths) {
  const double n = double(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}));
  return kRoundingLambda * kUnitRoundoff * std::sqrt(n);
}

// The sums of one forward pass of `spec` over `tokens` tokens (tolerance.py's
// reduction_lengths): per layer the norm, q.k, the softmax and P.V, the projection, the second
// norm, fc1 and fc2 (and an MoE layer's router softmax and top-k combine), then the final norm,
// the logits, the log-sum-exp and the loss mean.
inline std::vector<int64_t> forward_reduction_lengths(const ModelSpec& spec, int64_t tokens) {
  const int64_t head = spec.hidden / spec.heads;
  int64_t ffn = spec.ffn_hidden;
  if (spec.moe.enabled()) ffn = std::max<int64_t>(ffn, spec.moe.expert_ffn_hidden);
  std::vector<int64_t> per_layer = {spec.hidden, head,        spec.seq_len, spec.seq_len,
                                    spec.hidden, spec.hidden, spec.hidden,  ffn};
  if (spec.moe.enabled()) {
    per_layer.push_back(spec.moe.experts);
    per_layer.push_back(spec.moe.top_k);
  }
  std::vector<int64_t> all;
  for (int l = 0; l < spec.layers; ++l) all.insert(all.end(), per_layer.begin(), per_layer.end());
  for (int64_t n : {int64_t(spec.hidden), int64_t(spec.hidden), int64_t(spec.vocab), tokens})
    all.push_back(n);
  return all;
}

// One pass's loss, and a gradient relative to its tensor's largest entry (the backward pass
// repeats the forward's chain: sqrt(2) in quadrature).
inline double pass_rtol(const ModelSpec& spec, int64_t tokens) {
  return reductions_rtol(forward_reduction_lengths(spec, tokens));
}
inline double grad_rtol(const ModelSpec& spec, int64_t tokens) {
  return std::sqrt(2.0) * pass_rtol(spec, tokens);
}
// The loss after `steps` optimizer steps (tolerance.py's loss_rtol).
inline double loss_rtol(const ModelSpec& spec, int64_t tokens, int steps) {
  return steps * pass_rtol(spec, tokens);
}

// One MoE FFN block, forward and backward: the router's logits over the hidden size and its
// softmax over the experts, fc1 and fc2, the top-k combine, and the weight gradients' sums over
// the tokens.
inline double moe_block_rtol(int64_t hidden, int64_t experts, int64_t top_k, int64_t ffn,
                             int64_t tokens) {
  return std::sqrt(2.0) * reductions_rtol({hidden, experts, hidden, ffn, top_k, tokens});
}
// One attention over T positions of head size hd, forward and backward (q.k, the softmax's sum,
// P.V; the ring's merges only regroup the sums over T).
inline double attention_rtol(int64_t hd, int64_t T) {
  return std::sqrt(2.0) * reductions_rtol({hd, T, T});
}

}  // namespace stratagem::test
