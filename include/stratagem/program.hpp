// Program: each rank's ordered instruction stream for one training iteration. It is the
// contract between the simulator (virtual time) and the runtime (real kernels): both run the
// same ops in the same order. All ranks of one pipeline stage run the same stream; groups and
// peers are symbolic (GroupKind + tp) and the Layout resolves them for a concrete rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "stratagem/framework.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

enum class OpKind : uint8_t {
  compute,       // device kernels of one block (FLOPs and HBM bytes given)
  collective,    // over a group
  send,          // to a peer: pipeline (pp_next/pp_prev) or cp ring (eager: does not wait)
  recv,          // from a peer: pipeline or cp ring
  copy_d2h,      // offload to host memory
  copy_h2d,      // fetch from host memory
  host_compute,  // CPU work (offloaded optimizer step)
  alloc,         // device memory becomes in use
  free,          // device memory is released
};
inline constexpr int kNumOpKinds = 9;
// ep_comm: the all-to-alls of MoE layers (and their expert-tensor collectives), beside tp_comm
// so that neither waits behind the other. cp_comm: a context-parallel attention's transfers and
// collectives (program_cp.cpp). pp_recv: the pipeline's receives where the schedule posts them
// ahead (Megatron-Core's interleaved overlap_p2p_comm, the zero-bubble schedules), so that a
// receive waiting for its data does not hold up the stage's sends on pp_comm.
enum class Stream : uint8_t {
  compute,
  tp_comm,
  dp_comm,
  pp_comm,
  h2d,
  d2h,
  ep_comm,
  cp_comm,
  pp_recv
};
inline constexpr int kNumStreams = 9;
// weight_grad: a split backward's W (the zero-bubble schedules, schedule.hpp): the weight
// gradients of a block whose B (Phase::backward, Op::wgrad_deferred) computed its input
// gradient.
enum class Phase : uint8_t { forward, backward, recompute, optimizer, setup, weight_grad };
enum class Collective : uint8_t { none, all_reduce, all_gather, reduce_scatter, all_to_all };
enum class MemCategory : uint8_t { weights, grads, optimizer, activations, buffers };
inline constexpr int kNumMemCategories = 5;

const char* to_string(OpKind k);
const char* to_string(Stream s);
const char* to_string(Block b);
const char* to_string(Phase p);
const char* to_string(Collective c);
const char* to_string(MemCategory c);

// What a collective or transfer is for. The executor runs it and the simulator files it by
// this, never by guessing from its block and phase.
enum class Purpose : uint8_t {
  none,              // compute, host work, alloc, free
  activations,       // a block's tensor-parallel gather or reduction of activations/gradients
  loss_stats,        // vocabulary-parallel cross entropy: the row maximum, sum-exp and target
  replicated_grads,  // gradients of weights replicated over tp (sp norms, an MoE router) summed
  router_stats,      // an MoE router's load statistics (aux loss) summed over tp
  grad_reduce,       // data-parallel gradient reduction (all-reduce or reduce-scatter)
  weight_fetch,      // ZeRO-3 / offloaded weights gathered before use
  updated_weights,   // ZeRO-1/2: the optimizer's new weights gathered after the step
  tied_grads,        // first and last stage sum the tied word embedding's gradient
  reshard,           // samples regathered between layers that hold the stream differently
  token_exchange,    // an MoE layer's all-to-all of routed tokens
  expert_rows,       // an MoE layer's expert-tensor gather or reduce-scatter of token rows
  context,           // a context-parallel attention's K/V (or gradient) transfers and gathers
  pipeline,          // activations or their gradients between pipeline stages
};
const char* to_string(Purpose p);

// The layer strategy an op runs under (the embedding's for layer -1), packed: its parallel
// degrees, ZeRO stage, sequence parallelism, cp kind and offloads, and the MoE routing the plan
// expects of its layer. It selects the op's group in the Layout, shapes its work in the cost
// model and its tensors in the runtime, so that nothing after build_program reads the Plan.
// Every degree is a full int: the limits allow tp 65536.
struct OpStrategy {
  int32_t tp = 1, dp = 1, cp = 1, ep = 1, etp = 1;
  uint8_t zero = 0;
  CpKind cp_kind = CpKind::ring;
  bool sequence_parallel = false;
  bool offload_optimizer = false, offload_params = false, offload_activations = false;
  int32_t moe_node_limit = 0;  // Plan::moe_node_limit (0: none)
  double expert_load = 1.0;    // the busiest expert rank's rows over the mean (expert_load_factor)
  static OpStrategy of(const LayerStrategy& s, double expert_load = 1.0, int moe_node_limit = 0);
  LayerStrategy unpack(Recompute recompute) const;
  int stream_tp() const { return sequence_parallel && tp > 1 ? 1 : tp; }
};

struct Op {
  OpKind kind = OpKind::compute;
  Stream stream = Stream::compute;
  Block block = Block::none;
  Phase phase = Phase::forward;
  Collective collective = Collective::none;
  GroupKind group = GroupKind::none;  // collectives: group kind; send/recv: pp_next/pp_prev/cp
  MemCategory category = MemCategory::buffers;  // alloc/free
  Purpose purpose = Purpose::none;
  // A context-parallel attention's ops (program_cp.cpp): the part of the block a compute op
  // runs, or what a cp transfer carries (pre: K and V, core: dK and dV).
  AttentionPart part = AttentionPart::whole;
  Recompute recompute = Recompute::none;  // a layer's ops: its recompute (what forward saves)
  Dtype dtype = Dtype::bf16;              // the precision its kernels and messages are in
  bool flash_attention = false;           // attention blocks: the fused kernel (no scores kept)
  // A backward compute op without its weight gradients: B of a split backward, whose W is an
  // op of its own (Phase::weight_grad).
  bool wgrad_deferred = false;
  int16_t chunk = -1;       // model chunk (virtual stage), -1 when not applicable
  int16_t cp_step = -1;     // the ring step of a core op or cp transfer, else -1
  int32_t layer = -1;       // Transformer layer, -1 for embedding/head/optimizer
  int32_t microbatch = -1;  // -1 when not per micro-batch
  int32_t samples = 0;      // samples per rank in this op (shape for the cost model)
  int32_t buffer = -1;      // alloc/free: buffer id; a reduce-scatter: its received piece
  OpStrategy strategy;      // its layer's (tp selects tp, dp and cp groups; etp, ep expert ones)
  // A reshard: the stream tp of the layer the samples come from and of the one they go to,
  // which select its group (Layout::reshard_group).
  int32_t reshard_from_tp = 1, reshard_to_tp = 1;
  int64_t bytes = 0;       // message, copy, alloc, or compute HBM-traffic bytes
  double flops = 0;        // compute ops: FLOPs on this rank
  uint32_t dep_begin = 0;  // indices into StageProgram::deps
  uint32_t dep_count = 0;
};
// The layer strategy of a layer's op as the Program emitted it (for the workload functions).
inline LayerStrategy layer_strategy(const Op& op) {
  return op.strategy.unpack(op.recompute);
}

// The op stream shared by every rank of one pipeline stage.
struct StageProgram {
  int stage = 0;
  std::vector<Op> ops;
  std::vector<uint32_t> deps;  // op indices (earlier in `ops`) an op waits for, besides its stream
  const uint32_t* deps_of(const Op& op) const { return deps.data() + op.dep_begin; }
};

struct Program {
  std::vector<StageProgram> stages;  // one per pipeline stage
  int num_microbatches = 0;
};

// The one schedule generator (gpipe, 1f1b, interleaved). The framework's facts that change the
// stream: under layer_gradient_staging a ZeRO-2/3 layer's whole gradients are a buffer
// (category grads) from its backward until the reduce-scatter that reads them lands.
Program build_program(const ModelSpec& model, const Plan& plan,
                      const FrameworkSpec& framework = FrameworkSpec{});

// A readable name such as "L3.attn.fwd mb5" (built on demand, not stored).
std::string op_name(const Op& op);
// Resolves an op's group to a concrete group id (collectives) or peer rank (send/recv) for
// `rank`; -1 when the op has none.
int resolve_group(const Layout& layout, int rank, const Op& op);
int resolve_peer(const Layout& layout, int rank, const Op& op);

}  // namespace stratagem
