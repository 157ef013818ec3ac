// The plan as one rank of the runtime reads it, before it runs any op: the model part its
// stage holds, each layer's share of the stage's devices, and where each layer's parameters
// live (its ZeRO partition, host or device). This is the runtime's one reader of the plan's
// per-layer strategies; what each op does (recompute, offload copies, gradient staging) the
// executor takes from the Program's ops, built here with the runtime's framework file.
#pragma once
#include <vector>

#include "src/runtime/exec/shards.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/program.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem::exec {

// One layer's place in the parallel layout (layer -1: the embedding and head's). A
// heterogeneous plan gives each layer its own tp and dp (their product is the stage's device
// count): its own tensor-parallel share, and its own samples per rank.
struct LayerShare {
  int tp = 1, tp_index = 0, dp = 1, dp_index = 0;
  // Context parallelism: the rank's place in its cp group, whose ranks hold the same samples
  // and each two chunks of their sequences (dp_index is the samples' index, without cp).
  int cp = 1, cp_index = 0;
  bool sequence_parallel = false;
  int samples = 1;  // per rank per micro-batch
  // The rank's tokens per micro-batch (samples x seq_len / cp), and its token shard (1/tp of
  // them under sequence parallelism).
  int64_t tokens = 1, shard_tokens = 1;
  TransformerConfig local;
  Workspace* ws = nullptr;  // the backward's scratch, for the layers this stage holds
};

// The model part a rank of `stage` (at index `local` in it) holds: its chunks' layers, the
// embedding on the first stage, the head on the last, and of each its tensor-parallel share.
ModelPart stage_part(const Plan& plan, int stage, int local);

// Layer `layer`'s (-1: the embedding and head's) share on the rank at index `local` of its
// stage; `rows`: the tokens of each sample the rank holds (seq_len / cp). Throws InputError
// when its tokens do not split over its sequence-parallel group.
LayerShare layer_share(const Plan& plan, const TransformerConfig& whole, int rows, int layer,
                       int local);

// Where the parameters of `layers` (and of the embedding and head, first) live.
std::vector<SegmentPlacement> segment_placements(const Plan& plan, const std::vector<int>& layers);

// The framework file the run names (ExecutorOptions::framework), checked to be one whose
// Program the executor runs for `plan`.
FrameworkSpec runtime_framework(const std::string& name_or_path, const Plan& plan);

}  // namespace stratagem::exec
