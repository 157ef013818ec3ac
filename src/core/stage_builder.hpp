// A pipeline stage's op stream under construction: the one schedule generator's builder
// (build_program). Its parts live in program_*.cpp, one concern each.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

#include "stratagem/iteration.hpp"
#include "stratagem/program.hpp"
#include "stratagem/workload.hpp"
#include "stratagem/workload_moe.hpp"

namespace stratagem::program_detail {

class StageBuilder {
 public:
  StageBuilder(const ModelSpec& m, const Plan& p, int stage, int M, bool staging);

  // Room for about this many ops and dependencies, so that the vectors are written once
  // instead of copied as they grow (millions of ops at pp 16).
  void reserve(size_t ops, size_t deps) {
    out_.ops.reserve(ops);
    out_.deps.reserve(deps);
  }
  size_t stage_layer_count() const { return stage_layers().size(); }

  StageProgram build();

 private:
  // ---- emission ------------------------------------------------------------------------
  // Dependencies are read in place (no vector per op: a pp 16 Program has millions of ops).
  int emit(Op op, std::initializer_list<int> deps) { return emit(op, deps.begin(), deps.size()); }
  int emit(Op op, const std::vector<int>& deps) { return emit(op, deps.data(), deps.size()); }
  int emit(Op op, const int* deps, size_t ndeps) {
    // Everything the op's consumers need, from its layer's strategy: they never read the Plan.
    if (op.layer >= 0) op.recompute = strat(op.layer).recompute;
    op.strategy = op_strategy_[size_t(std::max(op.layer, -1) + 1)];
    op.dtype = p_.dtype;
    op.flash_attention = p_.flash_attention;
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

  // ---- shapes --------------------------------------------------------------------------
  const LayerStrategy& strat(int layer) const {
    return layer < 0 ? p_.embedding : p_.layers[layer];
  }
  // Plan::samples_per_rank, with the plan's largest dp taken once (it walks every layer).
  int samples(int layer) const { return stage_samples_ / strat(layer).dp; }
  int64_t boundary(int layer) const {
    return boundary_activation_bytes(m_, strat(layer), samples(layer), p_.dtype);
  }
  // A layer's block work and saved activations, the same for each of its micro-batches:
  // computed on first use, not per op.
  struct BlockCost {
    double flops = 0, bytes = 0;
  };
  struct LayerWork {
    bool ready = false;
    int64_t saved_bytes[2] = {0, 0};  // attention, mlp under the layer's recompute
    BlockCost forward[2], backward[2];
    // An MoE layer's FFN parts (router, experts, combine; program_moe.cpp), at the mean load.
    BlockCost moe_forward[3], moe_backward[3];
  };
  const LayerWork& work(int layer);
  // A layer's parameters reduced over dp (all of a dense layer's) and, of an MoE layer with
  // etp x ep > 1, its experts', reduced and sharded over the expert data-parallel group.
  int64_t layer_params(int layer) const { return dp_parameters_per_rank(m_, strat(layer), layer); }
  int64_t expert_params(int layer) const {
    return layer < 0 ? 0 : expert_dp_parameters_per_rank(m_, strat(layer), layer);
  }
  // Bytes of block b's activations layer l's recompute rebuilds.
  int64_t rebuilt(int l, Block b) const {
    if (b == Block::mlp && m_.is_moe_layer(l)) {
      const LayerStrategy& s = strat(l);
      const double load = p_.expert_load_factor(s.ep, m_.moe.experts);
      return moe_kept_activation_bytes(m_, s, samples(l), Recompute::none, p_.dtype, load) -
             moe_kept_activation_bytes(m_, s, samples(l), s.recompute, p_.dtype, load);
    }
    return recomputed_activation_bytes(m_, strat(l), b, samples(l), p_.flash_attention, p_.dtype);
  }
  bool has_embedding() const { return out_.stage == 0; }
  bool has_head() const { return out_.stage == p_.pp - 1; }
  int64_t embed_params() const {
    return end_parameters_per_rank(m_, p_.embedding.tp, has_embedding(), has_head());
  }
  std::vector<int> stage_layers() const {
    std::vector<int> ls;
    for (int c = out_.stage; c < nchunks_; c += p_.pp)
      for (int l = p_.chunks[c].begin; l < p_.chunks[c].end; ++l) ls.push_back(l);
    return ls;
  }

  int tp_before(Block b, Phase ph, int layer, int mb);
  int tp_after(Block b, Phase ph, int layer, int mb);

  void reshard(int from_layer, int to_layer, Phase ph, int mb);

  // Parameters that are not resident (ZeRO-3 shards or host-offloaded) are fetched before use.
  // The next compute op waits for the fetch, or, with `wait_out`, whoever the caller hands the
  // returned op id to (a prefetch for a later layer).
  int fetch_params(int layer, Phase ph, int mb, int after, int* wait_out = nullptr) {
    return fetch(strat(layer), layer_params(layer), layer, ph, mb, after, wait_out);
  }
  int fetch(const LayerStrategy& s, int64_t params, int layer, Phase ph, int mb, int after,
            int* wait_out = nullptr, bool experts = false);

  // ---- MoE (program_moe.cpp) -------------------------------------------------------------
  // A layer's FFN compute in a phase: the dense mlp block's one op, or an MoE layer's parts
  // around their all-to-alls. Returns the last compute op.
  int ffn(Phase ph, int layer, int mb, int samples, const BlockCost& dense);
  int moe_ffn(Phase ph, int layer, int mb, int samples);
  // ZeRO-3 over the expert data-parallel group: the experts' gather before their compute
  // (program_moe.cpp); returns the buffer, -1 when they are resident.
  int fetch_experts(Phase ph, int layer, int mb, int* wait_out);
  // ZeRO-2/3 over expert_dp: the experts' gradients staged for their reduce-scatter.
  void stage_expert_grads(int layer, int mb);
  // An MoE layer's expert gradient reduction over the expert data-parallel group: returns
  // the staging buffer it reads (-1: none) and the reduction, for the buffer's free.
  std::pair<int, int> reduce_expert_grads(int layer, int mb, int after);
  // Under tp > 1: the router weight's gradient summed over tp (returns the op, or `after`).
  int moe_router_grads_reduce(int layer, int after);
  void gather_expert_weights(int layer, int opt, int updated);

  // ---- context parallelism (program_cp.cpp) ----------------------------------------------
  // The attention block of a layer with cp > 1 in phase ph, in parts with its cp
  // communication; returns its last compute op (as compute() would the block's).
  int cp_attention(Phase ph, int layer, int mb);
  int cp_compute(AttentionPart part, Phase ph, int layer, int mb, int step = -1);
  int cp_transfer(OpKind kind, AttentionPart carries, Phase ph, int layer, int mb, int step,
                  int64_t bytes, std::initializer_list<int> deps);
  int cp_collective(Collective c, AttentionPart carries, int64_t bytes, Phase ph, int layer, int mb,
                    int after);
  // The attention block in phase ph (forward or recompute: w.forward[0], backward:
  // w.backward[0]), whole or, under cp, in parts.
  int attention(Phase ph, int layer, int mb) {
    if (strat(layer).cp > 1) return cp_attention(ph, layer, mb);
    const BlockCost& c = ph == Phase::backward ? work(layer).backward[0] : work(layer).forward[0];
    return compute(Block::attention, ph, layer, mb, samples(layer), c.flops, c.bytes);
  }

  // ---- passes --------------------------------------------------------------------------
  void forward(int chunk, int mb);

  std::tuple<int, int, int> reload(int l, int mb, int after);

  void backward(int chunk, int mb);

  Op pp_transfer(OpKind kind, GroupKind peer, Phase ph, int layer, int mb) const;

  void emit_send(Op op);

  void embedding_forward(int mb, int after);

  void embedding_backward(int mb);

  // ZeRO-2/3 reduce-scatter a layer's gradients every micro-batch: the sequence-parallel norms'
  // sum, which must precede that reduction, then runs every micro-batch too. (Not the tied
  // embeddings' sum: per micro-batch it would hold the last stage's in-order dp stream, and
  // the ZeRO-3 fetches queued behind it, until the first stage's backward of that micro-batch.)
  // Not the embedding's and head's under tied embeddings split over pipeline stages: their
  // gradients reach the shard only after the two stages' copies are summed, once per
  // iteration, so both stages stage them whole until then.
  bool per_microbatch(int layer) const {
    return grad_sync(strat(layer)).per_microbatch && !(layer < 0 && tied_split());
  }
  bool tied_split() const { return m_.tied_embeddings && p_.pp > 1; }

  int tied_reduce(int after);

  int sp_replicated_reduce(int layer, int after);

  int fetch_head(int mb, int after);

  void head(int mb, int fetched);

  // Layer gradient staging (FrameworkSpec::layer_gradient_staging): under ZeRO-2/3 the
  // backward writes a layer's whole gradients (layer -1: the stage's embedding and head's)
  // into a buffer of their own, which the reduce-scatter reads into the shard. The buffer is
  // allocated at the layer's first backward op and goes on the dp stream once that reduction
  // has landed. The free is emitted after the next layer's mlp backward: the reduction of the
  // layer above runs beside it, so the two are live together while it runs.
  bool staged(int layer) const {
    return staged_gradient_bytes(strat(layer < 0 ? -1 : layer), 1, p_.dtype, staging_) > 0;
  }
  size_t stage_slot(int layer) const { return layer < 0 ? 0 : size_t(local_of_[layer]) + 1; }
  void stage_grads(int layer, int mb);
  void flush_staging_free();

  void reduce_grads(int layer, int mb, int after);
  void reduce_layer_grads(int layer, int mb, int after);  // all but an MoE layer's experts

  int emit_reduction(Op op, const std::vector<int>& deps);
  void flush_piece();

  // ---- whole-iteration parts -------------------------------------------------------------
  void setup();

  void optimizer();

  void teardown();

  int64_t live_bytes(int buffer) const { return buffer < 0 ? 0 : out_.ops[live_.at(buffer)].bytes; }
  // Slot of (layer of this stage, micro-batch) in saved_ and offloaded_.
  size_t key(int layer, int mb) const { return size_t(local_of_[layer]) * M_ + mb; }

  const ModelSpec& m_;
  const Plan& p_;
  const int M_;
  const bool staging_;  // FrameworkSpec::layer_gradient_staging
  const int e_;
  const int nchunks_;
  const int stage_samples_;  // micro_batch * the plan's largest dp
  StageProgram out_;
  int chunk_ = -1;
  int last_compute_ = -1;
  int next_buffer_ = 0;
  int static_bufs_[3] = {-1, -1, -1};
  ModelStates states_;  // of the stage's layers, embedding and head (setup)
  int head_done_mb_ = -1;
  std::pair<int, int> pending_piece_{-1, -1};  // a reduce-scatter's piece and the reduction
  std::vector<int> compute_waits_;
  std::vector<int> grad_reductions_;
  std::vector<int> last_bwd_mb_;
  std::vector<Op> deferred_;
  // Flat tables in place of maps: ids and (layer, mb) slots are dense and known up front.
  std::vector<int> live_;  // [buffer id] its alloc op's index (-1 once released)
  int live_count_ = 0;
  std::vector<OpStrategy> op_strategy_;  // [layer + 1] its strategy packed (0: the embedding)
  std::vector<int> local_of_;            // [layer] its index among this stage's layers
  std::vector<LayerWork> work_;          // [layer]
  static constexpr std::pair<int, int> kNoSaved{-2, -2};
  std::vector<std::pair<int, int>> saved_;  // [key] the layer's saved activation buffers
  std::vector<int> offloaded_;              // [key] its activations' d2h copy (-1: none)
  // The copy that brought back the activations of the layer in backward: the sequence-parallel
  // gathers read them too, not only its compute.
  int reloaded_ = -1;
  // [stage_slot] the live staging buffer of a layer (slot 0: embedding and head), -1: none.
  std::vector<int> stage_buf_;
  // [local layer] an MoE layer's live staging buffer of its experts' gradients, -1: none.
  std::vector<int> expert_stage_buf_;
  // The experts gathered by a layer's recompute, held for its backward (-1: none).
  int experts_held_ = -1;
  // The staging buffer whose reduction was issued last, freed on the dp stream once it lands.
  int pending_free_ = -1, pending_reduce_ = -1;
  std::pair<int, int> pending_expert_free_{-1, -1};  // an MoE layer's experts': (buffer, reduction)
};

}  // namespace stratagem::program_detail
