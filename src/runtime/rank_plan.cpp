#include "src/runtime/rank_plan.hpp"

#include <algorithm>

#include "stratagem/error.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"

namespace stratagem::exec {

namespace {
const LayerStrategy& strategy(const Plan& plan, int layer) {
  return layer < 0 ? plan.embedding : plan.layers.at(layer);
}
}  // namespace

ModelPart stage_part(const Plan& plan, int stage, int local) {
  ModelPart part;
  part.embedding = stage == 0;
  part.head = stage == plan.pp - 1;
  part.tp = plan.embedding.tp;
  part.tp_rank = RankGeometry::tp_index(local, part.tp);
  for (size_t c = stage; c < plan.chunks.size(); c += plan.pp)
    for (int l = plan.chunks[c].begin; l < plan.chunks[c].end; ++l) part.layers.push_back(l);
  std::sort(part.layers.begin(), part.layers.end());
  if (part.layers.empty()) part.first_layer = part.end_layer = 0;
  for (const LayerStrategy& s : plan.layers) {
    part.layer_tp.push_back(s.tp);
    part.layer_tp_rank.push_back(RankGeometry::tp_index(local, s.tp));
    // The experts this rank holds in the layer (Megatron-Core's expert ranks).
    ModelPart::ExpertShare& x = part.layer_experts.emplace_back();
    x.ep = s.ep, x.etp = s.etp;
    x.etp_rank = RankGeometry::etp_index(local, s.etp);
    x.ep_rank = RankGeometry::ep_index(local, s.etp, s.ep);
  }
  return part;
}

LayerShare layer_share(const Plan& plan, const TransformerConfig& whole, int rows, int layer,
                       int local) {
  const LayerStrategy& s = strategy(plan, layer);
  LayerShare sh;
  sh.tp = s.tp;
  sh.tp_index = RankGeometry::tp_index(local, s.tp);
  sh.dp = s.dp;
  sh.cp = s.cp;
  sh.cp_index = RankGeometry::cp_index(local, s.tp, s.cp);
  sh.dp_index = RankGeometry::dp_index(local, s.tp, s.cp);
  sh.sequence_parallel = s.sequence_parallel && s.tp > 1;
  sh.samples = plan.samples_per_rank(s.dp);
  sh.tokens = int64_t(sh.samples) * rows;
  if (sh.sequence_parallel && sh.tokens % sh.tp)
    throw InputError("sequence parallel: " + std::to_string(sh.tokens) +
                     " tokens per micro-batch do not split over tp " + std::to_string(sh.tp));
  sh.shard_tokens = sh.sequence_parallel ? sh.tokens / sh.tp : sh.tokens;
  sh.local = whole.sharded(s.tp);
  return sh;
}

std::vector<SegmentPlacement> segment_placements(const Plan& plan, const std::vector<int>& layers) {
  std::vector<SegmentPlacement> out;
  auto add = [&](int l) {
    const LayerStrategy& s = strategy(plan, l);
    const bool apart = s.ep * s.etp > 1;
    // The ranks of a cp group hold the same weights: gradients reduce, and ZeRO partitions,
    // over dp x cp (Megatron-Core's data-parallel group with context parallelism), whose
    // index is local / tp.
    out.push_back({l, s.zero, s.tp, s.dp * s.cp, s.offload_params, s.offload_optimizer, apart});
    if (apart)  // the routed experts over the expert data-parallel group (ZeRO there too)
      out.push_back({expert_segment(l), s.zero, s.ep * s.etp, expert_dp(s), s.offload_params,
                     s.offload_optimizer, false});
  };
  add(-1);
  for (int l : layers) add(l);
  return out;
}

FrameworkSpec runtime_framework(const std::string& name_or_path, const Plan& plan) {
  FrameworkSpec fw = load_framework(name_or_path);
  if (fw.layer_gradient_staging) return fw;
  // A ZeRO-2/3 layer's backward writes its whole gradients into the staging buffer its
  // reduce-scatter folds into the rank's piece; bucketed reductions are not built.
  for (int l = -1; l < int(plan.layers.size()); ++l) {
    const LayerStrategy& s = strategy(plan, l);
    if (s.zero >= 2 && s.dp_cp() > 1)
      throw NotSupported("framework " + fw.name + ": layer_gradient_staging false under ZeRO-" +
                         std::to_string(s.zero) +
                         " (reductions bucket by bucket) is not executed by the runtime yet; it "
                         "stages each layer's gradients (data/frameworks/stratagem.json)");
  }
  return fw;
}

}  // namespace stratagem::exec
