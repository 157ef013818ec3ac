// Offloading on this rank (ZeRO-Offload, ZeRO-Infinity, H3T): what the Program's copy_h2d,
// copy_d2h and host_compute ops move and compute. The host pool has its own ledger, apart from
// the device's. Every copy runs on the worker of its Program stream, in that stream's order,
// while the rank thread goes on; ops that need a copy's result have it as a dependency.
#include "src/runtime/exec/ops_offload.hpp"

#include <cstring>
#include <map>

#include "src/runtime/exec/ops_compute.hpp"
#include "src/runtime/exec/rank_context.hpp"
#include "stratagem/error.hpp"

namespace stratagem::exec {

namespace {
// Tensors hold host memory on the CPU backend: a copy between the pools is a memcpy (a CUDA
// backend makes it a cudaMemcpyAsync on the stream).
void copy_floats(const Tensor& dst, const Tensor& src) {
  std::memcpy(dst.data, src.data, size_t(src.numel()) * sizeof(float));
}

// The saved tensors of a layer, with the block whose buffer holds each on the device: an MoE
// layer's FFN keeps its router's scores and weights, the experts' rows and the combine's input
// in the mlp block's buffer (ops_moe.cpp).
std::vector<std::pair<Tensor*, Block>> saved_tensors(LayerState& ls) {
  std::vector<std::pair<Tensor*, Block>> out;
  for (Tensor* t : {&ls.x_in, &ls.attn.norm_out, &ls.attn.norm_mean, &ls.attn.norm_rstd,
                    &ls.attn.qkv, &ls.attn.att, &ls.attn.lse, &ls.attn.out})
    if (t->defined()) out.push_back({t, Block::attention});
  MoeActs& a = ls.moe.acts;
  for (Tensor* t :
       {&ls.x_mid, &ls.mlp.norm_out, &ls.mlp.norm_mean, &ls.mlp.norm_rstd, &ls.mlp.fc1_out,
        &ls.mlp.act_out, &a.scores, &a.weights, &a.expert_in, &a.fc1_out, &a.act_out, &a.expert_out,
        &a.combined_in, &a.shared_fc1_out, &a.shared_act_out})
    if (t->defined()) out.push_back({t, Block::mlp});
  return out;
}

// Moves each saved tensor once: a tensor that views the same memory as one moved before (an
// MoE layer's combine input is its experts' output when no collective moves the rows) views
// the moved copy. place(t, block) gives the tensor's new home; moves collects (to, from).
template <class Place>
void move_saved(LayerState& ls, Place place, std::vector<std::pair<Tensor, Tensor>>& moves) {
  std::map<const float*, Tensor> moved;
  for (auto [t, block] : saved_tensors(ls)) {
    auto it = moved.find(t->data);
    if (it != moved.end()) {
      *t = it->second.view(t->shape);
      continue;
    }
    Tensor to = place(*t, block);
    moves.push_back({to, *t});
    moved[t->data] = to;
    *t = to;
  }
}
}  // namespace

void OffloadOps::copy(const Op& op, int index) {
  if (op.block == Block::optimizer) {
    if (op.kind == OpKind::copy_d2h) {
      // The (clipped) gradients of the state's elements go down to the host optimizer; after a
      // checkpoint load the host's master weights are refreshed from the device too.
      auto moves = rank_.shards.host_state_pairs(rank_.offload.grads, true);  // (host, device)
      if (rank_.offload.master_stale)
        for (auto& pair : rank_.shards.host_state_pairs(rank_.offload.master, false))
          moves.push_back(pair);
      rank_.offload.master_stale = false;
      rank_.requests.issue(index, rank_.offload.d2h.submit([moves] {
        for (const auto& [host, dev] : moves) copy_floats(host, dev);
      }));
    } else {  // the updated weights come back up
      auto moves = rank_.shards.host_state_pairs(rank_.offload.master, false);  // (host, device)
      rank_.requests.issue(index, rank_.offload.h2d.submit([moves] {
        for (const auto& [host, dev] : moves) copy_floats(dev, host);
      }));
    }
    return;
  }
  if (op.category == MemCategory::activations) {
    op.kind == OpKind::copy_d2h ? offload_activations(op, index) : reload_activations(op, index);
    return;
  }
  if (op.kind == OpKind::copy_h2d && op.category == MemCategory::weights) {
    place_fetch(op, &rank_.offload.h2d, index);
    return;
  }
  throw NotSupported("copy " + op_name(op) + " is not executed by the runtime yet");
}

void OffloadOps::host_compute(const Op& op, int index) {
  if (op.block != Block::optimizer)
    throw NotSupported("host op " + op_name(op) + " is not executed by the runtime yet");
  // AdamW on the host's master shard, on the d2h stream after the gradients' copy.
  if (!rank_.offload.update_pending) return;
  rank_.offload.update_pending = false;
  const float lr = rank_.offload.lr;
  Backend* hb = rank_.offload.backend.get();
  AdamW* state = rank_.offload.adamw.get();
  const std::vector<AdamW::Run>* runs = &rank_.offload.adamw_runs;
  rank_.requests.issue(
      index, rank_.offload.d2h.submit([hb, state, runs, lr] { state->step(*hb, *runs, lr); }));
}

void OffloadOps::offload_activations(const Op& op, int index) {
  Micro& m = rank_.mb(op.microbatch);
  // The residual stream still reads the layer's last block input: it is summed now, before
  // that input leaves the device.
  if (m.fwd.defined()) {
    Tensor x = compute_.materialize(m.fwd, -1, rank_.stream_shape(op.layer));
    m.fwd = Flow{x, {}, -1};
  }
  LayerState& ls = m.layers.at(op.layer);
  // Under full recompute only the layer input is saved; the mlp's input is rebuilt.
  if (op.recompute == Recompute::full) ls.x_mid = Tensor{};
  std::vector<std::pair<Tensor, Tensor>> moves;  // (host, device)
  move_saved(
      ls,
      [this](const Tensor& t, Block) {
        return rank_.offload.pool.scratch(t.shape, MemCategory::activations);
      },
      moves);
  rank_.requests.issue(index, rank_.offload.d2h.submit([moves] {
    for (const auto& [host, dev] : moves) copy_floats(host, dev);
  }));
}

void OffloadOps::reload_activations(const Op& op, int index) {
  Micro& m = rank_.mb(op.microbatch);
  LayerState& ls = m.layers.at(op.layer);
  std::vector<std::pair<Tensor, Tensor>> moves;  // (device, host)
  move_saved(
      ls,
      [this, &op](const Tensor& t, Block block) {
        return rank_.buffers.pool.take(
            rank_.buffers.of(block, Phase::backward, op.layer, op.microbatch), t.shape);
      },
      moves);
  rank_.requests.issue(index, rank_.offload.h2d.submit([moves] {
    for (const auto& [dev, host] : moves) copy_floats(dev, host);
  }));
}

void OffloadOps::place_fetch(const Op& op, CopyStream* stream, int index) {
  Micro* m = op.microbatch >= 0 ? &rank_.mb(op.microbatch) : nullptr;
  const int buf = rank_.buffers.of(op.block, op.phase, op.layer, op.microbatch);
  auto& bound = rank_.shards.fetched[buf];
  const Segment& seg = rank_.shards.sharding.of(rank_.segment_key(op));
  std::vector<std::pair<Tensor, Tensor>> moves;  // (fetch buffer part, home part)
  for (const ParamInfo* e : rank_.fetch_set(op, m)) {
    Tensor dst = rank_.buffers.pool.take(buf, e->shape);
    weight_field(rank_.shards.model.weights, e->name) = dst;
    bound.push_back(e);
    const int64_t a = e->offset, b = e->offset + e->numel();
    if (!seg.sharded_weights()) {  // offloaded whole: the tensor itself comes up
      moves.push_back({dst.view(Shape{e->numel()}), rank_.shards.param_slice(a, e->numel())});
      continue;
    }
    // ZeRO-3: this rank's piece goes to its displacement; the all-gather fills the rest.
    const auto counts = seg.counts(a, b);
    int64_t at = 0;
    const int me = seg.dp_index;
    for (int d = 0; d < me; ++d) at += counts[d];
    if (counts[me] > 0)
      moves.push_back({dst.slice(at, Shape{counts[me]}),
                       rank_.shards.param_slice(seg.piece_begin(a, b, me), counts[me])});
  }
  if (stream) {
    rank_.requests.issue(index, stream->submit([moves] {
      for (const auto& [dst, src] : moves) copy_floats(dst, src);
    }));
  } else {
    for (auto& [dst, src] : moves) {
      Tensor d = dst;
      rank_.backend.copy(d, src);
    }
  }
}

}  // namespace stratagem::exec
