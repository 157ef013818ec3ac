// Inside the executor (executor.hpp): the state one rank keeps while it runs its stage
// Program. executor.cpp holds the op loop, dependencies and memory samples; ops_compute.cpp
// what each compute op does; ops_comm.cpp the collectives, sends and receives.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "src/runtime/exec/copy_stream.hpp"
#include "src/runtime/exec/memory.hpp"
#include "src/runtime/exec/shards.hpp"
#include "stratagem/executor.hpp"

namespace stratagem {

// A residual-stream (or gradient) value that may still be in flight: value = base (+ add),
// ready once op `producer` has completed. The residual add of a tensor-parallel block waits
// for its reduction, so it happens where the value is next used.
struct Flow {
  Tensor base, add;
  int producer = -1;
  bool defined() const { return base.defined(); }
};

// What one layer of one micro-batch keeps between its forward and its backward.
struct LayerState {
  Tensor x_in, x_mid;  // inputs of the attention and the mlp block (token shard under sp)
  AttentionActs attn;
  MlpActs mlp;
};

struct Micro {
  std::vector<int32_t> tokens, targets, ids;  // ids: this rank's vocabulary-shard ids or -1
  bool embedded = false;                      // the lookup has run on this stage
  Flow fwd;                                   // forward residual stream
  Flow rec;                                   // full recompute's stream
  Tensor grad;                                // dL/d(stream) in backward (token shard under sp)
  int grad_producer = -1;
  std::map<int, LayerState> layers;
  Tensor partial;   // a block's partial output or input gradient, before its tp reduction
  Tensor gathered;  // a gathered (whole-sequence) normalized input
  Tensor gathered_dy;
  // head: final norm input/statistics, normalized input, logits and loss statistics
  Tensor x_final, xn, xn_whole, head_mean, head_rstd, logits, ce_max, ce_sums;
};

// One layer's place in the parallel layout (layer -1: the embedding and head's). A
// heterogeneous plan gives each layer its own tp and dp (their product is the stage's device
// count): its own tensor-parallel share, and its own samples per rank.
struct LayerShare {
  int tp = 1, tp_index = 0, dp = 1, dp_index = 0;
  bool sp = false;        // sequence parallel
  int B = 1;              // samples per rank per micro-batch
  int64_t N = 1, Ns = 1;  // tokens per micro-batch, and this rank's token shard
  TransformerConfig local;
  Workspace* ws = nullptr;
};

struct Executor::Impl {
  Impl(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
       const SampleSource& samples, ExecutorOptions options);
  ~Impl();

  // ---- identity --------------------------------------------------------------------------
  ParallelState& ps;
  const ModelSpec& spec;
  Plan plan;
  Backend& be;
  const SampleSource& samples;
  ExecutorOptions opt;
  Program program;
  const StageProgram* sp = nullptr;
  int stage = 0, tp = 1, tp_index = 0, dp = 1, dp_index = 0;
  bool sp_on = false;     // sequence parallel
  int B = 1, T = 1;       // samples per rank per micro-batch, sequence length
  int64_t N = 1, Ns = 1;  // tokens per micro-batch, and this rank's token shard
  TransformerConfig whole, local;
  // Per layer of this stage (and -1); the members above are the embedding and head's.
  std::map<int, LayerShare> shares;
  std::map<int, Workspace> workspaces;              // the backward's scratch, by tp degree
  std::map<int, TransformerConfig> scratch_config;  // the tp share each scratch set is for
  Tensor scratch_arena;                             // the scratch sets' one arena (views into it)

  // ---- state -----------------------------------------------------------------------------
  std::shared_ptr<exec::MemoryLedger> ledger;
  exec::BufferPool pool;
  Model model;
  std::unique_ptr<AdamW> adamw;
  // Each layer's ZeRO partition, and where model.params, model.grads and AdamW's moments
  // hold which flat elements (exec/shards.hpp).
  exec::Sharding shards;
  std::vector<AdamW::Run> adamw_runs;  // the device update, one piece per state run
  // Weights are bound only while a fetch buffer holds them (ZeRO-3 layers, offloaded weights).
  std::map<int, std::vector<const ParamInfo*>> fetched;  // fetch buffer -> tensors bound
  // ---- offloading (ZeRO-Offload, H3T): the host pool, apart from the device's ledger ------
  std::shared_ptr<exec::MemoryLedger> host_ledger;
  exec::BufferPool host_pool;
  int next_host_buffer = 0;
  Tensor host_params;                 // the weights of layers that offload them
  std::unique_ptr<AdamW> host_adamw;  // the state of layers that offload it
  std::vector<AdamW::Run> host_adamw_runs;
  std::unique_ptr<Backend> host_be;  // the host's kernels, used on the d2h stream only
  Tensor host_master;                // the state's weights AdamW updates on the host
  Tensor host_grads;                 // the gradients copied down for it (both as the state)
  bool master_stale = false;         // device weights changed outside a step (checkpoint load)
  bool host_update_pending = false;  // this step's norm was finite: the host updates
  float host_lr = 0;
  // ZeRO-2: per layer (-1: embedding and head) the staging buffers of its flat runs, written
  // by one micro-batch's backward until its reduce-scatter.
  std::map<int, std::vector<std::pair<int64_t, Tensor>>> staging;
  std::map<int, int> staging_buffer;  // layer (-1: embedding and head) -> its Program buffer
  std::map<int, Micro> micro;
  std::map<int, int> static_buffers;  // setup buffers, resident across steps: id -> category
  std::map<std::tuple<int, int, int, int>, int> buffer_of;  // (block, phase, layer, mb) -> id

  // ---- the step in flight ----------------------------------------------------------------
  struct InFlight {
    RequestPtr request;
    std::function<void()> on_done;
  };
  std::map<int, InFlight> inflight;   // op index -> transfer not yet completed
  std::map<int, size_t> timing_slot;  // async op -> its entry in out->timings (end at completion)
  std::set<int> received_pieces;      // buffers the Program names on its reduce-scatters
  std::map<int, std::vector<int>> buffer_users;  // buffer -> ops whose completion reads it
  std::vector<uint32_t> pending_frees;  // dp-stream frees waiting for their reduction to land
  // The prefetching streams run ahead of the rank's place in the Program (exec/run_ahead.cpp).
  struct AheadStream {
    std::vector<uint32_t> ops;  // the stream's ops, in program order
    size_t next = 0;            // the first of them not yet run this step
  };
  std::vector<AheadStream> ahead;
  std::vector<char> ran_ahead;                 // per op: already run out of its place this step
  std::set<const Communicator*> shared_comms;  // used by streams that do not run ahead
  bool shared_comms_known = false;
  bool collectives_run_ahead = true;  // MPI on the CPU backend
  bool allocs_follow_frees = true;    // CPU backend: an alloc waits for the frees before it
  int64_t reached = -1;               // the last op run in its place (-1: none yet)
  int64_t last_compute = -1;          // the last computation run in its place (-1: none yet)
  int64_t step_index = 0;
  int last_dp_reduce = -1;  // the dp reduce-scatter in flight
  double loss_sum = 0;
  StepResult* out = nullptr;
  std::chrono::steady_clock::time_point t0;
  // Last, so that they are drained and joined before the tensors their work touches go.
  exec::CopyStream h2d{"h2d"}, d2h{"d2h"};

  // ---- executor.cpp ----------------------------------------------------------------------
  StepResult step(int64_t step);
  void run(uint32_t index);
  void complete(int op);  // waits for op's transfer and runs its completion (once)
  void complete_all();
  void poll_sends();
  bool deps_landed(uint32_t op);    // every transfer op waits for has landed (tested, not waited)
  bool pending(uint32_t op) const;  // a free the rank passed, waiting for its reduction
  void complete_deps(uint32_t op);  // completes every transfer op waits for
  void run_pending_free(uint32_t op);    // completes what the free waits for, then runs it
  void drain_frees_before(uint32_t op);  // runs the pending frees the Program puts before op
  void poll_frees();                     // runs the pending frees whose transfers have landed
  void run_timed(uint32_t op);           // run(), with its timing entry

  // ---- exec/run_ahead.cpp ----------------------------------------------------------------
  void start_run_ahead();
  bool landed(int op);  // not in flight, or its transfer has landed (tested, not waited)
  bool waits_only_on_issued(uint32_t op) const;
  bool may_run_ahead(const AheadStream& a, uint32_t op);
  bool run_ahead();  // runs what may start now; whether anything ran
  void free_landed_before(uint32_t op);
  void land_reductions_before(int64_t compute);
  bool may_soon_run_ahead() const;  // a stream's next op waits only for transfers in flight

  void issue(int op, RequestPtr request, std::function<void()> on_done = {});
  int64_t now_ns() const;
  void sample_memory();

  // ---- ops_compute.cpp -------------------------------------------------------------------
  void compute(const Op& op);
  Micro& mb(int m);
  Tensor materialize(Flow& f, int buffer, Shape shape);
  int buffer(Block b, Phase ph, int layer, int m) const;
  Shape stream_shape() const { return Shape{Ns, int64_t(whole.hidden)}; }
  Shape full_shape() const { return Shape{B, T, int64_t(whole.hidden)}; }
  const LayerShare& share(int layer) const { return shares.at(layer < 0 ? -1 : layer); }
  Shape stream_shape(int layer) const { return Shape{share(layer).Ns, int64_t(whole.hidden)}; }
  // LayerStrategy::stream_tp of the layer's share: 1 under sequence parallelism.
  int stream_tp(int layer) const { return share(layer).sp ? 1 : share(layer).tp; }
  Shape full_shape(int layer) const { return Shape{share(layer).B, T, int64_t(whole.hidden)}; }
  // Between layers whose dp differs without a collective (the next layer's dp is larger): this
  // rank's slice of the samples, of the stream entering `layer` in forward or of the gradient
  // leaving it in backward (exec/reshard.cpp).
  void fit_flow(Flow& f, int layer);
  void fit_grad(Micro& m, int layer);
  void reshard(const Op& op, int index);  // the Program's reshard all-gathers
  void embedding_forward(const Op& op);
  void embedding_backward(const Op& op);
  void block_input(const Op& op, Micro& m, LayerState& ls);
  void block_forward(const Op& op);
  void drop_unsaved_block_input(const Op& op, LayerState& ls);
  void block_backward(const Op& op);
  void head_forward(const Op& op);
  void head_backward(const Op& op);
  void head_loss_sums(Micro& m);
  void head_loss(Micro& m);
  void finish_block_backward(int layer, Block b, Micro& m, const Tensor& d_xn);
  void norm_head_input(Micro& m);
  void finish_head_backward(Micro& m, const Tensor& d_xn);
  void optimizer_step();
  // A reduce-scatter's received piece of n floats, in the Program's buffer the op names.
  Tensor received_piece(const Op& op, int index, int64_t n);
  void stage_gradients(int layer);  // ZeRO-2: bind the layer's gradients to fresh staging
  // (state tensor view, other tensor view) for each run of the optimizer state: the gradients,
  // or the weights, of the elements whose optimizer state this rank holds.
  // (host view, device view) for each run of the host-updated optimizer state: its gradients,
  // or its weights where they stay on the device.
  std::vector<std::pair<Tensor, Tensor>> host_state_pairs(const Tensor& host_like, bool grads);
  // The weights of flat [flat, flat + n): in model.params, or host_params where offloaded.
  Tensor param_slice(int64_t flat, int64_t n);
  std::vector<const ParamInfo*> fetch_set(const Op& op, Micro* m) const;
  void fetch(const Op& op, int index);  // ZeRO-3: gather a layer's (or embedding's) weights
  bool attention_keeps_probs(int layer) const;
  Tensor host_tensor(MemCategory category, Shape shape);  // resident in the host pool

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
  void dp_collective(const Op& op, int index);
  void send(const Op& op, int index);
  void recv(const Op& op, int index);
  int pp_tag(const Op& op, bool sending) const;
};

}  // namespace stratagem
