// The whole-iteration parts of a stage: resident model states, the optimizer step and the release
// of everything at the end.
#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "src/core/stage_builder.hpp"
#include "stratagem/schedule.hpp"

namespace stratagem::program_detail {

StageBuilder::StageBuilder(const ModelSpec& m, const Plan& p, int stage, int M, bool staging)
    : m_(m),
      p_(p),
      M_(M),
      staging_(staging),
      e_(dtype_bytes(p.dtype)),
      nchunks_(static_cast<int>(p.chunks.size())),
      stage_samples_(p.micro_batch * p.max_dp()) {
  out_.stage = stage;
  last_bwd_mb_.assign(nchunks_, -1);
  local_of_.assign(p.layers.size(), -1);
  work_.resize(p.layers.size());
  const std::vector<int> ls = stage_layers();
  for (size_t i = 0; i < ls.size(); ++i) local_of_[ls[i]] = static_cast<int>(i);
  saved_.assign(ls.size() * M, kNoSaved);
  stage_buf_.assign(ls.size() + 1, -1);
  expert_stage_buf_.assign(ls.size(), -1);
  offloaded_.assign(ls.size() * M, -1);
  op_strategy_.reserve(p.layers.size() + 1);
  op_strategy_.push_back(OpStrategy::of(p.embedding));
  for (const LayerStrategy& s : p.layers)
    op_strategy_.push_back(
        OpStrategy::of(s, p.expert_load_factor(s.ep, m.moe.experts), p.moe_node_limit));
}

// Resident model states: weights, gradients and optimizer states, after ZeRO and offload.
void StageBuilder::setup() {
  for (int l : stage_layers()) {
    states_.add(strat(l), layer_params(l), p_.dtype);
    if (expert_params(l) > 0) states_.add(expert_strategy(strat(l)), expert_params(l), p_.dtype);
  }
  if (embed_params() > 0) states_.add(p_.embedding, embed_params(), p_.dtype);
  static_bufs_[0] = alloc(Stream::compute, MemCategory::weights, states_.weights, -1, -1,
                          Phase::setup, Block::none);
  static_bufs_[1] =
      alloc(Stream::compute, MemCategory::grads, states_.grads, -1, -1, Phase::setup, Block::none);
  static_bufs_[2] = alloc(Stream::compute, MemCategory::optimizer, states_.optimizer, -1, -1,
                          Phase::setup, Block::none);
}

void StageBuilder::optimizer() {
  chunk_ = -1;
  std::vector<int> waits = grad_reductions_;
  waits.push_back(last_compute_);
  for (int w : waits) compute_waits_.push_back(w);
  // host_resident: updated in place where they live (offloaded parameters), nothing to copy
  // back to the device.
  const int64_t host_params = states_.host_opt_params;
  const int64_t host_resident = states_.host_resident_params;
  Op step = adamw_op(states_.device_opt_params, p_.dtype);
  step.chunk = static_cast<int16_t>(chunk_);
  int opt = emit(step, {});
  // The gathers of updated weights wait for the device update and for the host's, copied
  // back.
  int updated = opt;
  if (host_params > 0) {
    Op d2h = make(OpKind::copy_d2h, Stream::d2h, Block::optimizer, Phase::optimizer, -1, -1);
    d2h.category = MemCategory::grads;
    d2h.bytes = host_params * e_;
    int a = emit(d2h, waits);
    int b = emit(adamw_host_op(host_params, p_.dtype), {a});
    if (host_params > host_resident) {
      Op h2d = make(OpKind::copy_h2d, Stream::h2d, Block::optimizer, Phase::optimizer, -1, -1);
      h2d.category = MemCategory::weights;
      h2d.bytes = (host_params - host_resident) * e_;
      updated = emit(h2d, {b});
    } else {
      updated = b;
    }
    compute_waits_.push_back(updated);
  }
  // ZeRO-1/2: every rank updated a shard; gather the new weights.
  for (int l : stage_layers()) {
    const auto& s = strat(l);
    if (grad_sync(s).gather_after_step)
      compute_waits_.push_back(collective(
          Stream::dp_comm, Collective::all_gather, GroupKind::dp, Purpose::updated_weights,
          layer_params(l) * e_, Block::optimizer, Phase::optimizer, l, -1, {opt, updated}));
    gather_expert_weights(l, opt, updated);
  }
  const auto& s = p_.embedding;
  if (embed_params() > 0 && grad_sync(s).gather_after_step)
    compute_waits_.push_back(collective(
        Stream::dp_comm, Collective::all_gather, GroupKind::dp, Purpose::updated_weights,
        embed_params() * e_, Block::optimizer, Phase::optimizer, -1, -1, {opt, updated}));
}

void StageBuilder::teardown() {
  for (int b : static_bufs_) release(b, Stream::compute);
  if (live_count_ != 0) throw std::logic_error("program: buffers left allocated");
}

}  // namespace stratagem::program_detail
