// One Transformer layer on one rank, per micro-batch: its kernels, the collectives and copies
// its strategy adds, its model states and its activation bytes, and the embedding's and head's.
// The fast estimator (src/cost/plan_costs.cpp) composes stages from these and the strategy
// search (src/search/) builds its tables from them, so the two cannot drift apart. Every figure
// mirrors what the Program generator emits for the layer (src/core/program.cpp) and is priced by
// the CostModel. Implemented in src/cost/ (layer_cost.cpp, moe_layer_cost.cpp); the pieces only
// the estimator composes stay in src/cost/layer_cost.hpp.
#pragma once
#include <cstdint>

#include "stratagem/cost.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/rank_geometry.hpp"

namespace stratagem::cost_detail {

// Where a stage's ranks sit and the nodes their groups span: the Layout's rank orders.
using Geometry = RankGeometry;

// The AdamW step (iteration.hpp's templates) over `params` parameters: on the device, or
// offloaded (the gradients down over PCIe, the host step, the updated weights back up, except
// the `host_resident` of them whose weights live on the host: ModelStates::host_resident_params,
// updated in place).
double optimizer_step_s(const CostModel& cost, int64_t params);
double host_optimizer_step_s(const CostModel& cost, int64_t params, int64_t host_resident = 0);

// A strategy's data-parallel gradient synchronisation (iteration.hpp's grad_sync) of `params`
// parameters over a dp group spanning dp_nodes nodes.
struct GradSyncCost {
  double reduce_s = 0;  // one reduction: per micro-batch (ZeRO-2/3) or once after the last
  bool per_microbatch = false;
  double gather_s = 0;  // the gather of the updated weights after the step (ZeRO-1/2)
};

// Samples moving between ranks where the stream's holding changes (LayerStrategy::stream_tp)
// from a layer of strategy `from` (`from_samples` per rank) to one of `to`, as the Program's
// reshard: an all-gather of the boundary activations in forward when the replicas holding a
// whole stream grow, in backward when they shrink (at most one of the two is non-zero).
struct ReshardCost {
  double fwd_s = 0, bwd_s = 0;
};
ReshardCost reshard_cost(const CostModel& cost, const LayerStrategy& from, int from_samples,
                         const LayerStrategy& to, int to_samples);

// Nodes spanned by an MoE layer's expert groups on a stage (src/cost/moe_layer_cost.cpp): the
// all-to-all's ep group, the expert data-parallel group, the expert-tensor group. A layer with
// `moe` false is a dense layer.
struct MoeNodes {
  bool moe = false;
  int ep = 1, expert_dp = 1, expert_tp = 1;
  bool operator==(const MoeNodes&) const = default;
};
MoeNodes moe_nodes(const Geometry& geo, int stage, const LayerStrategy& s, bool moe);

struct LayerCost {
  // Kernels per micro-batch (seconds on one rank).
  double fwd_s = 0, bwd_s = 0, rec_s = 0;
  // An MoE layer's all-to-alls and expert-tensor collectives (stream ep_comm), which compute
  // waits for, in the forward, backward and recompute.
  double ep_fwd_s = 0, ep_bwd_s = 0, ep_rec_s = 0;
  // Tensor-parallel collectives compute waits for, in the forward, backward and recompute.
  double tp_fwd_s = 0, tp_bwd_s = 0, tp_rec_s = 0;
  // Context-parallel communication compute waits for (cp_cost.hpp), in the same phases.
  double cp_fwd_s = 0, cp_bwd_s = 0, cp_rec_s = 0;
  double fetch_s = 0;  // one fetch of the weights: ZeRO-3 all-gather (dp) or h2d copy
  bool fetch_on_h2d = false;
  double grad_rs_mb_s = 0;              // ZeRO-2/3 reduce-scatter after every micro-batch
  double grad_reduce_s = 0;             // ZeRO-0/1 all-reduce / reduce-scatter after the last one
  double gather_s = 0;                  // ZeRO-1/2 all-gather after the step
  double act_d2h_s = 0, act_h2d_s = 0;  // offloaded activations, each way
  ModelStates states;
  int64_t kept = 0;                  // saved activations resident until backward
  int64_t staged_bytes = 0;          // gradients staged for a ZeRO-2/3 reduce-scatter
  int64_t piece_bytes = 0;           // the piece that reduce-scatter receives
  int64_t workspace = 0;             // the runtime's scratch (layer_workspace_bytes)
  int64_t pipelined_workspace = 0;   // the same beside a pipeline
  int64_t fwd_act = 0, fwd_buf = 0;  // this layer's bytes at its forward's worst moment
  // ... at its backward's two moments: the mlp backward (with the fetched weights), and the
  // attention backward, beside which the layer below's weights are already being fetched
  // (add that layer's fetch to bwd_buf there).
  int64_t bwd_mlp_act = 0, bwd_attn_act = 0, bwd_buf = 0;
  // An MoE layer's experts under ZeRO-3 over an expert data-parallel group: their gathered
  // weights, live beside the layer's own fetch while the experts run in forward and from the
  // recompute (or the mlp backward) to the experts' backward. Their staged gradients are in
  // staged_bytes (held as the layer's); expert_piece_bytes: the piece their reduce-scatter
  // receives, live from its issue, after the attention backward, to the dense reduction's.
  int64_t expert_fetch_bytes = 0, expert_piece_bytes = 0;
  // A split backward (zb schedules): the part of bwd_s that is W, and what the layer holds from
  // its B to its W (weight_input_bytes and weight_stash_bytes of both blocks, and under full
  // recompute the rebuilt activations, which hold the GEMMs' inputs).
  double weight_grad_s = 0;
  int64_t weight_held_bytes = 0;
};

// Bringing a strategy's non-resident parameters to the device before use: the ZeRO-3
// all-gather over dp (after a PCIe copy of the shard when it is offloaded too), or the PCIe copy
// of offloaded parameters. Nothing when they are resident.
struct FetchCost {
  int64_t bytes = 0;  // device buffer of the gathered / copied parameters
  double time_s = 0;
  bool on_h2d = false;  // the copy runs on the h2d stream, not the dp stream
};

// The embedding (first stage) and the LM head with its loss (last stage), per micro-batch.
struct EmbeddingHeadCost {
  double emb_fwd_s = 0, emb_bwd_s = 0;  // lookup; zero + scatter-add
  double emb_tp_s = 0;                  // vocabulary-parallel sum of the lookup (tp > 1)
  double head_fwd_s = 0, head_bwd_s = 0;
  double head_tp_s = 0;      // sequence gather, loss statistics and input-gradient reduction
  double head_tp_bwd_s = 0;  // the part of head_tp_s in backward
  int64_t logits_bytes = 0;  // fp32 logits alive from the loss forward to its backward
  int64_t loss_transient_bytes = 0;  // beside them during the loss forward (FrameworkSpec)
  FetchCost emb_fetch;               // before the lookup (its backward reads no weights)
  FetchCost head_fetch;              // before the head's forward, kept through its backward
};
EmbeddingHeadCost embedding_head_cost(const CostModel& cost, const LayerStrategy& es, int samples,
                                      int tp_nodes, int dp_nodes, bool with_time);

// What the embedding and the LM head add to a stage that holds them (stage 0 the embedding,
// stage pp - 1 the head, one stage both when pp == 1), as the Program's setup and gradient
// reductions: the one rule of the estimator and the search. Without time only the bytes.
struct EndStates {
  int64_t params = 0;  // embedding and head parameters on one rank (end_parameters_per_rank)
  ModelStates states;  // their weights, gradients and optimizer states
  GradSyncCost sync;   // their data-parallel gradient synchronisation, over stage's dp group
};
EndStates end_states(const CostModel& cost, const LayerStrategy& es, bool embedding, bool head,
                     const Geometry& geo, int stage, bool with_time);

// Tied word embeddings over pp > 1 stages: the first and the last stage sum their copies'
// gradients once per iteration (the Program's tied_reduce), an all-reduce over the Layout's
// tied_embedding group, the same local rank of stage 0 and stage pp - 1. Zero when untied or
// pp == 1.
double tied_embedding_reduce_s(const CostModel& cost, int embedding_tp, int pp,
                               const Geometry& geo);

// `samples` per rank per micro-batch; tp_nodes and dp_nodes: nodes its groups span. Without
// `with_time` only the bytes are filled in.
LayerCost layer_cost(const CostModel& cost, const Plan& plan, const LayerStrategy& s, int samples,
                     int tp_nodes, int dp_nodes, bool with_time, const MoeNodes& moe = MoeNodes{},
                     int cp_nodes = 1);

}  // namespace stratagem::cost_detail
