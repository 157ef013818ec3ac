// The cost model: what each Program op costs on a modeled cluster, in time and in bytes. The
// simulator (sim/) and the fast estimator (estimate.hpp) both take every figure from here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/fabric.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/program.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

// Kernels beside communication: `kernels_s` of compute and `critical_s` of collectives the
// compute waits for, while `dp_stream_s` of collectives (ZeRO gathers and reduce-scatters) and
// `copy_stream_s` of PCIe copies run on side streams. The kernels slow down by `interference`
// while the collectives overlap them (copy engines do not count); the pass lasts as long as the
// busiest of compute and the side streams.
double overlapped_time_s(double interference, double kernels_s, double critical_s,
                         double dp_stream_s, double copy_stream_s);

class CostModel {
 public:
  // Keeps references: model and cluster must outlive the CostModel and not change while it is
  // in use. Every figure that depends only on the cluster and the precision (the plan's dtype)
  // is computed here once, so that per-op calls and the estimator do only arithmetic. The
  // framework (the training software, copied) defaults to stratagem's own. It holds no plan: an
  // op is priced from what it carries (its strategy, precision and attention kernel), and the
  // estimator's closed form takes the plan beside it (estimate.hpp).
  CostModel(const ModelSpec& model, const ClusterSpec& cluster, Dtype precision,
            const FrameworkSpec& framework = FrameworkSpec{});

  // Compute ops (and host_compute): roofline with shape-dependent GEMM efficiency, attention
  // kernel efficiency, elementwise traffic at achieved HBM bandwidth, launch overheads.
  double compute_time_s(const Op& op) const;
  double gemm_time_s(const Gemm& g) const;  // kernel time; launches are counted per block
  double block_time_s(const BlockWork& w) const;
  // Backward of one layer block of `samples` samples: its kernels (backward_work) plus, where
  // the framework does not accumulate weight gradients inside the GEMM, the separate add of
  // each micro-batch's gradients into the accumulation buffer (the shard under ZeRO-2/3), and
  // under ZeRO-2/3 the framework's per-micro-batch passes over the whole gradients before their
  // reduce-scatter (FrameworkSpec::pre_reduce_bytes_per_param).
  double backward_block_time_s(const LayerStrategy& s, Block b, int samples,
                               bool flash_attention) const;
  // W of a split backward (Phase::weight_grad): the block's weight-gradient GEMMs with the
  // gradient passes backward_block_time_s adds; its B (Op::wgrad_deferred) is the rest of the
  // block's backward kernels.
  double weight_grad_time_s(const LayerStrategy& s, Block b, int samples) const;
  // A part of a context-parallel attention block (op.part, workload.hpp's attention_part_work)
  // in the op's phase, under the op's strategy and attention kernel; the block's gradient
  // passes go with pre's backward, its last part.
  double attention_part_time_s(const Op& op) const;
  // `kernels_s` and the passes of backward_block_time_s beyond the kernels (`num_gemms`: of the
  // block's backward).
  double with_gradient_passes_s(double kernels_s, const LayerStrategy& s, Block b,
                                int num_gemms) const;
  // Achieved fraction of peak of one GEMM: max_efficiency x size (latency-bound small GEMMs) x
  // tile and wave quantization of (m, n).
  double gemm_efficiency(const Gemm& g) const;
  // The attention core at its kernel's efficiency (fused or not).
  double attention_time_s(double flops, bool flash_attention) const;
  double elementwise_time_s(double bytes) const;  // memory-bound kernels at achieved HBM bandwidth
  // Host (CPU) work of one rank: the node's FLOP/s and DRAM bandwidth are shared by its GPUs.
  double host_compute_time_s(double flops, double bytes) const;
  // Host time the framework spends issuing `op` before the GPU can run it
  // (FrameworkSpec::host_layer_forward_s/_backward_s()): a layer's figure for a phase, half on
  // its attention block's op and half on its feed-forward's (the MoE experts' op), which carry
  // the issue of the layer's other ops (norms, collectives, router). 0 for every other op.
  double host_issue_time_s(const Op& op) const;
  // The same for one layer of strategy `s` over one micro-batch: forward, backward and what
  // its recompute issues again, summed over the ops host_issue_time_s charges (the estimator's).
  double host_issue_layer_s(const LayerStrategy& s) const;
  // Kernels of the LM head of vocabulary tp `tp` and context parallelism `cp`: the logits GEMM
  // (b*s/cp, V/tp, h) (forward) or its two gradient GEMMs (backward), and the loss.
  BlockWork head_work(Phase phase, int samples, double elementwise_bytes, int tp, int cp) const;

  // Exposed time of one sequence-parallel collective (all-gather or reduce-scatter, whole time
  // `comm_s`) of layer block `b` (attention or mlp) in phase `ph`, of `samples` samples. Where
  // the framework pipelines it against its GEMM (tp_comm_overlap), in tp chunks: an all-gather
  // hides all but (tp-1)/tp of what exceeds the GEMM; a reduce-scatter also leaves its last
  // chunk's transfer after the last GEMM chunk. Otherwise the whole comm_s.
  double tp_exposed_s(double comm_s, Collective c, const LayerStrategy& s, Block b, Phase ph,
                      int samples) const;

  // ::overlapped_time_s with this GPU's compute_comm_interference.
  double overlapped_time_s(double kernels_s, double critical_s, double dp_stream_s,
                           double copy_stream_s) const {
    return stratagem::overlapped_time_s(interference_, kernels_s, critical_s, dp_stream_s,
                                        copy_stream_s);
  }
  double compute_comm_interference() const { return interference_; }

  // An MoE layer's collectives on the ep_comm stream (src/cost/moe_cost.cpp): `bytes` as the
  // Program's op carries them (the balanced mean) over a group of `size` ranks on `nodes`
  // nodes, paced by the busiest expert rank, which carries `load` times the mean
  // (Plan::expert_load_factor). The all-to-all is priced on the fabric: copies to ranks of the
  // same node over NVLink, the others over the NIC, at most `node_limit` nodes per token
  // (DeepSeek-V3's node-limited routing, 0: none: one copy per node crosses the network,
  // NVLink forwards it).
  CommCost moe_comm_cost(Collective c, int64_t bytes, int size, int nodes, double load,
                         int node_limit) const;
  // One compute part (Block::router, experts, combine) of an MoE layer of strategy s in a
  // phase, `samples` per rank: the experts at the busiest rank's load (`load` times the mean).
  double moe_part_time_s(const LayerStrategy& s, Block part, Phase ph, int samples,
                         double load) const;
  // Any op of a rank's program (group/peer resolved through the layout).
  CommCost comm_cost(const Op& op, const Layout& layout, int rank) const;
  double op_time_s(const Op& op, const Layout& layout, int rank) const;

  // Transfers on the cluster's fabric: collectives, sends, PCIe copies (fabric.hpp).
  const FabricModel& fabric() const { return fabric_; }
  const ModelSpec& model() const { return model_; }
  const ClusterSpec& cluster() const { return cluster_; }
  const FrameworkSpec& framework() const { return framework_; }
  double peak_flops() const { return peak_flops_; }  // of the plan's dtype
  Dtype dtype() const { return dtype_; }             // the precision it prices kernels in
  // Element size of data-parallel gradient reductions (FrameworkSpec::grad_reduce_bytes, else
  // the plan's dtype).
  int grad_reduce_bytes() const { return grad_reduce_bytes_; }

 private:
  double moe_compute_time_s(const Op& op) const;  // Block::router, experts, combine
  // A kernel's price assumes the cost model's precision: an op of another is a logic error.
  void check_precision(const Op& op) const;

  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  FrameworkSpec framework_;
  FabricModel fabric_;
  Dtype dtype_ = Dtype::bf16;
  int elem_bytes_ = 2;
  int grad_reduce_bytes_ = 2;
  double peak_flops_ = 0, gemm_peak_flops_ = 0, fp32_flops_ = 0;
  double gemm_half_flops_ = 0;
  int tile_m_ = 128, tile_n_ = 128, sm_count_ = 0;
  // Achieved by the fused (flash) attention kernel and by the unfused one.
  double flash_attention_flops_ = 0, standard_attention_flops_ = 0;
  double hbm_bytes_per_s_ = 0, launch_s_ = 0, interference_ = 1;
  double host_flops_per_gpu_ = 0, host_bytes_per_s_per_gpu_ = 0;
};

// What a rank's CUDA process holds on the device beside the Program's tensors and the cost
// model's workspace: the GPU process ledger of its stage (src/cost/process_memory.cpp), from the
// cluster's gpu.process figures and the communicators the plan's Layout gives the rank.
struct ProcessMemory {
  int64_t cuda_context_bytes = 0;      // outside the caching allocator
  int64_t nccl_buffers_bytes = 0;      // outside the caching allocator
  int64_t cublas_workspace_bytes = 0;  // taken from the caching allocator: allocated
};
ProcessMemory process_memory(const ModelSpec& model, const ClusterSpec& cluster, const Plan& plan,
                             int stage);

// The one formula from a rank's tensors (the Program's allocations and the workspace) to its
// memory as the caching allocator and the device see it, for the estimator (stage_memory) and
// the simulator (every alloc and free): allocated = tensors + cuBLAS workspaces (what
// torch.cuda.max_memory_allocated counts); reserved = allocated + the allocator's rounding and
// fragmentation, `fragmentation` x allocated (max_memory_reserved); device = reserved + the
// CUDA context + NCCL's buffers (what nvidia-smi shows; what must fit in the GPU).
struct DeviceMemory {
  int64_t allocated_bytes = 0, fragmentation_bytes = 0, reserved_bytes = 0, device_bytes = 0;
};
DeviceMemory device_memory(int64_t tensor_bytes, const ProcessMemory& p, double fragmentation);

struct MemoryBreakdown {
  int64_t weights_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t activations_bytes = 0;  // saved for backward, rebuilt by recompute, fp32 logits
  int64_t buffers_bytes = 0;      // gathered ZeRO-3 / fetched offloaded weights, gradient workspace
  // The GPU process ledger (ProcessMemory, device_memory): inside the caching allocator,
  int64_t cublas_workspace_bytes = 0;
  int64_t fragmentation_bytes = 0;  // its rounding and fragmentation (cluster gpu.allocator_*)
  // and outside it.
  int64_t cuda_context_bytes = 0;
  int64_t nccl_buffers_bytes = 0;
  int64_t tensor_bytes() const {
    return weights_bytes + grads_bytes + optimizer_bytes + activations_bytes + buffers_bytes;
  }
  int64_t allocated_bytes() const { return tensor_bytes() + cublas_workspace_bytes; }
  int64_t reserved_bytes() const { return allocated_bytes() + fragmentation_bytes; }
  int64_t total_bytes() const {  // the device's: what must fit in the GPU
    return reserved_bytes() + cuda_context_bytes + nccl_buffers_bytes;
  }
  // Sets the ledger's parts for these tensors (device_memory).
  void set_process(const ProcessMemory& p, double fragmentation);
  MemoryBreakdown& operator+=(const MemoryBreakdown& o);
  bool operator==(const MemoryBreakdown&) const = default;
};

// Peak device memory of one rank of every pipeline stage (all ranks of a stage hold the same),
// in bytes, from the byte functions the Program allocates with (workload.hpp), in closed form:
// model states after ZeRO and offload, the activations the pipeline schedule keeps in flight at
// the worst moment (with that moment's recompute, ZeRO-3 and offload buffers), the LM-head
// logits, plus what the Program does not allocate: the gradient workspace of the running layer
// (buffers) and the GPU process ledger of the stage (process_memory, device_memory).
std::vector<MemoryBreakdown> stage_memory(const CostModel& cost, const Plan& plan);
// The part of stage_memory's buffers_bytes that is not a Program allocation: the incoming and
// outgoing activation gradients of the layer being run, 2 x b x s x h elements.
int64_t workspace_bytes(const CostModel& cost, const Plan& plan, int stage);

}  // namespace stratagem
