// The whole-iteration parts of a stage: resident model states, the optimizer step and the release
// of everything at the end.
#include <vector>

#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

// Resident model states: weights, gradients and optimizer states, after ZeRO and offload.
void ResidentStates::setup() {
  const Dtype dtype = stage_.plan.dtype;
  const int g = stage_.framework.grad_buffer_bytes;
  for (int l : stage_.stage_layers()) {
    states_.add(stage_.strat(l), stage_.layer_params(l), dtype, g);
    if (stage_.expert_params(l) > 0)
      states_.add(expert_strategy(stage_.strat(l)), stage_.expert_params(l), dtype, g);
  }
  if (stage_.embed_params() > 0)
    states_.add(stage_.plan.embedding, stage_.embed_params(), dtype, g);
  static_bufs_[0] = ops_.alloc(Stream::compute, MemCategory::weights, states_.weights, -1, -1,
                               Phase::setup, Block::none);
  static_bufs_[1] = ops_.alloc(Stream::compute, MemCategory::grads, states_.grads, -1, -1,
                               Phase::setup, Block::none);
  static_bufs_[2] = ops_.alloc(Stream::compute, MemCategory::optimizer, states_.optimizer, -1, -1,
                               Phase::setup, Block::none);
}

void ResidentStates::optimizer() {
  ops_.set_chunk(-1);
  std::vector<int> waits = grads_.issued();
  waits.push_back(ops_.last_compute());
  for (int w : waits) ops_.compute_waits_for(w);
  const int e = stage_.element_bytes;
  // host_resident: updated in place where they live (offloaded parameters), nothing to copy
  // back to the device.
  const int64_t host_params = states_.host_opt_params;
  const int64_t host_resident = states_.host_resident_params;
  Op step = adamw_op(states_.device_opt_params, stage_.plan.dtype);
  step.chunk = static_cast<int16_t>(ops_.chunk());
  int opt = ops_.emit(step, {});
  // The gathers of updated weights wait for the device update and for the host's, copied
  // back.
  int updated = opt;
  if (host_params > 0) {
    Op d2h =
        OpEmitter::make(OpKind::copy_d2h, Stream::d2h, Block::optimizer, Phase::optimizer, -1, -1);
    d2h.category = MemCategory::grads;
    d2h.bytes = host_params * e;
    int a = ops_.emit(d2h, waits);
    int b = ops_.emit(adamw_host_op(host_params, stage_.plan.dtype), {a});
    if (host_params > host_resident) {
      Op h2d = OpEmitter::make(OpKind::copy_h2d, Stream::h2d, Block::optimizer, Phase::optimizer,
                               -1, -1);
      h2d.category = MemCategory::weights;
      h2d.bytes = (host_params - host_resident) * e;
      updated = ops_.emit(h2d, {b});
    } else {
      updated = b;
    }
    ops_.compute_waits_for(updated);
  }
  // ZeRO-1/2: every rank updated a shard; gather the new weights.
  for (int l : stage_.stage_layers()) {
    const auto& s = stage_.strat(l);
    if (grad_sync(s).gather_after_step)
      ops_.compute_waits_for(ops_.collective(
          Stream::dp_comm, Collective::all_gather, GroupKind::dp, Purpose::updated_weights,
          stage_.layer_params(l) * e, Block::optimizer, Phase::optimizer, l, -1, {opt, updated}));
    gather_expert_weights(l, opt, updated);
  }
  const auto& s = stage_.plan.embedding;
  if (stage_.embed_params() > 0 && grad_sync(s).gather_after_step)
    ops_.compute_waits_for(ops_.collective(
        Stream::dp_comm, Collective::all_gather, GroupKind::dp, Purpose::updated_weights,
        stage_.embed_params() * e, Block::optimizer, Phase::optimizer, -1, -1, {opt, updated}));
}

// The model states' buffers go last; OpEmitter::finish checks that nothing else is left.
void ResidentStates::teardown() {
  for (int b : static_bufs_) ops_.release(b, Stream::compute);
}

}  // namespace stratagem::program_detail
