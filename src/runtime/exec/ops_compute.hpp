// The compute ops of the Program on this rank (exec/ops_compute.cpp): the embedding, the
// Transformer blocks, the head and its loss, the optimizer step, on the micro-batch's tensors
// in the Program's buffers. The other handlers finish here what their transfers complete: a
// block's input norm before its gather, its backward after its input gradient's reduction,
// the head's loss after its statistics' reductions.
#pragma once
#include "src/runtime/exec/handlers.hpp"
#include "src/runtime/exec/step_state.hpp"
#include "stratagem/program.hpp"

namespace stratagem::exec {

class ComputeOps {
 public:
  ComputeOps(RankContext& rank, Dispatcher& dispatcher, CpOps& cp, MoeOps& moe, CommOps& comm)
      : rank_(rank), dispatcher_(dispatcher), cp_(cp), moe_(moe), comm_(comm) {}

  void run(const Op& op);
  // The residual stream's value (base + add, once its producer has landed) in `buffer`.
  Tensor materialize(Flow& f, int buffer, Shape shape);
  // The block's input and its norm (under sequence parallelism, called by the gather after).
  void block_input(const Op& op, Micro& m, LayerState& ls);
  void drop_unsaved_block_input(const Op& op, LayerState& ls);
  // The norm's backward, once the gradient of its output is whole (after a tp reduction).
  void finish_block_backward(int layer, Block b, Micro& m, const Tensor& d_xn);
  void norm_head_input(Micro& m);
  void head_loss_sums(Micro& m);
  void head_loss(Micro& m);
  void finish_head_backward(Micro& m, const Tensor& d_xn);
  void stage_gradients(int layer);  // ZeRO-2: bind the layer's gradients to fresh staging

 private:
  bool attention_keeps_probs(const Op& op) const;
  void block_forward(const Op& op);
  void block_backward(const Op& op);
  // A split backward (exec/ops_weight_grad.cpp): the buffer forward keeps W's inputs in (-1:
  // none), what B leaves for W, and W.
  int weight_kept_buffer(const Op& op) const;
  void keep_for_weight_grad(const Op& op, const Tensor& xn, const Tensor& dy);
  void block_weight_grad(const Op& op);
  void embedding_forward(const Op& op);
  void embedding_backward(const Op& op);
  void head_forward(const Op& op);
  void head_backward(const Op& op);
  void optimizer_step();

  RankContext& rank_;
  Dispatcher& dispatcher_;
  CpOps& cp_;
  MoeOps& moe_;
  CommOps& comm_;
};

}  // namespace stratagem::exec
