// What one rank of the executor runs and keeps, in one place that every op handler references
// (exec/impl.hpp lists them): the handlers keep nothing of their own, so what one op leaves for
// another (a micro-batch's tensors, a transfer's completion, a bound fetch buffer) is here. Its
// parts, each named for what it holds:
//   buffers  (exec/buffers.hpp)    the Program's buffers as arenas, which holds what, scratch
//   shards   (exec/shard_state.hpp) the parameters this rank holds, their partition, AdamW
//   offload  (exec/offload.hpp)    the host pool, the host optimizer, the copy streams
//   requests (exec/requests.hpp)   the transfers in flight and their completions
//   streams  (exec/streams.hpp)    the rank's place in the Program and what ran ahead of it
//   current_step (exec/step_state.hpp) the micro-batches' tensors, the loss, the result
// exec/setup.cpp builds it; exec/rank_context.cpp answers what the ops ask of it.
#pragma once
#include <map>
#include <tuple>
#include <vector>

#include "src/runtime/exec/buffers.hpp"
#include "src/runtime/exec/offload.hpp"
#include "src/runtime/exec/requests.hpp"
#include "src/runtime/exec/shard_state.hpp"
#include "src/runtime/exec/step_state.hpp"
#include "src/runtime/exec/streams.hpp"
#include "src/runtime/rank_plan.hpp"
#include "stratagem/executor.hpp"

namespace stratagem::exec {

struct RankContext {
  RankContext(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
              const SampleSource& samples, ExecutorOptions options);
  ~RankContext();
  // The handlers hold references to it: it stays where it was built.
  RankContext(const RankContext&) = delete;
  RankContext& operator=(const RankContext&) = delete;

  // ---- what the rank runs ----------------------------------------------------------------
  ParallelState& parallel;
  const ModelSpec& model_spec;
  Plan plan;
  Backend& backend;
  const SampleSource& samples;
  ExecutorOptions options;
  Program program;  // built with the framework options.framework names
  const StageProgram* stage_program = nullptr;
  int stage = 0;
  int T = 1;  // the tokens of a sample this rank holds: seq_len / cp
  // The rank's share of each sequence under context parallelism (cp = 1: the whole).
  SequenceShare sequence;
  TransformerConfig whole;  // the model, unsharded
  // Per layer of the model, and -1 for the embedding and head: its share of the stage's
  // devices (its tp share, samples and token shard; rank_plan.hpp).
  std::map<int, LayerShare> shares;

  // ---- the parts: destroyed in reverse order, so offload's copy streams are drained and
  // joined before the tensors their work touches go -------------------------------------
  Buffers buffers;
  Shards shards;
  StepState current_step;
  Requests requests;
  Streams streams;
  Offload offload;
  // The most rows this rank's experts took in one dispatch, over the balanced mean (the
  // rank's own copies): 1 until an expert-parallel dispatch runs.
  double moe_busiest_load = 1.0;

  // ---- what the ops ask of it ------------------------------------------------------------
  const LayerShare& share(int layer) const { return shares.at(layer < 0 ? -1 : layer); }
  // The residual stream (this rank's token shard) and the whole micro-batch entering `layer`
  // (-1: the embedding's and head's).
  Shape stream_shape(int layer = -1) const {
    return Shape{share(layer).shard_tokens, int64_t(whole.hidden)};
  }
  // LayerStrategy::stream_tp of the layer's share: 1 under sequence parallelism.
  int stream_tp(int layer) const { return share(layer).sequence_parallel ? 1 : share(layer).tp; }
  Shape full_shape(int layer = -1) const {
    return Shape{share(layer).samples, T, int64_t(whole.hidden)};
  }
  // Micro-batch m's state in this step; this rank's samples of it at its first use (exec/
  // rank_context.cpp, as what follows).
  Micro& mb(int m);
  Communicator& group_of(const Op& op);  // the op's group, resolved for this rank
  // The segment a dp-stream collective reduces or gathers: the layer's, or its experts'.
  int segment_key(const Op& op) const;
  // The tensors a weight fetch (a ZeRO-3 gather, an h2d copy of offloaded weights) binds.
  std::vector<const ParamInfo*> fetch_set(const Op& op, Micro* m) const;

 private:
  // ---- building it (exec/setup.cpp) ------------------------------------------------------
  std::tuple<int, int, int> place_static_buffers();  // (weights, grads, optimizer) ids
  void make_shares(const std::vector<int>& held);
  // The compute op of an MoE layer's experts in the Program (what it carries sizes the
  // experts' scratch), nullptr when none runs them.
  const Op* experts_op(int layer) const;
  void make_scratch();
  void make_model(const ModelPart& part, const std::vector<int>& held, int weights_buffer,
                  int grads_buffer);
  void make_device_optimizer(int optimizer_buffer);
  void make_host_optimizer();
};

}  // namespace stratagem::exec
