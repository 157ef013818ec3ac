// Emitting a stage's ops: compute, collectives, buffers, weight fetches and the tensor-parallel
// and reshard collectives around a block.
#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "src/core/stage_builder.hpp"
#include "stratagem/schedule.hpp"

namespace stratagem::program_detail {

int StageBuilder::alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph,
                        Block b, std::initializer_list<int> deps) {
  return alloc(s, cat, bytes, layer, mb, ph, b, std::vector<int>(deps));
}

int StageBuilder::alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph,
                        Block b, const std::vector<int>& deps) {
  if (bytes <= 0) return -1;
  Op op = make(OpKind::alloc, s, b, ph, layer, mb);
  op.category = cat;
  op.bytes = bytes;
  op.buffer = next_buffer_++;
  live_.push_back(emit(op, deps));  // buffer ids are dense: live_[id] is id's alloc op
  ++live_count_;
  return op.buffer;
}

void StageBuilder::release(int buffer, Stream s, const std::vector<int>& deps) {
  if (buffer < 0) return;
  const int a = std::exchange(live_.at(buffer), -1);
  if (a < 0) throw std::logic_error("program: a buffer freed twice");
  --live_count_;
  Op op = out_.ops[a];  // emit sets the free's own dependencies
  op.kind = OpKind::free;
  op.stream = s;
  emit(op, deps);
}

int StageBuilder::compute(Block b, Phase ph, int layer, int mb, int samples, double flops,
                          double bytes) {
  Op op = make(OpKind::compute, Stream::compute, b, ph, layer, mb);
  op.samples = samples;
  op.flops = flops;
  op.bytes = static_cast<int64_t>(bytes);
  op.chunk = static_cast<int16_t>(chunk_);
  return emit(op, {});
}

// A compute op of a template (iteration.hpp) at its place: layer, micro-batch, chunk.
int StageBuilder::compute(Op op, int layer, int mb) {
  op.layer = layer;
  op.microbatch = mb;
  op.chunk = static_cast<int16_t>(chunk_);
  return emit(op, {});
}

Op StageBuilder::collective_op(Stream s, Collective c, GroupKind g, Purpose why, int64_t bytes,
                               Block b, Phase ph, int layer, int mb) const {
  Op op = make(OpKind::collective, s, b, ph, layer, mb);
  op.collective = c;
  op.group = g;
  op.purpose = why;
  op.bytes = bytes;
  op.chunk = static_cast<int16_t>(chunk_);
  return op;
}

int StageBuilder::collective(Stream s, Collective c, GroupKind g, Purpose why, int64_t bytes,
                             Block b, Phase ph, int layer, int mb,
                             std::initializer_list<int> deps) {
  return emit(collective_op(s, c, g, why, bytes, b, ph, layer, mb), deps);
}

const StageBuilder::LayerWork& StageBuilder::work(int layer) {
  LayerWork& w = work_[layer];
  if (w.ready) return w;
  const auto& s = strat(layer);
  const int b = samples(layer);
  const Block blocks[2] = {Block::attention, Block::mlp};
  for (int i = 0; i < 2; ++i) {
    w.saved_bytes[i] =
        kept_activation_bytes(m_, s, blocks[i], b, s.recompute, p_.flash_attention, p_.dtype);
    const BlockWork f = forward_work(m_, s, blocks[i], b, p_.flash_attention);
    w.forward[i] = {f.flops(), f.elementwise_bytes};
    const BlockWork g = backward_work(m_, s, blocks[i], b, p_.flash_attention);
    w.backward[i] = {g.flops(), g.elementwise_bytes};
  }
  if (m_.is_moe_layer(layer)) {
    w.saved_bytes[1] = moe_kept_activation_bytes(m_, s, b, s.recompute, p_.dtype,
                                                 p_.expert_load_factor(s.ep, m_.moe.experts));
    const MoeWork f = moe_forward_work(m_, s, b), g = moe_backward_work(m_, s, b);
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

// Tensor-parallel collectives around a block (iteration.hpp's tp_comm): the all-gathers
// before it (layer -1: the embedding or head), which the block's compute waits for.
int StageBuilder::tp_before(Block b, Phase ph, int layer, int mb) {
  const auto& s = strat(layer);
  const TpComm t = tp_comm(s, b, ph);
  if (t.gathers == 0) return -1;
  const int64_t bytes = token_stream_bytes(m_, samples(layer), p_.dtype, s.cp);
  int c = -1;
  for (int i = 0; i < t.gathers; ++i) {
    c = collective(Stream::tp_comm, Collective::all_gather, GroupKind::tp, Purpose::activations,
                   bytes, b, ph, layer, mb, {last_compute_, reloaded_});
    compute_waits_.push_back(c);
  }
  return c;
}

// Returns the collective (-1 when none): in backward its completion finishes the block's
// gradients (the norm's backward runs on the reduced input gradient).
int StageBuilder::tp_after(Block b, Phase ph, int layer, int mb) {
  const auto& s = strat(layer);
  const TpComm t = tp_comm(s, b, ph);
  if (t.after == Collective::none) return -1;
  const int64_t bytes = token_stream_bytes(m_, samples(layer), p_.dtype, s.cp);
  int c = collective(Stream::tp_comm, t.after, GroupKind::tp, Purpose::activations, bytes, b, ph,
                     layer, mb, {last_compute_});
  compute_waits_.push_back(c);
  return c;
}

// Samples move between ranks when consecutive layers hold the stream differently
// (LayerStrategy::stream_tp: (tp, dp), sequence parallelism): when the replicas holding a
// whole stream grow, their ranks all-gather; when they shrink, each takes a slice.
void StageBuilder::reshard(int from_layer, int to_layer, Phase ph, int mb) {
  if (reshard_gather_ranks(strat(from_layer), strat(to_layer)) == 0) return;
  const int a = strat(from_layer).stream_tp(), b = strat(to_layer).stream_tp();
  int64_t bytes = boundary(to_layer);
  Op op = collective_op(Stream::tp_comm, Collective::all_gather, GroupKind::reshard,
                        Purpose::reshard, bytes, Block::reshard, ph, to_layer, mb);
  op.reshard_from_tp = a;
  op.reshard_to_tp = b;
  const int c = emit(op, {last_compute_});
  compute_waits_.push_back(c);
}

// `params` parameters of strategy s (layer -1: embedding or LM head): returns their buffer,
// or -1 when resident. `experts`: an MoE layer's routed experts (s its expert_strategy), whose
// buffer and gather are Block::experts over the expert data-parallel group, which the layer's
// etp and ep select (program_moe.cpp's contract).
int StageBuilder::fetch(const LayerStrategy& s, int64_t params, int layer, Phase ph, int mb,
                        int after, int* wait_out, bool experts) {
  const WeightFetch f = weight_fetch(s, params, p_.dtype);
  const Block blk = experts ? Block::experts : Block::none;
  auto wait_for = [&](int op) {
    if (wait_out)
      *wait_out = op;
    else
      compute_waits_.push_back(op);
  };
  if (f.bytes == 0) return -1;
  // ZeRO-Infinity: the rank's shard lives in host memory; it crosses PCIe into its place in
  // the gather buffer before the (in-place) all-gather can start.
  const int buf = alloc(s.offload_params ? Stream::h2d : Stream::dp_comm, MemCategory::buffers,
                        f.bytes, layer, mb, ph, blk, {after});
  if (f.h2d_bytes > 0) {
    Op op = make(OpKind::copy_h2d, Stream::h2d, blk, ph, layer, mb);
    op.category = MemCategory::weights;
    op.bytes = f.h2d_bytes;
    after = emit(op, {after});
  }
  if (!f.gathers) {
    wait_for(after);
  } else if (experts) {
    wait_for(collective(Stream::dp_comm, Collective::all_gather, GroupKind::expert_dp,
                        Purpose::weight_fetch, f.bytes, blk, ph, layer, mb, {after}));
  } else {
    wait_for(collective(Stream::dp_comm, Collective::all_gather, GroupKind::dp,
                        Purpose::weight_fetch, f.bytes, blk, ph, layer, mb, {after}));
  }
  return buf;
}

}  // namespace stratagem::program_detail
