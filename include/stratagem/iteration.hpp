// One training iteration as op templates: what each part of it (a layer's gradient
// synchronisation and weight fetch, the embedding, the LM head and loss, the optimizer step, the
// model states) computes, moves, fetches and holds on one rank, without its place in the
// schedule. The Program generator (program.cpp) arranges these templates into each stage's op
// stream; the estimator (src/cost/) and the search (src/search/) price the same templates
// through CostModel. Each ZeRO, offload, head and optimizer rule is written here once, beside
// the block work of workload.hpp.
#pragma once
#include <cstdint>

#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/program.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

// ---- model states -----------------------------------------------------------------------

// Optimizer-state bytes per parameter: fp32 master + two Adam moments (12), or the two moments
// alone when the weights are already fp32 (8).
inline int64_t optimizer_bytes_per_param(Dtype d) {
  return d == Dtype::fp32 ? 8 : 12;
}

// Model states of parameters under their strategies, as the Program's setup allocates them:
// weights and gradients in the plan's dtype, optimizer states after ZeRO, nothing on the
// device for what is offloaded; and the parameters each optimizer (device, host) updates.
struct ModelStates {
  int64_t weights = 0, grads = 0, optimizer = 0;       // device bytes
  int64_t device_opt_params = 0, host_opt_params = 0;  // parameters each optimizer updates
  // Of host_opt_params, those whose weights live on the host too (offloaded parameters): the
  // host step updates them in place, nothing is copied back.
  int64_t host_resident_params = 0;
  // `grad_bytes`: the gradient buffer's element size (FrameworkSpec::grad_buffer_bytes; 0: dt's).
  void add(const LayerStrategy& s, int64_t params, Dtype dt, int grad_bytes = 0);
  ModelStates& operator+=(const ModelStates& o) {
    weights += o.weights, grads += o.grads, optimizer += o.optimizer;
    device_opt_params += o.device_opt_params, host_opt_params += o.host_opt_params;
    host_resident_params += o.host_resident_params;
    return *this;
  }
};

// ---- optimizer --------------------------------------------------------------------------

// AdamW costs 12 FLOPs a parameter (fp32, on CUDA cores or the host) and streams the weights,
// the gradients and the optimizer states through memory, read and written.
inline constexpr double kAdamwFlopsPerParam = 12.0;
// The device step over `params` parameters: a compute op of block optimizer.
Op adamw_op(int64_t params, Dtype dt);
// The offloaded step over `params` parameters: a host_compute op. Around it the gradients go
// down and the updated weights come back, `params * dtype_bytes(dt)` bytes each way.
Op adamw_host_op(int64_t params, Dtype dt);

// ---- tensor parallelism -------------------------------------------------------------------

// The tensor-parallel collectives around block b (attention, mlp, embedding or head) in a phase,
// each of the whole token stream (token_stream_bytes) over the tp group (Megatron-LM); none at
// tp 1. A layer block: under sequence parallelism all-gathers before it (backward gathers twice:
// the output gradient and the sequence-sharded normalized input its weight gradient needs) and a
// reduce-scatter after it, otherwise an all-reduce after it. The embedding reduces its
// vocabulary-parallel lookup after the forward and gathers the sharded gradient before its
// backward; the head gathers its input before the forward and reduces its input gradient after
// the backward. (The loss's own all-reduces are in HeadOps.)
struct TpComm {
  int gathers = 0;  // all-gathers before the block
  Collective after = Collective::none;
};
TpComm tp_comm(const LayerStrategy& s, Block b, Phase ph);

// Between two layers (or a layer and the LM head, which works in the embedding's (tp, dp)) held
// differently (LayerStrategy::stream_tp), the token stream moves: when the replicas holding a
// whole stream grow from `from`'s to `to`'s, their ranks all-gather it over to/from ranks; when
// they shrink, each takes a slice (no collective). Returns the all-gather's size, 0 for none.
// Degrees that do not divide one another are no all-gather (validate rejects such plans).
inline int reshard_gather_ranks(const LayerStrategy& from, const LayerStrategy& to) {
  const int a = from.stream_tp(), b = to.stream_tp();
  return a < b && b % a == 0 ? b / a : 0;
}

// ---- context parallelism ------------------------------------------------------------------

// What a cp layer's attention moves over its cp group in one phase (forward and recompute alike;
// see program_cp.cpp for the ops), on one rank of `samples` samples (seq_len / cp tokens each):
//  - ring (Megatron-Core's AttnFuncWithCPAndKVP2P): K and V pass to the next rank cp - 1 times,
//    `kv_bytes` each, beside the core step of the block at hand; backward also passes the dK and
//    dV accumulators cp times (the last hop brings each home).
//  - allgather (Llama 3, Megatron-Core's all_gather): an all-gather of K and V before the core
//    (`before`, the gathered cp x kv_bytes); backward gathers again and reduce-scatters dK, dV
//    after the core backward (`after`).
//  - a2a (DeepSpeed-Ulysses): an all-to-all of Q, K, V before the core and one of the output
//    after it (backward: of the output gradient before, of dQ, dK, dV after); bytes are what a
//    rank sends, its whole local tensor.
// `buffer_bytes` is what the kind holds beside the saved activations while the core runs (the
// ring's double buffers, the gathered K and V, the head-split copies; under full recompute the
// forward's Q, K, V, output and statistics, which it does not keep).
struct CpComm {
  int kv_steps = 0, dkv_steps = 0;  // ring transfers to the next rank
  int64_t kv_bytes = 0;             // one rank's K and V (also the dK, dV block)
  Collective before = Collective::none, after = Collective::none;
  int64_t before_bytes = 0, after_bytes = 0;
  int64_t buffer_bytes = 0;
};
CpComm cp_comm(const ModelSpec& m, const LayerStrategy& s, int samples, Phase ph, Dtype dt);

// ---- data parallelism ---------------------------------------------------------------------

// A strategy's data-parallel gradient synchronisation: the reduction (none without data
// parallelism), whether it runs after every micro-batch (ZeRO-2/3: only a shard of the
// gradients is kept) or once after the last, and whether the updated weights are gathered
// after the optimizer step (ZeRO-1/2: each rank updated a shard). Bytes are the parameters'
// in the plan's dtype; the CostModel prices gradient reductions at the framework's element size.
struct GradSync {
  Collective reduce = Collective::none;
  bool per_microbatch = false;
  bool gather_after_step = false;
};
inline GradSync grad_sync(const LayerStrategy& s) {
  GradSync g;
  if (s.dp_cp() == 1) return g;
  g.reduce = s.zero == 0 ? Collective::all_reduce : Collective::reduce_scatter;
  g.per_microbatch = s.zero >= 2;
  g.gather_after_step = s.zero == 1 || s.zero == 2;
  return g;
}
// Bytes a rank receives from that reduction when it is a reduce-scatter (0 otherwise): its piece
// of the sum, which MPI's reduce-scatter (and NCCL's out-of-place form) writes beside the shard
// before it is added or copied there. The Program allocates it (category buffers) from the
// reduction's issue until it lands.
inline int64_t receive_piece_bytes(const LayerStrategy& s, int64_t params, Dtype dt) {
  return grad_sync(s).reduce == Collective::reduce_scatter
             ? (params + s.dp_cp() - 1) / s.dp_cp() * dtype_bytes(dt)
             : 0;
}

// Bringing non-resident parameters to the device before use: under ZeRO-3 (dp > 1) an
// all-gather of `bytes` over dp, after a PCIe copy of the rank's shard (`h2d_bytes`) when they
// are offloaded too; offloaded parameters alone: a PCIe copy of them all. Nothing (bytes 0)
// when they are resident. `bytes` is the device buffer the fetch fills.
struct WeightFetch {
  int64_t bytes = 0;
  int64_t h2d_bytes = 0;
  bool gathers = false;
};
WeightFetch weight_fetch(const LayerStrategy& s, int64_t params, Dtype dt);

// ---- embedding and LM head ----------------------------------------------------------------

// Parameters of the embedding and LM head a stage holds (first: the embeddings, last: the
// head), as embedding_parameters_per_rank / head_parameters_per_rank; with tied embeddings a
// last stage that is not also the first keeps its own copy of the word embedding (Megatron-LM),
// whose gradients are summed with the first stage's before the optimizer step.
int64_t end_parameters_per_rank(const ModelSpec& m, int tp, bool first, bool last);
// Bytes of that sum of the tied word embedding's gradients between the first and last stage.
int64_t tied_embedding_reduce_bytes(const ModelSpec& m, int tp, Dtype dt);

// The lookup (forward) or its zero + scatter-add (backward) of `samples` samples: a compute op
// of block embedding moving the stream's bytes twice.
Op embedding_op(const ModelSpec& m, int samples, Phase ph, Dtype dt, int cp = 1);

// The LM head and loss of `samples` samples on a rank of tensor degree tp: the logits GEMM and
// the loss (forward), their gradients (backward), over the vocabulary shard.
struct HeadOps {
  Op forward, backward;      // compute ops of block head
  int64_t logits_bytes = 0;  // fp32 logits, alive from the loss forward to its backward
  // Vocabulary-parallel cross entropy (tp > 1, Megatron-LM): two all-reduces over the tp group
  // per micro-batch, of the row maximum, then of the sum of exponentials and the target logit.
  int64_t loss_max_bytes = 0, loss_sum_bytes = 0;
};
HeadOps head_ops(const ModelSpec& m, int tp, int samples, Dtype dt, int cp = 1);

}  // namespace stratagem
