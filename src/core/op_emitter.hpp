// A pipeline stage's op stream under construction (program_emit.cpp): the one place an op is
// appended to the StageProgram, with what its consumers read filled in, and its dependencies
// recorded. The parts of the schedule generator (stage_builder.hpp) emit through it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "src/core/stage_context.hpp"
#include "stratagem/program.hpp"

namespace stratagem::program_detail {

class OpEmitter {
 public:
  explicit OpEmitter(const StageContext& stage);

  // Room for about this many ops and dependencies, so that the vectors are written once
  // instead of copied as they grow (millions of ops at pp 16).
  void reserve(size_t ops, size_t deps) {
    out_.ops.reserve(ops);
    out_.deps.reserve(deps);
  }
  // The stage's Program, once every buffer it allocated has been freed.
  StageProgram finish();

  // ---- emission ------------------------------------------------------------------------
  // Dependencies are read in place (no vector per op: a pp 16 Program has millions of ops).
  int emit(Op op, std::initializer_list<int> deps) { return emit(op, deps.begin(), deps.size()); }
  int emit(Op op, const std::vector<int>& deps) { return emit(op, deps.data(), deps.size()); }
  int emit(Op op, const int* deps, size_t ndeps) {
    // Everything the op's consumers need, from its layer's strategy: they never read the Plan.
    if (op.layer >= 0) op.recompute = stage_.strat(op.layer).recompute;
    op.strategy = op_strategy_[size_t(std::max(op.layer, -1) + 1)];
    op.dtype = stage_.plan.dtype;
    op.flash_attention = stage_.plan.flash_attention;
    // A split backward's B: the layer blocks' backward compute (the W ops carry the rest).
    op.wgrad_deferred = stage_.split_backward && op.kind == OpKind::compute &&
                        op.phase == Phase::backward && op.layer >= 0 &&
                        (op.block == Block::attention || op.block == Block::mlp);
    op.dep_begin = static_cast<uint32_t>(out_.deps.size());
    for (size_t k = 0; k < ndeps; ++k)
      if (deps[k] >= 0) out_.deps.push_back(static_cast<uint32_t>(deps[k]));
    if (op.stream == Stream::compute) {
      for (int d : compute_waits_) out_.deps.push_back(static_cast<uint32_t>(d));
      compute_waits_.clear();
    }
    op.dep_count = static_cast<uint32_t>(out_.deps.size()) - op.dep_begin;
    out_.ops.push_back(op);
    int idx = static_cast<int>(out_.ops.size()) - 1;
    if (op.stream == Stream::compute && op.kind == OpKind::compute) last_compute_ = idx;
    return idx;
  }
  static Op make(OpKind k, Stream s, Block b, Phase ph, int layer, int mb) {
    Op op;
    op.kind = k;
    op.stream = s;
    op.block = b;
    op.phase = ph;
    op.layer = layer;
    op.microbatch = mb;
    return op;
  }
  int alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph, Block b,
            std::initializer_list<int> deps = {});
  int alloc(Stream s, MemCategory cat, int64_t bytes, int layer, int mb, Phase ph, Block b,
            const std::vector<int>& deps);
  void release(int buffer, Stream s, std::initializer_list<int> deps = {}) {
    release(buffer, s, std::vector<int>(deps));
  }
  void release(int buffer, Stream s, const std::vector<int>& deps);
  int compute(Block b, Phase ph, int layer, int mb, int samples, double flops, double bytes);
  int compute(Op op, int layer, int mb);
  // A collective over the group of kind g of its layer's strategy (emit fills the degrees).
  Op collective_op(Stream s, Collective c, GroupKind g, Purpose why, int64_t bytes, Block b,
                   Phase ph, int layer, int mb) const;
  int collective(Stream s, Collective c, GroupKind g, Purpose why, int64_t bytes, Block b, Phase ph,
                 int layer, int mb, std::initializer_list<int> deps);

  // An op already emitted, for what its emitter adds to it (a cp part, a chunk).
  Op& op(int index) { return out_.ops[index]; }
  int64_t live_bytes(int buffer) const { return buffer < 0 ? 0 : out_.ops[live_.at(buffer)].bytes; }

  // ---- dependencies ----------------------------------------------------------------------
  // The next compute op waits for `op` (a collective or copy that brings what it reads).
  void compute_waits_for(int op) { compute_waits_.push_back(op); }
  // What the next compute op will wait for, besides the last one.
  const std::vector<int>& compute_waits() const { return compute_waits_; }
  int last_compute() const { return last_compute_; }
  // The chunk whose passes are being emitted, which the ops carry (-1: none).
  int chunk() const { return chunk_; }
  void set_chunk(int chunk) { chunk_ = chunk; }

 private:
  const StageContext& stage_;
  StageProgram out_;
  int chunk_ = -1;
  int last_compute_ = -1;
  int next_buffer_ = 0;
  std::vector<int> compute_waits_;
  // Flat tables in place of maps: ids are dense and known up front.
  std::vector<int> live_;  // [buffer id] its alloc op's index (-1 once released)
  int live_count_ = 0;
  std::vector<OpStrategy> op_strategy_;  // [layer + 1] its strategy packed (0: the embedding)
};

}  // namespace stratagem::program_detail
