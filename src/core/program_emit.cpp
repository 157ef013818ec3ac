// Emitting a stage's ops (op_emitter.hpp): compute, collectives and buffers.
#include <stdexcept>
#include <utility>

#include "src/core/op_emitter.hpp"

namespace stratagem::program_detail {

OpEmitter::OpEmitter(const StageContext& stage) : stage_(stage) {
  out_.stage = stage.stage;
  op_strategy_.reserve(stage.plan.layers.size() + 1);
  op_strategy_.push_back(OpStrategy::of(stage.plan.embedding));
  for (const LayerStrategy& s : stage.plan.layers)
    op_strategy_.push_back(
        OpStrategy::of(s, stage.plan.expert_load_factor(s.ep, stage.model.moe.experts),
                       stage.plan.moe_node_limit));
}

StageProgram OpEmitter::finish() {
  if (live_count_ != 0) throw std::logic_error("program: buffers left allocated");
  return std::move(out_);
}

int OpEmitter::alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph, Block b,
                     std::initializer_list<int> deps) {
  return alloc(s, cat, bytes, layer, mb, ph, b, std::vector<int>(deps));
}

int OpEmitter::alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph, Block b,
                     const std::vector<int>& deps) {
  if (bytes <= 0) return -1;
  Op op = make(OpKind::alloc, s, b, ph, layer, mb);
  op.category = cat;
  op.bytes = bytes;
  op.buffer = next_buffer_++;
  live_.push_back(emit(op, deps));  // buffer ids are dense: live_[id] is id's alloc op
  ++live_count_;
  return op.buffer;
}

void OpEmitter::release(int buffer, Stream s, const std::vector<int>& deps) {
  if (buffer < 0) return;
  const int a = std::exchange(live_.at(buffer), -1);
  if (a < 0) throw std::logic_error("program: a buffer freed twice");
  --live_count_;
  Op op = out_.ops[a];  // emit sets the free's own dependencies
  op.kind = OpKind::free;
  op.stream = s;
  emit(op, deps);
}

int OpEmitter::compute(Block b, Phase ph, int layer, int mb, int samples, double flops,
                       double bytes) {
  Op op = make(OpKind::compute, Stream::compute, b, ph, layer, mb);
  op.samples = samples;
  op.flops = flops;
  op.bytes = static_cast<int64_t>(bytes);
  op.chunk = static_cast<int16_t>(chunk_);
  return emit(op, {});
}

// A compute op of a template (iteration.hpp) at its place: layer, micro-batch, chunk.
int OpEmitter::compute(Op op, int layer, int mb) {
  op.layer = layer;
  op.microbatch = mb;
  op.chunk = static_cast<int16_t>(chunk_);
  return emit(op, {});
}

Op OpEmitter::collective_op(Stream s, Collective c, GroupKind g, Purpose why, int64_t bytes,
                            Block b, Phase ph, int layer, int mb) const {
  Op op = make(OpKind::collective, s, b, ph, layer, mb);
  op.collective = c;
  op.group = g;
  op.purpose = why;
  op.bytes = bytes;
  op.chunk = static_cast<int16_t>(chunk_);
  return op;
}

int OpEmitter::collective(Stream s, Collective c, GroupKind g, Purpose why, int64_t bytes, Block b,
                          Phase ph, int layer, int mb, std::initializer_list<int> deps) {
  return emit(collective_op(s, c, g, why, bytes, b, ph, layer, mb), deps);
}

}  // namespace stratagem::program_detail
