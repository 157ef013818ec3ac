// What an MoE layer's FFN computes, moves and holds on one rank (src/core/workload_moe.cpp),
// beside workload.hpp's dense blocks: the one rulebook the Program (program_moe.cpp), the
// estimator (src/cost/) and the search read.
//
// The shape of the work, following Megatron-Core's alltoall token dispatcher
// (megatron/core/transformer/moe/token_dispatcher.py):
//  - a rank routes its 1/tp slice of the micro-batch's tokens (its sequence shard under
//    sequence parallelism): R = samples x seq_len / tp tokens, C = R x top_k copies;
//  - the dispatch all-to-all over the ep group sends each copy to the rank holding its expert;
//    with etp > 1 the copies are then all-gathered over the expert-tensor group, so that each
//    of the etp ranks holding a shard of the same experts sees them all;
//  - each rank runs its experts / ep experts as one grouped GEMM, etp x ep x C / experts rows
//    per expert when the routing is balanced (Plan::expert_load_factor scales the busiest rank's);
//  - the combine reverses it (reduce-scatter over etp, all-to-all over ep) and sums each
//    token's top_k outputs weighted by the router's scores;
//  - shared experts are a dense FFN of shared_experts x expert_ffn_hidden, split over tp as a
//    dense mlp block is; the block's tensor-parallel collectives are the dense mlp's.
#pragma once
#include <cstdint>

#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

struct MoeShape {
  int64_t tokens = 0;         // R: tokens the rank routes (samples x seq_len / tp)
  int64_t copies = 0;         // C: R x top_k rows the rank dispatches
  int64_t local_experts = 0;  // experts / ep
  int64_t expert_rows = 0;    // rows per local expert (etp x ep x C / experts, x the load)
  int64_t expert_width = 0;   // expert_ffn_hidden / etp
  int64_t shared_width = 0;   // shared_experts x expert_ffn_hidden / tp
};
// `load`: the rank's load over the mean (1.0 balanced; the cost model passes the busiest's).
MoeShape moe_shape(const ModelSpec& m, const LayerStrategy& s, int samples, double load = 1.0);

// The three compute parts of an MoE FFN (Block::router, experts, combine), forward.
struct MoeWork {
  BlockWork router, experts, combine;
  const BlockWork& part(Block b) const;
  double flops() const { return router.flops() + experts.flops() + combine.flops(); }
  double elementwise_bytes() const {
    return router.elementwise_bytes + experts.elementwise_bytes + combine.elementwise_bytes;
  }
};
MoeWork moe_forward_work(const ModelSpec& m, const LayerStrategy& s, int samples,
                         double load = 1.0);
MoeWork moe_backward_work(const ModelSpec& m, const LayerStrategy& s, int samples,
                          double load = 1.0);

// Bytes of one dispatch (or combine) all-to-all a rank sends over its ep group: its C copies
// of the hidden state. The expert-tensor all-gather (and reduce-scatter) moves etp times that.
int64_t moe_dispatch_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt);
int64_t moe_expert_tp_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt);

// Under tp > 1 each tp rank routes its 1/tp slice of the micro-batch's tokens (the slice it
// holds under sequence parallelism): what the router computes from all the tokens is summed
// over the tp group. In forward (and recompute) the load-balancing loss's sums, copies per
// expert and summed probabilities, 2 x experts in fp64 (0 without the loss or at tp 1); once
// the gradients are final, the router weight's gradient (moe_router_parameters).
int64_t moe_aux_sums_bytes(const ModelSpec& m, const LayerStrategy& s);
int64_t moe_router_parameters(const ModelSpec& m);

// Parameters of an MoE FFN on one rank: the part every rank of the dp group holds as a dense
// layer's (norm, router, shared experts split over tp), and the experts' (experts / ep experts,
// each split over etp), which are reduced and sharded over the expert data-parallel group.
int64_t moe_dense_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s);
int64_t moe_expert_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s);
// The strategy under which the experts' states are kept: data parallel over the expert
// data-parallel group (Plan's expert_dp), with the layer's ZeRO stage and offload.
LayerStrategy expert_strategy(const LayerStrategy& s);

// Activations an MoE FFN keeps for backward (as kept_activation_bytes for Block::mlp: the
// norm's statistics included; full recompute keeps none, its layer input is the attention's).
// `load` is the rank's expert load over the balanced mean (Plan::expert_load_factor): the
// busiest rank's experts keep that many times the mean rows, and a forecast of peak memory is
// the busiest rank's.
int64_t moe_kept_activation_bytes(const ModelSpec& m, const LayerStrategy& s, int samples,
                                  Recompute rc, Dtype dt, double load);
// The expert path's transients at their peak (the runtime carves them from its workspace
// arena, src/runtime/exec/ops_moe.cpp): the experts' backward, with the gradients of their
// output and input rows and the d_fc1 and d_act of every row, or where larger the etp
// all-gather's backward or the router's with the shared experts; `load` as above.
int64_t moe_expert_workspace_bytes(const ModelSpec& m, const LayerStrategy& s, int samples,
                                   Dtype dt, double load);
// The runtime's scratch while an MoE layer runs: layer_workspace_bytes with the expert path's
// (moe_expert_workspace_bytes) in place of the dense FFN's gradients.
int64_t moe_layer_workspace_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt,
                                  double load, bool pipelined = false);

// Layer `layer`'s parameters on a rank of strategy s: dense layers as
// layer_parameters_per_rank; MoE layers the attention, the FFN's dense part and its experts.
int64_t layer_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s, int layer);
// Of those, the ones reduced over the dp group (all but an MoE layer's experts when etp x ep
// > 1; with etp x ep = 1 the experts are held whole by every rank and reduced with the rest).
int64_t dp_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s, int layer);
// ... and the ones reduced over the expert data-parallel group (0 when none).
int64_t expert_dp_parameters_per_rank(const ModelSpec& m, const LayerStrategy& s, int layer);

}  // namespace stratagem
