// The step in flight: each micro-batch's tensors between its ops, the loss summed so far and
// the step's result (timings, memory samples).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "stratagem/executor.hpp"
#include "stratagem/moe_dispatch.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem {
class CpPass;  // src/runtime/context_parallel.hpp
}

namespace stratagem::exec {

// A residual-stream (or gradient) value that may still be in flight: value = base (+ add),
// ready once op `producer` has completed. The residual add of a tensor-parallel block waits
// for its reduction, so it happens where the value is next used.
struct Flow {
  Tensor base, add;
  int producer = -1;
  bool defined() const { return base.defined(); }
};

// An MoE layer's FFN between its ops (router, all-to-all, experts, all-to-all, combine).
struct MoeState {
  MoeActs acts;
  ExpertExchange exchange;      // ep > 1: who sends what to whom
  ExpertGather gather;          // etp > 1: the rows of each member of the expert_tp group
  Tensor rows;                  // the rows between two ops: permuted, or on their way back
  std::vector<int64_t> counts;  // rows of each held expert in `rows` (in expert order)
  Tensor xn;                    // the block's normalized input, the whole micro-batch's
  Tensor dy, d_weights;         // backward: the block output's gradient, the combine weights'
};

// A context-parallel attention pass in flight (ops_cp.cpp): what it keeps between its ops, and
// the ring's sends by step, which the next receive (K,V) or core step (dK,dV) waits for.
struct CpRun {
  Phase phase = Phase::forward;
  std::shared_ptr<CpPass> pass;
  int work = -1;                         // the Program's working buffer of the pass
  std::vector<int> kv_sends, dkv_sends;  // op index by step (-1: none yet)
};

// What one layer of one micro-batch keeps between its forward and its backward.
struct LayerState {
  Tensor x_in, x_mid;  // inputs of the attention and the mlp block (token shard under sp)
  AttentionActs attn;
  MlpActs mlp;
  MoeState moe;  // an MoE layer's FFN, in place of mlp's (its norm stays in mlp)
  CpRun cp;      // the attention's cp pass, between its first and its last op
};

struct Micro {
  std::vector<int32_t> tokens, targets, ids;  // ids: this rank's vocabulary-shard ids or -1
  bool embedded = false;                      // the lookup has run on this stage
  Flow fwd;                                   // forward residual stream
  Flow rec;                                   // full recompute's stream
  Tensor grad;                                // dL/d(stream) in backward (token shard under sp)
  int grad_producer = -1;
  std::map<int, LayerState> layers;
  Tensor partial;   // a block's partial output or input gradient, before its tp reduction
  Tensor gathered;  // a gathered (whole-sequence) normalized input
  Tensor gathered_dy;
  // head: final norm input/statistics, normalized input, logits and loss statistics
  Tensor x_final, xn, xn_whole, head_mean, head_rstd, logits, ce_max, ce_sums;
};

// A split backward's W of one block (Phase::weight_grad): the inputs and output gradients of
// its two GEMMs (qkv and proj, fc1 and fc2), views into the Program's buffers that W frees.
struct WeightGradInputs {
  Tensor inp[2], dout[2];
};

struct StepState {
  std::map<int, Micro> micro;  // by micro-batch index
  // What each B left for its W, by (layer, block, micro-batch).
  std::map<std::tuple<int, int, int>, WeightGradInputs> weight_grads;
  int64_t index = 0;         // the optimizer step, 0-based
  int64_t moved_bytes = -1;  // what the op being run moved, where counted (OpTiming)
  double loss_sum = 0;
  StepResult* result = nullptr;
  std::chrono::steady_clock::time_point t0;
};

}  // namespace stratagem::exec
