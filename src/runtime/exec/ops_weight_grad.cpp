// A split backward (the zero-bubble schedules): B computes a block's input gradient and leaves
// its GEMMs' inputs and output gradients; W, wherever the schedule places it, accumulates the
// weight gradients from them, in the order the unsplit backward would (so the sums are the
// same to the bit).
#include <stdexcept>

#include "src/runtime/exec/ops_compute.hpp"
#include "src/runtime/exec/rank_context.hpp"

namespace stratagem::exec {

int ComputeOps::weight_kept_buffer(const Op& op) const {
  if (op.phase != Phase::forward) return -1;
  return rank_.buffers.find(op.block, Phase::weight_grad, op.layer, op.microbatch);
}

// The block's output gradient (the second GEMM's) and the first GEMM's, from the workspace,
// into the buffer the Program gave B for them; under sequence parallelism the gathered input
// too (forward kept only this rank's shard). The other inputs are in forward's kept buffer,
// or under full recompute in the rebuilt activations, which the Program keeps until W.
void ComputeOps::keep_for_weight_grad(const Op& op, const Tensor& xn, const Tensor& dy) {
  const LayerShare& sh = rank_.share(op.layer);
  const LayerState& ls = rank_.mb(op.microbatch).layers.at(op.layer);
  const bool attn = op.block == Block::attention;
  const int stash = rank_.buffers.of(op.block, Phase::backward, op.layer, op.microbatch);
  auto keep = [&](const Tensor& t) {
    Tensor c = rank_.buffers.pool.take(stash, t.shape);
    rank_.backend.copy(c, t);
    return c;
  };
  WeightGradInputs in;
  in.dout[1] = keep(dy);
  in.dout[0] = keep(attn ? attention_grads(sh.local, *sh.ws, sh.samples, rank_.T).d_qkv
                         : mlp_fc1_grad(sh.local, *sh.ws, sh.samples, rank_.T));
  in.inp[0] = sh.sequence_parallel ? keep(xn) : xn;
  in.inp[1] = attn ? ls.attn.out : ls.mlp.act_out;
  rank_.current_step.weight_grads[{op.layer, int(op.block), op.microbatch}] = in;
}

void ComputeOps::block_weight_grad(const Op& op) {
  auto it = rank_.current_step.weight_grads.find({op.layer, int(op.block), op.microbatch});
  if (it == rank_.current_step.weight_grads.end())
    throw std::logic_error("executor: " + op_name(op) + " without its B");
  const WeightGradInputs& in = it->second;
  const LayerWeights& w = rank_.shards.model.weights.layer(op.layer);
  LayerWeights& g = rank_.shards.model.grad_weights.layer(op.layer);
  Tensor none;
  Backend& be = rank_.backend;
  // As the unsplit backward: the second GEMM's, then the first's.
  if (op.block == Block::attention) {
    be.matmul_backward(none, g.proj_w, g.proj_b, in.dout[1], in.inp[1], w.proj_w);
    be.matmul_backward(none, g.qkv_w, g.qkv_b, in.dout[0], in.inp[0], w.qkv_w);
  } else {
    be.matmul_backward(none, g.fc2_w, g.fc2_b, in.dout[1], in.inp[1], w.fc2_w);
    be.matmul_backward(none, g.fc1_w, g.fc1_b, in.dout[0], in.inp[0], w.fc1_w);
  }
  rank_.current_step.weight_grads.erase(it);
}

}  // namespace stratagem::exec
