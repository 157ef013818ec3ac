// What one pipeline stage's Program is built from, in one place that every part of the
// schedule generator references (stage_builder.hpp lists them): the model, the plan, the
// stage's schedule and layers, and what each layer's ops weigh. It holds facts only: the ops
// under construction are the OpEmitter's (op_emitter.hpp), what one part leaves for another
// (a staged gradient, a saved activation) is the part's own.
#pragma once
#include <cstdint>
#include <vector>

#include "stratagem/framework.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/program.hpp"
#include "stratagem/schedule.hpp"
#include "stratagem/workload.hpp"
#include "stratagem/workload_moe.hpp"

namespace stratagem::program_detail {

struct StageContext {
  StageContext(const ModelSpec& model, const Plan& plan, int stage, int microbatches,
               const FrameworkSpec& framework);
  // The parts hold references to it: it stays where it was built.
  StageContext(const StageContext&) = delete;
  StageContext& operator=(const StageContext&) = delete;

  // ---- what the stage is built from ------------------------------------------------------
  const ModelSpec& model;
  const Plan& plan;
  const int stage;
  const int microbatches;
  const FrameworkSpec& framework;  // what the training software holds beyond the plan
  const int element_bytes;         // of the plan's dtype
  const int chunk_count;           // the plan's chunks, over all stages
  const int stage_samples;         // micro_batch * the plan's largest dp
  // The stage's forward and backward passes in order (stage_schedule).
  const std::vector<PassStep> steps;
  // The schedule splits each backward into B and W (zb-h1, zb-h2): a layer's weight
  // gradients, and the reduction that reads them, come with its W passes.
  const bool split_backward;
  // [chunk] the micro-batch whose backward comes last on it: gradients are final after it
  // (after its W where the backward is split: W runs in the order of B).
  std::vector<int> last_backward_mb;
  std::vector<int> local_of;  // [layer] its index among this stage's layers (-1: another's)

  // ---- shapes ----------------------------------------------------------------------------
  const LayerStrategy& strat(int layer) const {
    return layer < 0 ? plan.embedding : plan.layers[layer];
  }
  // Plan::samples_per_rank, with the plan's largest dp taken once (it walks every layer).
  int samples(int layer) const { return stage_samples / strat(layer).dp; }
  int64_t boundary(int layer) const {
    return boundary_activation_bytes(model, strat(layer), samples(layer), plan.dtype);
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
    // Split backward: B and W of each block, and what W reads beyond the weights
    // (weight_input_bytes, weight_stash_bytes).
    BlockCost input_grad[2], weight_grad[2];
    int64_t weight_input_bytes[2] = {0, 0}, weight_stash_bytes[2] = {0, 0};
    // An MoE layer's FFN parts (router, experts, combine; program_moe.cpp), at the mean load.
    BlockCost moe_forward[3], moe_backward[3];
  };
  const LayerWork& work(int layer) const;
  // A layer's parameters reduced over dp (all of a dense layer's) and, of an MoE layer with
  // etp x ep > 1, its experts', reduced and sharded over the expert data-parallel group.
  int64_t layer_params(int layer) const {
    return dp_parameters_per_rank(model, strat(layer), layer);
  }
  int64_t expert_params(int layer) const {
    return layer < 0 ? 0 : expert_dp_parameters_per_rank(model, strat(layer), layer);
  }
  // Bytes of block b's activations layer l's recompute rebuilds.
  int64_t rebuilt(int l, Block b) const {
    if (b == Block::mlp && model.is_moe_layer(l)) {
      const LayerStrategy& s = strat(l);
      const double load = plan.expert_load_factor(s.ep, model.moe.experts);
      return moe_kept_activation_bytes(model, s, samples(l), Recompute::none, plan.dtype, load) -
             moe_kept_activation_bytes(model, s, samples(l), s.recompute, plan.dtype, load);
    }
    return recomputed_activation_bytes(model, strat(l), b, samples(l), plan.flash_attention,
                                       plan.dtype);
  }
  bool has_embedding() const { return stage == 0; }
  bool has_head() const { return stage == plan.pp - 1; }
  int64_t embed_params() const {
    return end_parameters_per_rank(model, plan.embedding.tp, has_embedding(), has_head());
  }
  std::vector<int> stage_layers() const {
    std::vector<int> ls;
    for (int c = stage; c < chunk_count; c += plan.pp)
      for (int l = plan.chunks[c].begin; l < plan.chunks[c].end; ++l) ls.push_back(l);
    return ls;
  }

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
  bool tied_split() const { return model.tied_embeddings && plan.pp > 1; }

 private:
  mutable std::vector<LayerWork> work_;  // [layer], filled by work() on first use
};

}  // namespace stratagem::program_detail
