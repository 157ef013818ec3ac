#include "src/cost/cp_cost.hpp"

#include <algorithm>

#include "stratagem/iteration.hpp"

namespace stratagem::cost_detail {
namespace {
double part_s(const CostModel& c, const LayerStrategy& s, int samples, Phase ph, AttentionPart part,
              bool flash_attention) {
  Op op;
  op.kind = OpKind::compute;
  op.block = Block::attention;
  op.phase = ph;
  op.samples = samples;
  op.part = part;
  op.strategy = OpStrategy::of(s);
  op.recompute = s.recompute;
  op.dtype = c.dtype();
  op.flash_attention = flash_attention;
  return c.attention_part_time_s(op);
}
}  // namespace

double cp_attention_kernels_s(const CostModel& c, const LayerStrategy& s, int samples, Phase ph,
                              bool flash_attention) {
  auto part = [&](AttentionPart p) { return part_s(c, s, samples, ph, p, flash_attention); };
  return part(AttentionPart::pre) + cp_core_steps(s) * part(AttentionPart::core) +
         part(AttentionPart::post);
}

CpCost cp_cost(const CostModel& c, const LayerStrategy& s, int samples, int cp_nodes,
               bool flash_attention) {
  CpCost x;
  if (s.cp <= 1) return x;
  const Dtype dt = c.dtype();
  const CpComm f = cp_comm(c.model(), s, samples, Phase::forward, dt);
  const CpComm b = cp_comm(c.model(), s, samples, Phase::backward, dt);
  auto coll = [&](Collective k, int64_t bytes) {
    return k == Collective::none ? 0.0
                                 : c.fabric().collective_cost(k, bytes, s.cp, cp_nodes).time_s();
  };
  if (s.cp_kind == CpKind::ring) {
    const double kv = c.fabric().p2p_cost(f.kv_bytes, cp_nodes == 1).time_s();
    const double core_f =
        part_s(c, s, samples, Phase::forward, AttentionPart::core, flash_attention);
    const double core_b =
        part_s(c, s, samples, Phase::backward, AttentionPart::core, flash_attention);
    x.fwd_s = f.kv_steps * std::max(0.0, kv - core_f);
    x.bwd_s = b.kv_steps * std::max(0.0, 2 * kv - core_b) + kv;
  } else if (s.cp_kind == CpKind::allgather) {
    x.fwd_s = coll(f.before, f.before_bytes);
    const double post_b =
        part_s(c, s, samples, Phase::backward, AttentionPart::post, flash_attention);
    x.bwd_s = std::max(0.0, coll(b.before, b.before_bytes) - post_b) + coll(b.after, b.after_bytes);
  } else {
    x.fwd_s = coll(f.before, f.before_bytes) + coll(f.after, f.after_bytes);
    x.bwd_s = coll(b.before, b.before_bytes) + coll(b.after, b.after_bytes);
  }
  return x;
}

}  // namespace stratagem::cost_detail
