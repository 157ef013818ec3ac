// The Mixture-of-Experts parts of a plan: expert parallelism (ep), expert tensor parallelism
// (etp) and the routing figures the cost model paces the experts by.
//
// Where the expert groups sit follows Megatron-Core's expert RankGenerator
// (megatron/core/parallel_state.py: RankGenerator(tp=expert_tensor_parallel_size,
// ep=expert_model_parallel_size, dp=expert_data_parallel_size, cp=1, order "tp-cp-ep-dp-pp")):
// a stage's local index decomposes as et + etp * (e + ep * ed), so etp x ep must divide the
// stage's tp x cp x dp ranks (the Layout builds the groups).
#include <algorithm>
#include <string>

#include "stratagem/error.hpp"
#include "stratagem/plan.hpp"

namespace stratagem {

double Plan::expert_load_factor(int ep, int experts) const {
  double f = std::max(1.0, routing_imbalance);
  if (capacity_factor > 0) f = std::min(f, std::max(1.0, capacity_factor));
  if (experts <= 1 || ep <= 1) return 1.0;
  return 1.0 + (f - 1.0) * double(std::min(ep, experts) - 1) / double(experts - 1);
}

double Plan::routing_imbalance_for(double rank_load, int ep, int experts) {
  if (experts <= 1 || ep <= 1 || rank_load <= 1.0) return 1.0;
  return 1.0 + (rank_load - 1.0) * double(experts - 1) / double(std::min(ep, experts) - 1);
}

void apply_moe_shorthand(const PlanShorthand& s, const ModelSpec& m, Plan& p) {
  const int ep = s.ep.value_or(1);
  // A routing figure for a model without a router would be kept and printed, and price nothing.
  const char* moe_only = ep > 1                  ? "--ep"
                         : s.etp.value_or(1) > 1 ? "--etp"
                         : s.routing_imbalance   ? "--routing-imbalance"
                         : s.capacity_factor     ? "--capacity-factor"
                         : s.moe_node_limit      ? "--moe-node-limit"
                                                 : nullptr;
  if (moe_only && !m.moe.enabled())
    throw InputError(std::string(moe_only) + ": the model " + m.name +
                     " has no experts (give --experts, or an MoE model)");
  // etp defaults to the layer's tp, as Megatron-Core's expert_tensor_parallel_size does.
  for (int l = 0; l < int(p.layers.size()); ++l)
    if (m.is_moe_layer(l)) p.layers[l].ep = ep, p.layers[l].etp = s.etp.value_or(p.layers[l].tp);
  if (s.routing_imbalance) p.routing_imbalance = *s.routing_imbalance;
  if (s.capacity_factor) p.capacity_factor = *s.capacity_factor;
  if (s.moe_node_limit) p.moe_node_limit = *s.moe_node_limit;
}

void validate_moe(const Plan& p, const ModelSpec& m, const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) {
    throw InputError(src + ": " + field + ": " + what);
  };
  if (!(p.routing_imbalance >= 1.0 && p.routing_imbalance <= 64.0))
    bad("routing_imbalance",
        "expected 1.0 (balanced) to 64, got " + std::to_string(p.routing_imbalance));
  if (!(p.capacity_factor == 0.0 || (p.capacity_factor >= 1.0 && p.capacity_factor <= 64.0)))
    bad("capacity_factor",
        "expected 0 (dropless) or 1 to 64, got " + std::to_string(p.capacity_factor));
  if (p.moe_node_limit < 0) bad("moe_node_limit", "expected >= 0 (0: no limit)");
  if (m.moe.enabled() && m.moe.top_k > m.moe.experts)
    bad("model.moe.top_k", "top_k " + std::to_string(m.moe.top_k) + " is more than the " +
                               std::to_string(m.moe.experts) + " experts");
  for (int l = 0; l < int(p.layers.size()); ++l) {
    const LayerStrategy& s = p.layers[l];
    const std::string at = "layers[" + std::to_string(l) + "]";
    if (s.ep < 1) bad(at + ".ep", "expected >= 1");
    if (s.etp < 1) bad(at + ".etp", "expected >= 1");
    if (!m.is_moe_layer(l)) {
      if (s.ep > 1 || s.etp > 1)
        bad(at + (s.ep > 1 ? ".ep" : ".etp"),
            m.moe.enabled() ? "layer " + std::to_string(l) + " is one of the model's " +
                                  std::to_string(m.moe.dense_layers) + " dense layers (ep 1)"
                            : "the model has no experts (ep and etp apply to MoE layers)");
      continue;
    }
    // The Program's ops carry etp in a byte and ep in 16 bits.
    if (s.etp > 255) bad(at + ".etp", "expected <= 255");
    if (s.ep > 65535) bad(at + ".ep", "expected <= 65535");
    if (m.moe.experts % s.ep)
      bad(at + ".ep", "ep " + std::to_string(s.ep) + " does not divide the " +
                          std::to_string(m.moe.experts) + " experts");
    if (m.moe.expert_ffn_hidden % s.etp)
      bad(at + ".etp", "etp " + std::to_string(s.etp) + " does not divide expert_ffn_hidden (" +
                           std::to_string(m.moe.expert_ffn_hidden) + ")");
    const int64_t ranks = int64_t(s.tp) * s.cp * s.dp;
    const int64_t expert_ranks = int64_t(s.ep) * s.etp;
    // Each rank of a tp group routes its own slice of the tokens: experts held whole by every
    // rank of it would need their gradients summed over it too (Megatron-Core reduces them
    // over its expert data-parallel group, which etp x ep = 1 would make the whole stage).
    if (s.tp > 1 && expert_ranks == 1)
      bad(at + ".etp", "an MoE layer with tp " + std::to_string(s.tp) +
                           " needs etp x ep > 1 (Megatron-Core's default etp is tp)");
    if (ranks % expert_ranks)
      bad(at + ".ep", "etp " + std::to_string(s.etp) + " x ep " + std::to_string(s.ep) + " = " +
                          std::to_string(expert_ranks) +
                          " does not divide the stage's tp x cp x dp = " + std::to_string(ranks) +
                          " ranks (Megatron-Core's expert groups tile the stage)");
    // ZeRO and offloaded parameters apply to the experts over their expert data-parallel
    // group (torchtitan's fully_shard of the experts over dp_mod_ep_mesh, with its
    // CPUOffloadPolicy; DeepSpeed-MoE's expert data parallelism): program_moe.cpp.
    // The routed tokens of a rank are its 1/tp slice of the micro-batch's tokens.
    if (m.seq_len % s.tp)
      bad(at + ".tp", "tp " + std::to_string(s.tp) + " does not divide seq_len (" +
                          std::to_string(m.seq_len) + "): an MoE layer routes a 1/tp slice");
  }
}

}  // namespace stratagem
