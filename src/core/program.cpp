// The one schedule generator: turns (model, plan) into each pipeline stage's op stream.
#include "stratagem/program.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "src/core/stage_builder.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

const char* to_string(OpKind k) {
  static const char* n[] = {"compute",  "collective",   "send",  "recv", "copy_d2h",
                            "copy_h2d", "host_compute", "alloc", "free"};
  return n[static_cast<int>(k)];
}
const char* to_string(Stream s) {
  static const char* n[] = {"compute", "tp_comm", "dp_comm", "pp_comm", "h2d",
                            "d2h",     "ep_comm", "cp_comm", "pp_recv"};
  return n[static_cast<int>(s)];
}
const char* to_string(Block b) {
  static const char* n[] = {"none",      "embedding", "attention", "mlp",     "head",
                            "optimizer", "reshard",   "router",    "experts", "combine"};
  return n[static_cast<int>(b)];
}
const char* to_string(Phase p) {
  static const char* n[] = {"forward",   "backward", "recompute",
                            "optimizer", "setup",    "weight_grad"};
  return n[static_cast<int>(p)];
}
const char* to_string(Collective c) {
  static const char* n[] = {"none", "all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  return n[static_cast<int>(c)];
}
const char* to_string(MemCategory c) {
  static const char* n[] = {"weights", "grads", "optimizer", "activations", "buffers"};
  return n[static_cast<int>(c)];
}

const char* to_string(Purpose p) {
  static const char* n[] = {"none",         "activations", "loss_stats",     "replicated_grads",
                            "router_stats", "grad_reduce", "weight_fetch",   "updated_weights",
                            "tied_grads",   "reshard",     "token_exchange", "expert_rows",
                            "context",      "pipeline"};
  return n[static_cast<int>(p)];
}

OpStrategy OpStrategy::of(const LayerStrategy& s, double expert_load, int moe_node_limit) {
  OpStrategy o;
  o.expert_load = expert_load;
  o.moe_node_limit = moe_node_limit;
  o.tp = s.tp, o.dp = s.dp, o.cp = s.cp, o.ep = s.ep, o.etp = s.etp;
  o.zero = static_cast<uint8_t>(s.zero);
  o.cp_kind = s.cp_kind;
  o.sequence_parallel = s.sequence_parallel;
  o.offload_optimizer = s.offload_optimizer;
  o.offload_params = s.offload_params;
  o.offload_activations = s.offload_activations;
  return o;
}

LayerStrategy OpStrategy::unpack(Recompute recompute) const {
  LayerStrategy s;
  s.tp = tp, s.dp = dp, s.cp = cp, s.ep = ep, s.etp = etp;
  s.zero = zero;
  s.cp_kind = cp_kind;
  s.sequence_parallel = sequence_parallel;
  s.offload_optimizer = offload_optimizer;
  s.offload_params = offload_params;
  s.offload_activations = offload_activations;
  s.recompute = recompute;
  return s;
}

std::string op_name(const Op& op) {
  std::string s;
  if (op.layer >= 0) s = "L" + std::to_string(op.layer) + ".";
  s += to_string(op.block);
  static const char* ph[] = {"fwd", "bwd", "recompute", "opt", "setup", "wgrad"};
  s += ".";
  s += ph[static_cast<int>(op.phase)];
  s += ".";
  switch (op.kind) {
    case OpKind::compute:
      s += "compute";
      break;
    case OpKind::collective:
      s += to_string(op.collective);
      break;
    default:
      s += to_string(op.kind);
      break;
  }
  if (op.part != AttentionPart::whole && op.kind != OpKind::alloc && op.kind != OpKind::free) {
    // A cp attention's part, or what its transfer carries: "L3.attention.fwd.compute.core2".
    const bool transfer = op.kind == OpKind::send || op.kind == OpKind::recv;
    s += transfer ? (op.part == AttentionPart::pre ? ".kv" : ".dkv")
                  : "." + std::string(to_string(op.part));
    if (op.cp_step >= 0) s += std::to_string(op.cp_step);
  }
  if (op.kind == OpKind::alloc || op.kind == OpKind::free) {
    s += ".";
    s += to_string(op.category);
  }
  if (op.microbatch >= 0) s += " mb" + std::to_string(op.microbatch);
  return s;
}

int resolve_group(const Layout& layout, int rank, const Op& op) {
  if (op.kind != OpKind::collective) return -1;
  const OpStrategy& s = op.strategy;
  switch (op.group) {
    case GroupKind::tp:
      return layout.tp_group(rank, s.tp);
    case GroupKind::dp:
      return layout.dp_group(rank, s.tp);
    case GroupKind::reshard:
      return layout.reshard_group(rank, op.reshard_from_tp, op.reshard_to_tp);
    case GroupKind::tied_embedding:
      return layout.tied_embedding_group(rank);
    case GroupKind::ep:
      return layout.ep_group(rank, s.etp, s.ep);
    case GroupKind::expert_dp:
      return layout.expert_dp_group(rank, s.etp, s.ep);
    case GroupKind::expert_tp:
      return layout.expert_tp_group(rank, s.etp, s.ep);
    case GroupKind::cp:
      return layout.cp_group(rank, s.tp);
    default:
      return -1;
  }
}

int resolve_peer(const Layout& layout, int rank, const Op& op) {
  // The interleaved schedule wraps around: chunk v*pp on stage 0 follows chunk v*pp-1 on the
  // last stage.
  const auto c = layout.coords(rank);
  const int pp = layout.pp();
  if (op.group == GroupKind::pp_next) return layout.rank_of((c.stage + 1) % pp, c.local);
  if (op.group == GroupKind::pp_prev) return layout.rank_of((c.stage + pp - 1) % pp, c.local);
  // The cp ring runs one way: a rank sends to the next cp index and receives from the previous.
  if (op.group == GroupKind::cp)
    return op.kind == OpKind::send ? layout.cp_next_rank(rank, op.strategy.tp)
                                   : layout.cp_prev_rank(rank, op.strategy.tp);
  return -1;
}

using program_detail::StageBuilder;

Program build_program(const ModelSpec& model, const Plan& plan, const FrameworkSpec& framework) {
  Program prog;
  prog.num_microbatches = plan.num_microbatches();
  prog.stages.reserve(plan.pp);
  size_t prev_layers = 0;
  for (int s = 0; s < plan.pp; ++s) {
    StageBuilder b(model, plan, s, prog.num_microbatches, framework);
    // Each stage reserves what the one before it took, scaled by its layer count, and a
    // sixteenth more (pipeline stages are much alike): a capacity only, the ops are the same.
    const size_t layers = b.stage_layer_count();
    if (s > 0 && prev_layers > 0) {
      const StageProgram& prev = prog.stages.back();
      auto scaled = [&](size_t n) {
        const size_t x = n / prev_layers * std::max<size_t>(layers, 1);
        return x + x / 16 + 64;
      };
      b.reserve(scaled(prev.ops.size()), scaled(prev.deps.size()));
    }
    prog.stages.push_back(b.build());
    prev_layers = layers;
  }
  return prog;
}

}  // namespace stratagem
