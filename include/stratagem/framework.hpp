// FrameworkSpec: the training software that runs a plan, stated as physical facts the cost
// model reads beside the cluster's hardware figures (data/frameworks/<name>.json).
#pragma once
#include <string>

namespace stratagem {

// Which fused attention kernel a framework runs when the plan asks for flash attention: the
// GPU's best (the cluster's gpu.attention.flash_efficiency), or a first-generation
// FlashAttention (the 2022 algorithm, CUDA or its Triton port: gpu.attention.flash1_efficiency).
enum class AttentionKernel { flash, flash1 };
const char* to_string(AttentionKernel k);

struct FrameworkSpec {
  std::string name = "stratagem";  // the project's own runtime
  std::string description;
  // Weight gradients are summed over micro-batches inside the weight-gradient GEMM (cuBLAS
  // beta = 1 into the gradient buffer). When false, the GEMM writes a fresh gradient and a
  // separate kernel adds it into the accumulation buffer: per micro-batch and parameter it
  // reads the new gradient and the buffer and writes the buffer back.
  bool wgrad_accumulation_fused = true;
  int grad_accumulation_bytes = 4;  // element size of that accumulation buffer
  // Element size of the gradient buffer the framework keeps resident between backward passes
  // (Megatron's and nanotron's fp32 main_grad under bf16 training, FSDP's fp32 sharded
  // gradient): what the gradients weigh in memory. 0: the plan's dtype.
  int grad_buffer_bytes = 0;
  // Under ZeRO-2/3 a layer's whole gradients are held (staged) until the layer's
  // reduce-scatter, rather than reduced bucket by bucket as they are produced. (Off by
  // default: a framework file says so; stratagem's runtime does.)
  bool layer_gradient_staging = false;
  // Sequence-parallel all-gathers and reduce-scatters of a layer are pipelined against the
  // GEMMs that consume or produce them, in tp chunks (Megatron-core --tp-comm-overlap,
  // Transformer Engine userbuffers). Off: the GEMM waits for the whole collective.
  bool tp_comm_overlap = false;
  // HBM bytes per logit element (on this rank's vocabulary shard) that the loss moves per
  // micro-batch, forward and backward, beside the logits GEMMs. 0: the Program's own count (an
  // fp32 logits write and read, 8 bytes, each way).
  double loss_forward_bytes_per_logit = 0;
  double loss_backward_bytes_per_logit = 0;
  // Memory the loss holds beside the fp32 logits while its forward runs, per logit of the
  // rank's vocabulary shard (nanotron: the bf16 logits and their fp32 copy beside the softmax
  // it forms). 0: none beyond the fp32 logits.
  double loss_transient_bytes_per_logit = 0;
  // The bytes of that for `logits_bytes` of fp32 logits.
  int64_t loss_transient_bytes(int64_t logits_bytes) const {
    return static_cast<int64_t>(loss_transient_bytes_per_logit * double(logits_bytes / 4));
  }
  // Element size of the data-parallel gradient reductions (all-reduce, reduce-scatter) on the
  // wire: 4 where the framework reduces fp32 gradients under bf16 training. 0: the plan's dtype.
  int grad_reduce_bytes = 0;
  // HBM bytes per (unsharded) parameter that the framework moves every micro-batch between the
  // weight-gradient GEMMs and a ZeRO-2/3 reduce-scatter: copies into a flat reduce buffer, casts
  // to the reduce dtype, pre-division by the group size (FSDP's post-backward hook). 0: none.
  double pre_reduce_bytes_per_param = 0;
  AttentionKernel attention_kernel = AttentionKernel::flash;
  // HBM bytes per parameter of the optimizer step. 0: the Program's count (one fused pass: the
  // optimizer states and the weights read and written, the gradient read).
  double optimizer_bytes_per_param = 0;
  // The host (CPU) work to issue one Transformer layer's forward, and its backward, on one rank
  // for one micro-batch: the host operations the framework's code runs (torch ops, autograd
  // Functions and nodes, kernel and NCCL launches, counted from the code) times the host time
  // of one (Python, PyTorch's dispatch, the launch). The GPU runs behind the host: it idles
  // when its work between two issues is shorter than the host's (small per-rank work under
  // tensor parallelism). A recomputed forward is issued again. 0: not stated, the host is
  // never the bottleneck (a fused runtime, or a framework whose count is not known).
  double host_ops_per_layer_forward = 0;
  double host_ops_per_layer_backward = 0;
  double host_seconds_per_op = 0;
  double host_layer_forward_s() const { return host_ops_per_layer_forward * host_seconds_per_op; }
  double host_layer_backward_s() const { return host_ops_per_layer_backward * host_seconds_per_op; }
  bool host_issue_modelled() const { return host_layer_forward_s() + host_layer_backward_s() > 0; }
};

// Loading a framework from a file is io's part: stratagem/loaders.hpp.

}  // namespace stratagem
