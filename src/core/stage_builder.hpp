// The one schedule generator's builder (build_program): a pipeline stage's op stream, built by
// parts that each emit one concern's ops. All read the stage's facts (StageContext,
// stage_context.hpp) and append through the ops under construction (OpEmitter, op_emitter.hpp);
// each keeps what it alone carries from op to op, and references the parts it calls:
//   WeightFetches      (program_weights.cpp, program_moe.cpp) weights that are not resident,
//                      fetched before use: ZeRO-3 gathers, host-offloaded copies, the experts'
//   GradientReductions (program_grads.cpp, program_ends.cpp, program_moe.cpp) gradient staging
//                      and the reductions: dp, the experts' over expert_dp, deferred ones, the
//                      reduce-scatter's pieces, the sp norms', the router's and the tied sum
//   MoeFfn             (program_moe.cpp) a layer's FFN: the dense mlp's op or the MoE parts
//   CpAttention        (program_cp.cpp) a layer's attention: whole or, under cp, in parts
//   ResidentStates     (program_states.cpp, program_moe.cpp) the model states' buffers, the
//                      optimizer step and the gathers of the updated weights
//   Passes             (program_passes.cpp, program_ends.cpp) the forward and backward passes
//                      of the stage's chunks, the embedding and head, the pipeline transfers
// StageBuilder puts them together and walks the stage's schedule.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

#include "src/core/op_emitter.hpp"
#include "src/core/stage_context.hpp"
#include "stratagem/program.hpp"

namespace stratagem::program_detail {

// Parameters that are not resident (ZeRO-3 shards or host-offloaded) are fetched before use.
// The next compute op waits for the fetch, or, with `wait_out`, whoever the caller hands the
// returned op id to (a prefetch for a later layer). Each returns the fetched weights' buffer,
// -1 when they are resident.
class WeightFetches {
 public:
  WeightFetches(const StageContext& stage, OpEmitter& ops) : stage_(stage), ops_(ops) {}

  int fetch_params(int layer, Phase ph, int mb, int after, int* wait_out = nullptr) {
    return fetch(stage_.strat(layer), stage_.layer_params(layer), layer, ph, mb, after, wait_out);
  }
  int fetch(const LayerStrategy& s, int64_t params, int layer, Phase ph, int mb, int after,
            int* wait_out = nullptr, bool experts = false);
  // ZeRO-3 over the expert data-parallel group: the experts' gather before their compute
  // (program_moe.cpp).
  int fetch_experts(Phase ph, int layer, int mb, int* wait_out);
  int fetch_head(int mb, int after);

 private:
  const StageContext& stage_;
  OpEmitter& ops_;
};

// A stage's gradient staging and reductions (program_grads.cpp; the tied embeddings' and the
// sequence-parallel norms' sums in program_ends.cpp, the experts' and router's in
// program_moe.cpp).
// Layer gradient staging (FrameworkSpec::layer_gradient_staging): under ZeRO-2/3 the
// backward writes a layer's whole gradients (layer -1: the stage's embedding and head's)
// into a buffer of their own, which the reduce-scatter reads into the shard. The buffer is
// allocated at the layer's first backward op and goes on the dp stream once that reduction
// has landed. The free is emitted after the next layer's mlp backward: the reduction of the
// layer above runs beside it, so the two are live together while it runs.
class GradientReductions {
 public:
  GradientReductions(const StageContext& stage, OpEmitter& ops);

  void stage_grads(int layer, int mb);
  void flush_staging_free();
  void reduce_grads(int layer, int mb, int after);
  // Under tp > 1: the router weight's gradient summed over tp (returns the op, or `after`).
  int moe_router_grads_reduce(int layer, int after);
  int tied_reduce(int after);
  int sp_replicated_reduce(int layer, int after);
  // At the iteration's end: the reductions deferred to it (without overlap) and what they free.
  void reduce_deferred();
  // The reductions issued in the passes, which the optimizer step waits for.
  const std::vector<int>& issued() const { return grad_reductions_; }

 private:
  bool staged(int layer) const {
    return staged_gradient_bytes(stage_.strat(layer < 0 ? -1 : layer), 1, stage_.plan.dtype,
                                 stage_.framework.layer_gradient_staging) > 0;
  }
  size_t stage_slot(int layer) const { return layer < 0 ? 0 : size_t(stage_.local_of[layer]) + 1; }
  // ZeRO-2/3 over expert_dp: the experts' gradients staged for their reduce-scatter.
  void stage_expert_grads(int layer, int mb);
  void reduce_layer_grads(int layer, int mb, int after);  // all but an MoE layer's experts
  // An MoE layer's expert gradient reduction over the expert data-parallel group: returns
  // the staging buffer it reads (-1: none) and the reduction, for the buffer's free.
  std::pair<int, int> reduce_expert_grads(int layer, int mb, int after);
  int emit_reduction(Op op, const std::vector<int>& deps);
  void flush_piece();

  const StageContext& stage_;
  OpEmitter& ops_;
  std::vector<int> grad_reductions_;
  std::vector<Op> deferred_;
  std::pair<int, int> pending_piece_{-1, -1};  // a reduce-scatter's piece and the reduction
  // [stage_slot] the live staging buffer of a layer (slot 0: embedding and head), -1: none.
  std::vector<int> stage_buf_;
  // [local layer] an MoE layer's live staging buffer of its experts' gradients, -1: none.
  std::vector<int> expert_stage_buf_;
  // The staging buffer whose reduction was issued last, freed on the dp stream once it lands.
  int pending_free_ = -1, pending_reduce_ = -1;
  std::pair<int, int> pending_expert_free_{-1, -1};  // an MoE layer's experts': (buffer, reduction)
};

// A layer's FFN compute in a phase: the dense mlp block's one op, or an MoE layer's parts
// around their all-to-alls (program_moe.cpp). Returns the last compute op.
class MoeFfn {
 public:
  MoeFfn(const StageContext& stage, OpEmitter& ops, WeightFetches& weights)
      : stage_(stage), ops_(ops), weights_(weights) {}

  int ffn(Phase ph, int layer, int mb, int samples, const StageContext::BlockCost& dense);

 private:
  int moe_ffn(Phase ph, int layer, int mb, int samples);

  const StageContext& stage_;
  OpEmitter& ops_;
  WeightFetches& weights_;
  // The experts gathered by a layer's recompute, held for its backward (-1: none).
  int experts_held_ = -1;
};

// The attention block in phase ph (forward or recompute: w.forward[0], backward:
// w.backward[0]), whole or, under cp, in parts with its cp communication (program_cp.cpp).
// Returns its last compute op (as compute() would the block's).
class CpAttention {
 public:
  CpAttention(const StageContext& stage, OpEmitter& ops) : stage_(stage), ops_(ops) {}

  int attention(Phase ph, int layer, int mb) {
    if (stage_.strat(layer).cp > 1) return cp_attention(ph, layer, mb);
    const StageContext::LayerWork& w = stage_.work(layer);
    const StageContext::BlockCost& c = ph != Phase::backward   ? w.forward[0]
                                       : stage_.split_backward ? w.input_grad[0]
                                                               : w.backward[0];
    return ops_.compute(Block::attention, ph, layer, mb, stage_.samples(layer), c.flops, c.bytes);
  }

 private:
  int cp_attention(Phase ph, int layer, int mb);
  int cp_compute(AttentionPart part, Phase ph, int layer, int mb, int step = -1);
  int cp_transfer(OpKind kind, AttentionPart carries, Phase ph, int layer, int mb, int step,
                  int64_t bytes, std::initializer_list<int> deps);
  int cp_collective(Collective c, AttentionPart carries, int64_t bytes, Phase ph, int layer, int mb,
                    int after);

  const StageContext& stage_;
  OpEmitter& ops_;
};

// The whole-iteration parts (program_states.cpp): the resident model states' buffers, the
// optimizer step that updates them (after the gradients' reductions) and their release.
class ResidentStates {
 public:
  ResidentStates(const StageContext& stage, OpEmitter& ops, const GradientReductions& grads)
      : stage_(stage), ops_(ops), grads_(grads) {}

  void setup();
  void optimizer();
  void teardown();

 private:
  void gather_expert_weights(int layer, int opt, int updated);  // program_moe.cpp

  const StageContext& stage_;
  OpEmitter& ops_;
  const GradientReductions& grads_;
  int static_bufs_[3] = {-1, -1, -1};  // weights, grads, optimizer
  ModelStates states_;                 // of the stage's layers, embedding and head (setup)
};

// The stage's forward and backward passes of its chunks (program_passes.cpp), with the
// embedding and the LM head (program_ends.cpp), the pipeline transfers, the tensor-parallel
// and reshard collectives around a block, and activation offload.
class Passes {
 public:
  Passes(const StageContext& stage, OpEmitter& ops, WeightFetches& weights,
         GradientReductions& grads, MoeFfn& moe, CpAttention& cp);

  void forward(int chunk, int mb);
  void backward(int chunk, int mb);
  // A split backward's W of the chunk's layers (program_weight_grads.cpp): their weight
  // gradients, the buffers only W read, and the gradient reductions that wait for them.
  void weight(int chunk, int mb);
  // Tied embeddings split over pipeline stages: the head's gradients, held since its last
  // backward, reduced once the stage's backward passes are done.
  void reduce_tied_head();

 private:
  std::tuple<int, int, int> reload(int l, int mb, int after);
  std::pair<int, int> rebuild(int l, int mb);
  Op pp_transfer(OpKind kind, GroupKind peer, Phase ph, int layer, int mb) const;
  void emit_send(Op op);
  void embedding_forward(int mb, int after);
  void embedding_backward(int mb);
  void head(int mb, int fetched);
  int tp_before(Block b, Phase ph, int layer, int mb);
  int tp_after(Block b, Phase ph, int layer, int mb);
  void reshard(int from_layer, int to_layer, Phase ph, int mb);
  // Slot of (layer of this stage, micro-batch) in saved_ and offloaded_.
  size_t key(int layer, int mb) const {
    return size_t(stage_.local_of[layer]) * stage_.microbatches + mb;
  }

  const StageContext& stage_;
  OpEmitter& ops_;
  WeightFetches& weights_;
  GradientReductions& grads_;
  MoeFfn& moe_;
  CpAttention& cp_;
  int head_done_mb_ = -1;  // the head's last backward, under a tied split (-1: none)
  static constexpr std::pair<int, int> kNoSaved{-2, -2};
  std::vector<std::pair<int, int>> saved_;  // [key] the layer's saved activation buffers
  std::vector<int> offloaded_;              // [key] its activations' d2h copy (-1: none)
  // Split backward: what a layer's W reads and frees, held from its forward and B.
  struct WeightInputs {
    int kept[2] = {-1, -1};     // attention, mlp: the GEMM inputs forward saved for W
    int stash[2] = {-1, -1};    // the output gradients (and sp's gathered input) B left
    int rebuilt[2] = {-1, -1};  // full recompute: the rebuilt activations, inputs included
  };
  std::vector<WeightInputs> weight_inputs_;  // [key]
  // The layer's reductions once its gradients are final (`ready`): the sp norms', the
  // router's, then dp.
  void reduce_layer(int chunk, int l, int mb, int ready);
  // The copy that brought back the activations of the layer in backward: the sequence-parallel
  // gathers read them too, not only its compute.
  int reloaded_ = -1;
};

// Puts the parts together and walks the stage's schedule (program_passes.cpp).
class StageBuilder {
 public:
  StageBuilder(const ModelSpec& model, const Plan& plan, int stage, int microbatches,
               const FrameworkSpec& framework)
      : stage_(model, plan, stage, microbatches, framework) {}

  void reserve(size_t ops, size_t deps) { ops_.reserve(ops, deps); }
  size_t stage_layer_count() const { return stage_.stage_layers().size(); }

  StageProgram build();

 private:
  // The facts and the ops under construction first, so that they go last: the parts only
  // reference them.
  StageContext stage_;
  OpEmitter ops_{stage_};
  WeightFetches weights_{stage_, ops_};
  GradientReductions grads_{stage_, ops_};
  MoeFfn moe_{stage_, ops_, weights_};
  CpAttention cp_{stage_, ops_};
  ResidentStates states_{stage_, ops_, grads_};
  Passes passes_{stage_, ops_, weights_, grads_, moe_, cp_};
};

}  // namespace stratagem::program_detail
