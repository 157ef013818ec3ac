// Per-layer and embedding costs for the strategy search, built on the cost model's public API
// (cost.hpp) the way the fast estimator composes a stage (src/cost/estimate.cpp): each
// Transformer layer is costed once per (strategy, samples per rank, group placement) and reused
// for every layer, stage, schedule and micro-batch count that shares them.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/search/stage_dp.hpp"
#include "stratagem/cluster.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/layer_cost.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"

namespace stratagem::search_detail {

// Where a stage's ranks sit, as the estimator places them (stratagem/layer_cost.hpp).
struct Geometry : cost_detail::Geometry {
  // Signature of a stage's placement for the given tp degrees (stages with equal signatures
  // cost every strategy alike).
  std::vector<int> signature(int stage, const std::vector<int>& tps, int cp = 1) const;
};

// What one Transformer layer costs one rank per micro-batch, and what it holds.
struct LayerCost {
  LayerStrategy st;
  int samples = 0;  // samples per rank per micro-batch
  // Time per micro-batch (seconds). busy: kernels (fwd, bwd, recompute) and the tensor-parallel
  // collectives compute waits for. The side streams run concurrently with it.
  double busy_s = 0;
  double kernel_s = 0;      // the kernels' part of busy_s (slowed by overlapping collectives)
  double interference = 1;  // the GPU's compute_comm_interference
  double dp_stream_s = 0;   // ZeRO-3 weight gathers and ZeRO-2/3 gradient reduce-scatters
  double h2d_stream_s = 0;  // offloaded weights and activations coming back
  double d2h_stream_s = 0;  // activations going to the host
  double fetch_s = 0;       // one fetch of the weights (not prefetchable at a pass's start)
  double act_h2d_s = 0;
  // The gradient reduction after the last micro-batch (all-reduce, or reduce-scatter with
  // ZeRO): hidden behind the backward of earlier layers, except for a stage's first layer.
  double reduce_s = 0;
  // Once per iteration: ZeRO-1/2 weight all-gather, optimizer step (device or host).
  double tail_s = 0;
  // Memory of one rank (bytes).
  int64_t states = 0;               // weights + gradients + optimizer states after ZeRO/offload
  int64_t kept = 0;                 // saved activations of one micro-batch kept until its backward
  int64_t transient = 0;            // extra bytes while the layer runs, beyond its kept activations
  int64_t workspace = 0;            // the runtime's scratch (layer_workspace_bytes)
  int64_t pipelined_workspace = 0;  // the same beside a pipeline
  int64_t boundary = 0;             // activation bytes passed to the next layer (reshard size)
  // Bytes its forward holds beyond its kept activations (the estimator's forward moment:
  // forward activations + buffers - kept; the search's lower bound).
  int64_t fwd_transient = 0;
  // A micro-batch's time on this layer: CostModel::overlapped_time_s of its parts.
  double step_s() const;
};

// The embedding (first stage) and LM head (last stage) under one embedding strategy.
struct EmbeddingCost {
  LayerStrategy st;
  int samples = 0;
  double first_busy_s = 0, last_busy_s = 0;  // per micro-batch
  double first_dp_stream_s = 0, last_dp_stream_s = 0;
  double first_tail_s = 0, last_tail_s = 0;   // per iteration
  int64_t first_states = 0, last_states = 0;  // bytes (both when one stage holds both)
  int64_t only_states = 0;                    // pp == 1: embedding and head on one stage
  double only_tail_s = 0, only_dp_stream_s = 0;
  int64_t logits = 0;  // fp32 logits kept through the loss
  // Gathered (ZeRO-3) or copied (offloaded) weights while the lookup, resp. the head, runs.
  int64_t emb_fetch_bytes = 0, head_fetch_bytes = 0;
  int64_t workspace = 0;
  // Bytes beyond the states while the embedding or the head of stage s (of pp) runs.
  int64_t transient(int s, int pp) const {
    const int64_t head = logits + head_fetch_bytes;
    if (pp == 1) return std::max(emb_fetch_bytes, head);
    return s == 0 ? emb_fetch_bytes : s == pp - 1 ? head : 0;
  }
};

// Everything the search needs about one (pp, stage micro-batch) pair: the raw per-layer
// strategies of a stage of D devices and their costs. Bm is the number of samples a
// micro-batch carries through the pipeline (Plan::micro_batch x max dp).
class CostTables {
 public:
  // cp_degrees: the context-parallel degrees above 1 the search tries.
  CostTables(const ModelSpec& m, const ClusterSpec& c, Dtype dtype, bool flash,
             bool overlap_grad_reduce, const FrameworkSpec& framework = FrameworkSpec{},
             const std::vector<int>& cp_degrees = {});
  const ModelSpec& model() const { return m_; }
  const ClusterSpec& cluster() const { return c_; }
  Dtype dtype() const { return dtype_; }
  bool flash() const { return flash_; }

  // `moe`: the expert groups' placement of an MoE layer (cost_detail::moe_nodes); the search
  // prices every layer of an MoE model as its MoE layers (assemble() gives the dense ones
  // ep = etp = 1, and the estimator then prices each layer as it is).
  LayerCost layer(const LayerStrategy& s, int samples, int tp_nodes, int dp_nodes,
                  const cost_detail::MoeNodes& moe = cost_detail::MoeNodes{},
                  int cp_nodes = 1) const;
  // The embedding and head of a pp-stage pipeline whose stages sit as `geo` places them.
  EmbeddingCost embedding(const LayerStrategy& s, int samples, const cost_detail::Geometry& geo,
                          int pp) const;
  // Reshard time per micro-batch from a layer of class a to one of class b (estimator rule):
  // tp grows: all-gather of b's boundary over b.tp/a.tp ranks; tp shrinks: of a's boundary.
  double reshard_s(const LayerCost& a, const LayerCost& b) const;
  // Device optimizer time per parameter, host (offloaded) optimizer time per parameter.
  double device_opt_s_per_param() const { return dev_opt_rate_; }
  double host_opt_s_per_param() const { return host_opt_rate_; }
  // The optimizer step of those model states at these rates (weights living on the host are
  // updated in place: no copy back).
  double optimizer_s(const ModelStates& st) const {
    return double(st.device_opt_params) * dev_opt_rate_ +
           double(st.host_opt_params - st.host_resident_params) * host_opt_rate_ +
           double(st.host_resident_params) * host_resident_opt_rate_;
  }
  const CostModel& cost() const { return cost_; }
  const std::vector<int>& cp_degrees() const { return cp_degrees_; }

 private:
  const ModelSpec& m_;
  const ClusterSpec& c_;
  Dtype dtype_;
  bool flash_;
  bool overlap_;
  double dev_opt_rate_ = 0, host_opt_rate_ = 0, host_resident_opt_rate_ = 0;
  std::vector<int> cp_degrees_;
  CostModel cost_;
  // The plan-wide choices the closed form prices layers with (layer_cost's plan): the search's
  // attention kernel, precision and gradient overlap, the default MoE routing.
  Plan pricing_;
};

// Candidate per-layer strategies of a stage of D devices with Bm samples per micro-batch,
// before pruning: tp a power of two up to the node (dividing heads, kv heads, ffn and D),
// dp = D/tp dividing Bm, sequence parallel, ZeRO 0-3 (only with dp > 1), recompute, offload.
struct SpaceFilter {
  std::vector<int> tp_degrees;  // empty: powers of two up to GPUs per node
  std::vector<int> zero_stages{0, 1, 2, 3};
  std::vector<Recompute> recompute{Recompute::none, Recompute::selective, Recompute::full};
  bool sequence_parallel_off = true;  // candidates without sp (tp > 1)
  bool sequence_parallel_on = true;   // candidates with sp (tp > 1)
  bool offload = true;
  int max_samples_per_rank = 64;
  int max_tp = 0;  // 0: the GPUs of a node (SearchOptions::allow_cross_node_tp raises it)
  // Context parallelism: cp > 1 fixes the layers' cp and tp (cp_tp; one tp and sequence
  // parallelism through a cp plan, as validate asks) and tries each kind the model allows.
  int cp = 1, cp_tp = 1;
  std::vector<CpKind> cp_kinds{CpKind::ring, CpKind::allgather, CpKind::a2a};
  bool flash_attention = false;  // selective recompute under cp needs it
};
// The context-parallel degrees the search tries (besides 1): `requested`, or by default the
// powers of two that leave each rank at least kCpMinTokensPerRank tokens of a sequence and
// divide the world.
inline constexpr int kCpMinTokensPerRank = 8192;
std::vector<int> cp_degrees_for(const ModelSpec& m, const ClusterSpec& c,
                                const std::vector<int>& requested);
std::vector<int> tp_degrees_for(const ModelSpec& m, const ClusterSpec& c, int D, int Bm,
                                const SpaceFilter& f);
std::vector<LayerStrategy> layer_candidates(const ModelSpec& m, const ClusterSpec& c, int D, int Bm,
                                            const SpaceFilter& f);
std::vector<LayerStrategy> embedding_candidates(const ModelSpec& m, const ClusterSpec& c, int D,
                                                int Bm, const SpaceFilter& f);

// Drops every layer cost that another one of the same (tp, sp) class matches or beats in all of
// busy, side streams, tail, states, kept and transient memory (the first in order survives
// among equals). Keeps the input order otherwise.
std::vector<LayerCost> prune_dominated(std::vector<LayerCost> in);
std::vector<EmbeddingCost> prune_dominated(std::vector<EmbeddingCost> in);

// The DP problem of one stage from its (pruned) layer costs: each item costs
// M x step + tail per iteration (+ the pass-end transfers when it is the stage's first or last
// layer) and
// holds states + k x kept resident (k micro-batches in flight), rounded up to buckets; reshard
// classes are the tp degrees, charged the larger (non-sequence-parallel) boundary; items beaten
// for this (M, k) by one of their class in cost, edge and every memory term are dropped.
// Item ids are indices into `costs`.
// Per class of `prob` (built from `costs`), M x the reshard from a layer of strategy `from`
// (the embedding) into the class: the stage's entry costs.
std::vector<double> entry_costs(const CostTables& tables, const std::vector<LayerCost>& costs,
                                const StageDpProblem& prob, const LayerStrategy& from,
                                int from_samples, double M);
StageDpProblem stage_problem(const CostTables& tables, const std::vector<LayerCost>& costs,
                             double M, double k, int n_max, int64_t bucket_bytes,
                             int64_t max_budget_bytes, int max_tr_classes, int max_kept_levels,
                             bool exact);

}  // namespace stratagem::search_detail
