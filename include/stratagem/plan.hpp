// Plan: a training strategy. Global choices (pipeline, schedule, batch) plus one LayerStrategy
// per Transformer layer, so consecutive layers may differ in every per-layer field (Galvatron).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/model.hpp"

namespace stratagem {

// zb_h1, zb_h2: the zero-bubble pipelines (Qi et al., ICLR'24, arXiv 2401.10241) that split
// each backward into B (input gradient) and W (weight gradient) and defer W into the bubbles.
enum class Schedule { gpipe, one_f_one_b, interleaved, zb_h1, zb_h2 };
// The schedules whose backward runs in two passes, B and W (schedule.hpp).
inline bool splits_backward(Schedule s) {
  return s == Schedule::zb_h1 || s == Schedule::zb_h2;
}
enum class Recompute : uint8_t { none, selective, full };
const char* to_string(Schedule s);
const char* to_string(Recompute r);
// How a context-parallel layer's attention sees the whole sequence: K and V blocks passed
// around the cp group (Megatron-Core's ring), gathered before attention (Llama 3), or traded
// for a head split by two all-to-alls (DeepSpeed-Ulysses).
enum class CpKind : uint8_t { ring, allgather, a2a };
const char* to_string(CpKind k);
// A cp kind's name (as in plan files and flags); `where` names it in errors.
CpKind cp_kind_from(const std::string& s, const std::string& where);

struct LayerStrategy {
  int tp = 1;
  int dp = 1;
  bool sequence_parallel = false;
  int zero = 0;  // 0..3
  Recompute recompute = Recompute::none;
  bool offload_optimizer = false;
  bool offload_params = false;
  bool offload_activations = false;
  // Context parallelism: the sequence split over cp ranks (between tp and dp in the Layout).
  int cp = 1;
  CpKind cp_kind = CpKind::ring;
  // Expert parallelism of an MoE layer's experts: ep ranks hold experts / ep experts each, and
  // each expert's FFN is split over etp ranks (Megatron-Core's expert tensor parallelism).
  int ep = 1;
  int etp = 1;

  // How the stage's ranks hold the residual stream between layers: split over replicas of tp
  // ranks that each hold their replica's whole stream, or, under sequence parallelism, one
  // token shard per rank, which is how a tp 1 layer over the same ranks holds it (rank i of a
  // stage holds piece i of the stage's micro-batch either way). Reshards go where this differs.
  int stream_tp() const { return sequence_parallel && tp > 1 ? 1 : tp; }
  // Ranks holding the same weights: the dp replicas and, inside each, the cp ranks that split
  // its sequence. Gradients are reduced, and ZeRO shards spread, over all of them (Megatron-
  // Core's data-parallel group "with context parallel"); the Layout's dp group is these ranks.
  int dp_cp() const { return dp * cp; }

  bool operator==(const LayerStrategy&) const = default;
  std::string describe() const;  // e.g. "tp8 dp8 sp z1 rc=full"
};

struct LayerRange {
  int begin = 0;  // first layer (inclusive)
  int end = 0;    // one past the last layer
  int size() const { return end - begin; }
  bool operator==(const LayerRange&) const = default;
};

struct Plan {
  int pp = 1;
  Schedule schedule = Schedule::one_f_one_b;
  int vpp = 1;  // virtual stages per pipeline rank (interleaved only)
  // Interleaved: micro-batches each chunk runs in a row (Megatron-Core's
  // microbatch_group_size_per_vp_stage); 0: pp, or where the micro-batches are not a multiple
  // of pp the smallest group Megatron-Core accepts (interleaved_group).
  int microbatch_group = 0;
  // Model chunks: pp*vpp layer ranges in order; chunk c runs on pipeline stage c % pp.
  std::vector<LayerRange> chunks;
  int micro_batch = 1;   // samples per micro-batch per replica of the widest-dp layer
  int global_batch = 1;  // samples per iteration
  Dtype dtype = Dtype::bf16;
  bool flash_attention = false;
  bool overlap_grad_reduce = true;  // data-parallel reduction overlaps backward (PyTorch DDP)
  // ZeRO-3 / offloaded weights of the layer below are fetched during a layer's attention
  // backward, ahead of its gradient reduction (FSDP's BACKWARD_PRE): faster, and one more
  // layer's weights held. Off: fetched when that layer starts, behind the reduction.
  bool backward_prefetch = true;
  std::vector<LayerStrategy> layers;  // one per Transformer layer
  LayerStrategy embedding;            // embedding and LM head (tp/dp/zero apply)
  // Mixture-of-Experts routing as the plan expects it (src/core/plan_moe.cpp): how many times
  // the mean load the busiest expert rank receives (1.0 = balanced), the capacity factor that
  // caps it (0: dropless), and the node-limited routing of DeepSeek-V3 (each token sent to at
  // most this many nodes; 0: no limit).
  double routing_imbalance = 1.0;
  double capacity_factor = 0.0;
  int moe_node_limit = 0;
  // The load the busiest of the ep ranks holding `experts` experts carries, in units of the
  // mean. routing_imbalance is the busiest expert's; a rank holding experts / ep of them
  // averages it down, from that at ep = experts to 1 at ep = 1 (every rank holds all experts
  // and computes its own tokens' copies); the capacity factor caps it.
  double expert_load_factor(int ep, int experts) const;
  // The routing_imbalance whose expert_load_factor(ep, experts) is `rank_load` (what a run
  // measured: train prints it), so that a forecast can be given the load a run saw.
  static double routing_imbalance_for(double rank_load, int ep, int experts);

  int devices_per_stage() const;  // tp*cp*dp of every layer (validated equal)
  int world_size() const { return pp * devices_per_stage(); }
  int max_dp() const;
  int num_microbatches() const;  // global_batch / (micro_batch * max_dp)
  // The interleaved schedule's group of `microbatches` micro-batches (microbatch_group, or
  // interleaved_group's choice when it is 0).
  int microbatch_group_size(int microbatches) const;
  // Samples a rank of a layer with data-parallel degree dp processes per micro-batch.
  int samples_per_rank(int dp) const { return micro_batch * max_dp() / dp; }
  int stage_of_chunk(int chunk) const { return chunk % pp; }
  bool uniform() const;          // all layers share one strategy
  std::string describe() const;  // one line
};

// Megatron-style shorthand: uniform strategy over all layers, even stage split.
struct PlanShorthand {
  std::optional<int> tp, pp, dp, cp, micro_batch, global_batch, vpp, zero, microbatch_group;
  std::optional<std::string> recompute, schedule, dtype, offload, cp_kind;
  std::optional<int> ep, etp, moe_node_limit;  // MoE layers only (dense layers keep 1)
  std::optional<double> routing_imbalance, capacity_factor;
  bool sequence_parallel = false;
  bool flash_attention = false;
  bool no_overlap_grad_reduce = false;
  bool no_backward_prefetch = false;
  bool any() const;
};

// Expands a shorthand; dp defaults to world/(tp*cp*pp). `where` names the flags for errors.
Plan expand_shorthand(const PlanShorthand& s, const ModelSpec& m, const ClusterSpec& c);
// Even split of `layers` into `chunks` contiguous ranges (earlier chunks take the remainder).
std::vector<LayerRange> even_chunks(int layers, int chunks);

// Loading a plan from a file is io's part: stratagem/loaders.hpp.

// A schedule or recompute name (as in plan files and flags); `where` names it in errors.
Schedule schedule_from(const std::string& s, const std::string& where);
Recompute recompute_from(const std::string& s, const std::string& where);

// Checks the plan against the model and cluster; throws InputError naming `source` and field.
void validate(const Plan& p, const ModelSpec& m, const ClusterSpec& c, const std::string& source);
// The context-parallel part of validate (plan_cp.cpp): one cp through the stage, a sequence the
// kind can cut, heads an all-to-all can split, an attention the kinds can split.
void validate_context_parallel(const Plan& p, const ModelSpec& m, const std::string& source);
// Why a layer of strategy s cannot split the model's sequence as s.cp and s.cp_kind say ("" when
// it can; `field` gets the field to name: cp, cp_kind, recompute or sequence_parallel): the
// rules of validate_context_parallel for one strategy, which the search asks too.
std::string cp_refusal(const ModelSpec& m, const LayerStrategy& s, bool flash_attention,
                       std::string* field);

// The split backward of the zero-bubble schedules (plan_zero_bubble.cpp): why layer `layer` of
// strategy s cannot run it ("" when it can; `field` gets the field to name), and the check
// validate() runs over the plan's layers when its schedule splits the backward.
std::string split_backward_refusal(const ModelSpec& m, int layer, const LayerStrategy& s,
                                   std::string* field);
void validate_split_backward(const Plan& p, const ModelSpec& m, const std::string& source);

// Mixture-of-Experts parts of a plan (src/core/plan_moe.cpp): the shorthand's --ep, --etp and
// routing flags applied to the MoE layers of `m` (dense layers keep ep = etp = 1), and the
// checks validate() runs: ep divides the experts, etp x ep divides the stage's ranks, no ep or
// etp on a dense layer, the routing factors in range. Throws InputError naming the field.
void apply_moe_shorthand(const PlanShorthand& s, const ModelSpec& m, Plan& p);
void validate_moe(const Plan& p, const ModelSpec& m, const std::string& source);
// Expert data-parallel degree of an MoE layer: the stage's ranks over etp x ep.
inline int expert_dp(const LayerStrategy& s) {
  return s.tp * s.cp * s.dp / (s.ep * s.etp);
}

}  // namespace stratagem
