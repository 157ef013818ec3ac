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
// collectives (program_cp.cpp).
enum class Stream : uint8_t { compute, tp_comm, dp_comm, pp_comm, h2d, d2h, ep_comm, cp_comm };
inline constexpr int kNumStreams = 8;
enum class Phase : uint8_t { forward, backward, recompute, optimizer, setup };
enum class Collective : uint8_t { none, all_reduce, all_gather, reduce_scatter, all_to_all };
enum class MemCategory : uint8_t { weights, grads, optimizer, activations, buffers };
inline constexpr int kNumMemCategories = 5;

const char* to_string(OpKind k);
const char* to_string(Stream s);
const char* to_string(Block b);
const char* to_string(Phase p);
const char* to_string(Collective c);
const char* to_string(MemCategory c);

struct Op {
  OpKind kind = OpKind::compute;
  Stream stream = Stream::compute;
  Block block = Block::none;
  Phase phase = Phase::forward;
  Collective collective = Collective::none;
  GroupKind group = GroupKind::none;  // collectives: group kind; send/recv: pp_next/pp_prev/cp
  MemCategory category = MemCategory::buffers;  // alloc/free
  uint8_t tp = 1;       // tp degree selecting the group (reshard: small one; expert: etp)
  uint16_t tp_big = 1;  // reshard: the larger tp degree; expert groups: ep
  // A context-parallel attention's ops (program_cp.cpp): the part of the block a compute op
  // runs, or what a cp transfer carries (pre: K and V, core: dK and dV).
  AttentionPart part = AttentionPart::whole;
  int16_t chunk = -1;       // model chunk (virtual stage), -1 when not applicable
  int32_t layer = -1;       // Transformer layer, -1 for embedding/head/optimizer
  int32_t microbatch = -1;  // -1 when not per micro-batch
  int32_t samples = 0;      // samples per rank in this op (shape for the cost model)
  int32_t buffer = -1;      // alloc/free: buffer id; a reduce-scatter: its received piece
  Recompute recompute = Recompute::none;  // a layer's ops: its recompute (what forward saves)
  int16_t cp_step = -1;                   // the ring step of a core op or cp transfer, else -1
  int64_t bytes = 0;                      // message, copy, alloc, or compute HBM-traffic bytes
  double flops = 0;                       // compute ops: FLOPs on this rank
  uint32_t dep_begin = 0;                 // indices into StageProgram::deps
  uint32_t dep_count = 0;
};

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
