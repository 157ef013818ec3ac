// Per-stage figures of a plan in closed form, shared by the estimator (estimate.cpp) and
// stage_memory (memory.cpp): one walk over the layers, costing each distinct layer strategy
// once, with no Program and no per-op allocation.
#pragma once
#include <cstdint>
#include <vector>

#include "stratagem/cost.hpp"

namespace stratagem::cost_detail {

// What one stage's rank does per micro-batch and after the last one.
struct StageCost {
  // Per micro-batch, summed over the stage's chunks (seconds on one rank).
  double fwd_s = 0, bwd_s = 0, rec_s = 0;  // kernels (embedding and head included)
  double weight_grad_s = 0;                // split backward: the part of bwd_s that is W
  double tp_s = 0;                         // tensor-parallel, reshard and loss collectives
  double tp_bwd_s = 0;                     // the part of tp_s in backward and recompute
  double ep_s = 0;         // MoE all-to-alls and expert-tensor collectives (compute waits)
  double ep_bwd_s = 0;     // the part of ep_s in backward and recompute
  double cp_s = 0;         // context-parallel communication compute waits for
  double cp_bwd_s = 0;     // the part of cp_s in backward and recompute
  double dp_stream_s = 0;  // ZeRO-2/3 traffic the dp stream carries
  double h2d_stream_s = 0, d2h_stream_s = 0;
  double first_fetch_s = 0;             // transfers nothing precedes (cannot prefetch)
  double p2p_fwd_s = 0, p2p_bwd_s = 0;  // activation / gradient sends, all chunks
  // The framework's host time to issue the stage's layers (CostModel::host_issue_layer_s):
  // the GPU cannot finish a micro-batch sooner.
  double host_issue_s = 0;
  // After the last micro-batch.
  double reduce_exposed_s = 0;  // gradient reductions (and tied-embedding sum) not hidden
  double gather_s = 0;          // ZeRO-1/2 weight all-gather after the step
  double optimizer_s = 0;       // device optimizer step
  double host_s = 0;            // offloaded optimizer: copies + CPU step
  MemoryBreakdown memory;       // peak of one rank
  int64_t workspace_bytes = 0;  // part of memory.buffers_bytes not allocated by the Program
  bool operator==(const StageCost&) const = default;
};

// Fills one StageCost per pipeline stage. Without `with_time` only the memory is computed.
// `reuse_stages`: a stage that repeats the one before it takes its figures (the same
// arithmetic); false walks every stage (the test that they agree).
void analyze(const CostModel& cost, const Plan& plan, bool with_time, std::vector<StageCost>& out,
             bool reuse_stages = true);

}  // namespace stratagem::cost_detail
