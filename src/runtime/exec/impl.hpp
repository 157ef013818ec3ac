// Inside the executor (executor.hpp): one rank running its stage Program. Impl dispatches the
// ops; what it keeps is in parts, each named for what it holds:
//   buffers  (exec/buffers.hpp)    the Program's buffers as arenas, which holds what, scratch
//   shards   (exec/shard_state.hpp) the parameters this rank holds, their partition, AdamW
//   offload  (exec/offload.hpp)    the host pool, the host optimizer, the copy streams
//   requests (exec/requests.hpp)   the transfers in flight and their completions
//   streams  (exec/streams.hpp)    the rank's place in the Program and what ran ahead of it
//   current_step (exec/step_state.hpp) the micro-batches' tensors, the loss, the result
// exec/setup.cpp builds them; exec/dispatch.cpp runs the op loop, dependencies and memory
// samples; exec/run_ahead.cpp the prefetching streams; ops_compute.cpp, ops_comm.cpp,
// ops_cp.cpp, ops_moe.cpp, ops_offload.cpp and reshard.cpp what each op does.
#pragma once
#include <functional>
#include <map>
#include <memory>
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

namespace stratagem {

struct Executor::Impl {
  Impl(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
       const SampleSource& samples, ExecutorOptions options);
  ~Impl();

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
  std::map<int, exec::LayerShare> shares;

  // ---- the parts: destroyed in reverse order, so offload's copy streams are drained and
  // joined before the tensors their work touches go -------------------------------------
  exec::Buffers buffers;
  exec::Shards shards;
  exec::StepState current_step;
  exec::Requests requests;
  exec::Streams streams;
  exec::Offload offload;
  // The most rows this rank's experts took in one dispatch, over the balanced mean (the
  // rank's own copies): 1 until an expert-parallel dispatch runs.
  double moe_busiest_load = 1.0;

  // ---- exec/setup.cpp --------------------------------------------------------------------
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

  // ---- exec/dispatch.cpp -----------------------------------------------------------------
  StepResult step(int64_t step);
  void run(uint32_t index);
  void run_alloc(const Op& op);
  void run_free(const Op& op);
  void complete(int op);  // waits for op's transfer and runs its completion (once)
  void complete_all();
  void poll_sends();
  bool deps_landed(uint32_t op);    // every transfer op waits for has landed (tested, not waited)
  void complete_deps(uint32_t op);  // completes every transfer op waits for
  void run_pending_free(uint32_t op);    // completes what the free waits for, then runs it
  void drain_frees_before(uint32_t op);  // runs the pending frees the Program puts before op
  void poll_frees();                     // runs the pending frees whose transfers have landed
  void run_timed(uint32_t op);           // run(), with its timing entry
  int64_t now_ns() const;
  void sample_memory();

  // ---- exec/run_ahead.cpp ----------------------------------------------------------------
  void start_run_ahead();
  bool waits_only_on_issued(uint32_t op) const;
  bool may_run_ahead(const exec::Streams::Ahead& a, uint32_t op);
  bool run_ahead();  // runs what may start now; whether anything ran
  void free_landed_before(uint32_t op);
  void land_reductions_before(int64_t compute);
  bool may_soon_run_ahead() const;  // a stream's next op waits only for transfers in flight

  // ---- ops_compute.cpp -------------------------------------------------------------------
  void compute(const Op& op);
  exec::Micro& mb(int m);
  Tensor materialize(exec::Flow& f, int buffer, Shape shape);
  const exec::LayerShare& share(int layer) const { return shares.at(layer < 0 ? -1 : layer); }
  // The residual stream (this rank's token shard) and the whole micro-batch entering `layer`
  // (-1: the embedding's and head's).
  Shape stream_shape(int layer = -1) const { return Shape{share(layer).Ns, int64_t(whole.hidden)}; }
  // LayerStrategy::stream_tp of the layer's share: 1 under sequence parallelism.
  int stream_tp(int layer) const { return share(layer).sequence_parallel ? 1 : share(layer).tp; }
  Shape full_shape(int layer = -1) const { return Shape{share(layer).B, T, int64_t(whole.hidden)}; }
  // Between layers whose dp differs without a collective (the next layer's dp is larger): this
  // rank's slice of the samples, of the stream entering `layer` in forward or of the gradient
  // leaving it in backward (exec/reshard.cpp).
  void fit_flow(exec::Flow& f, int layer);
  void fit_grad(exec::Micro& m, int layer);
  void reshard(const Op& op, int index);  // the Program's reshard all-gathers
  void embedding_forward(const Op& op);
  void embedding_backward(const Op& op);
  void block_input(const Op& op, exec::Micro& m, exec::LayerState& ls);
  void block_forward(const Op& op);
  void drop_unsaved_block_input(const Op& op, exec::LayerState& ls);
  void block_backward(const Op& op);
  void head_forward(const Op& op);
  void head_backward(const Op& op);
  void head_loss_sums(exec::Micro& m);
  void head_loss(exec::Micro& m);
  void finish_block_backward(int layer, Block b, exec::Micro& m, const Tensor& d_xn);
  void norm_head_input(exec::Micro& m);
  void finish_head_backward(exec::Micro& m, const Tensor& d_xn);
  void optimizer_step();
  // A reduce-scatter's received piece of n floats, in the Program's buffer the op names.
  Tensor received_piece(const Op& op, int index, int64_t n);
  void stage_gradients(int layer);  // ZeRO-2: bind the layer's gradients to fresh staging
  std::vector<const ParamInfo*> fetch_set(const Op& op, exec::Micro* m) const;
  void fetch(const Op& op, int index);  // ZeRO-3: gather a layer's (or embedding's) weights
  bool attention_keeps_probs(const Op& op) const;

  // ---- ops_cp.cpp ------------------------------------------------------------------------
  // A context-parallel attention's ops: the pass of the op's phase (made at its first op), its
  // core steps, its end (before post in forward, pre in backward) and its cp transfers.
  exec::CpRun& cp_run(const Op& op);
  int cp_work_buffer(const Op& op) const;  // the pass's working buffer in the Program
  void cp_core(const Op& op);
  void cp_finish(const Op& op);
  void cp_transfer(const Op& op, int index);

  // ---- ops_moe.cpp -----------------------------------------------------------------------
  // An MoE layer's FFN: its router, experts and combine compute ops, and its all-to-alls.
  void moe_compute(const Op& op);
  void moe_router(const Op& op, exec::Micro& m, exec::LayerState& ls);
  void moe_experts(const Op& op, exec::LayerState& ls);
  void moe_combine(const Op& op, exec::Micro& m, exec::LayerState& ls);
  void moe_router_back(const Op& op, exec::Micro& m, exec::LayerState& ls);
  void moe_experts_back(const Op& op, exec::LayerState& ls);
  void moe_combine_back(const Op& op, exec::Micro& m, exec::LayerState& ls);
  void ep_collective(const Op& op, int index);
  void etp_collective(const Op& op);  // the expert-tp all-gather and reduce-scatter (blocking)
  void moe_aux_sum(const Op& op);     // tp > 1: the load-balancing loss's sums over tp
  void add_aux_loss(const exec::LayerShare& sh, const MoeActs& a);
  // The segment a dp-stream collective reduces or gathers: the layer's, or its experts'.
  int segment_key(const Op& op) const;

  // ---- ops_offload.cpp -------------------------------------------------------------------
  void copy(const Op& op, int index);  // copy_h2d / copy_d2h on their streams
  void host_compute(const Op& op, int index);
  void offload_activations(const Op& op, int index);
  void reload_activations(const Op& op, int index);
  // Binds the fetch set of `op` inside its fetch buffer and copies in this rank's part (its
  // ZeRO-3 piece, or the whole tensors): now, or on the h2d stream when `stream` is given.
  void place_fetch(const Op& op, exec::CopyStream* stream, int index);

  // ---- ops_comm.cpp ----------------------------------------------------------------------
  void collective(const Op& op, int index);
  void tp_collective(const Op& op, int index);
  // The gradients of weights replicated over tp that each rank computed from its own tokens:
  // the norms' under sequence parallelism, an MoE layer's router's (Block::router).
  void tp_norm_grads_sum(const Op& op, int index);
  void tp_gather(const Op& op, int index);
  void tp_reduce(const Op& op, int index);  // a partial sum's all-reduce or reduce-scatter
  Communicator& group_of(const Op& op);     // the op's group, resolved for this rank
  void dp_collective(const Op& op, int index);
  void send(const Op& op, int index);
  void recv(const Op& op, int index);
  int pp_tag(const Op& op, bool sending) const;
};

}  // namespace stratagem
