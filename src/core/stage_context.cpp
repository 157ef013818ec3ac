// The facts of a stage that the parts of its schedule generator share (stage_context.hpp).
#include "src/core/stage_context.hpp"

namespace stratagem::program_detail {

StageContext::StageContext(const ModelSpec& model, const Plan& plan, int stage, int microbatches,
                           const FrameworkSpec& framework)
    : model(model),
      plan(plan),
      stage(stage),
      microbatches(microbatches),
      framework(framework),
      element_bytes(dtype_bytes(plan.dtype)),
      chunk_count(static_cast<int>(plan.chunks.size())),
      stage_samples(plan.micro_batch * plan.max_dp()),
      steps(stage_schedule(plan, stage, microbatches)),
      split_backward(splits_backward(plan.schedule)) {
  last_backward_mb.assign(chunk_count, -1);
  for (const auto& st : steps)
    if (!st.forward && !st.weight) last_backward_mb[st.chunk] = st.microbatch;
  local_of.assign(plan.layers.size(), -1);
  work_.resize(plan.layers.size());
  const std::vector<int> ls = stage_layers();
  for (size_t i = 0; i < ls.size(); ++i) local_of[ls[i]] = static_cast<int>(i);
}

const StageContext::LayerWork& StageContext::work(int layer) const {
  LayerWork& w = work_[layer];
  if (w.ready) return w;
  const auto& s = strat(layer);
  const int b = samples(layer);
  const Block blocks[2] = {Block::attention, Block::mlp};
  for (int i = 0; i < 2; ++i) {
    w.saved_bytes[i] = kept_activation_bytes(model, s, blocks[i], b, s.recompute,
                                             plan.flash_attention, plan.dtype);
    const BlockWork f = forward_work(model, s, blocks[i], b, plan.flash_attention);
    w.forward[i] = {f.flops(), f.elementwise_bytes};
    const BlockWork g = backward_work(model, s, blocks[i], b, plan.flash_attention);
    w.backward[i] = {g.flops(), g.elementwise_bytes};
    if (!split_backward) continue;
    const BlockWork in = input_grad_of(f), wt = weight_grad_of(f);
    w.input_grad[i] = {in.flops(), in.elementwise_bytes};
    w.weight_grad[i] = {wt.flops(), wt.elementwise_bytes};
    w.weight_input_bytes[i] = stratagem::weight_input_bytes(model, s, blocks[i], b, plan.dtype);
    w.weight_stash_bytes[i] = stratagem::weight_stash_bytes(model, s, blocks[i], b, plan.dtype);
  }
  if (model.is_moe_layer(layer)) {
    w.saved_bytes[1] = moe_kept_activation_bytes(model, s, b, s.recompute, plan.dtype,
                                                 plan.expert_load_factor(s.ep, model.moe.experts));
    const MoeWork f = moe_forward_work(model, s, b), g = moe_backward_work(model, s, b);
    const Block parts[3] = {Block::router, Block::experts, Block::combine};
    for (int i = 0; i < 3; ++i) {
      w.moe_forward[i] = {f.part(parts[i]).flops(), f.part(parts[i]).elementwise_bytes};
      w.moe_backward[i] = {g.part(parts[i]).flops(), g.part(parts[i]).elementwise_bytes};
    }
    w.forward[1] = {f.flops(), f.elementwise_bytes()};
    w.backward[1] = {g.flops(), g.elementwise_bytes()};
  }
  w.ready = true;
  return w;
}

}  // namespace stratagem::program_detail
