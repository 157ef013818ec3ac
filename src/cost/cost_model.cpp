// Time of every Program op on a modeled cluster: compute from a roofline with shape-dependent
// GEMM efficiency, communication from NCCL-like alpha-beta models on the node/NIC topology.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "stratagem/cost.hpp"
#include "stratagem/iteration.hpp"

namespace stratagem {

MemoryBreakdown& MemoryBreakdown::operator+=(const MemoryBreakdown& o) {
  weights_bytes += o.weights_bytes;
  grads_bytes += o.grads_bytes;
  optimizer_bytes += o.optimizer_bytes;
  activations_bytes += o.activations_bytes;
  buffers_bytes += o.buffers_bytes;
  cublas_workspace_bytes += o.cublas_workspace_bytes;
  fragmentation_bytes += o.fragmentation_bytes;
  cuda_context_bytes += o.cuda_context_bytes;
  nccl_buffers_bytes += o.nccl_buffers_bytes;
  return *this;
}

CostModel::CostModel(const ModelSpec& model, const ClusterSpec& cluster, Dtype precision,
                     const FrameworkSpec& framework)
    : model_(model), cluster_(cluster), framework_(framework), fabric_(cluster) {
  const GpuSpec& g = cluster.gpu;
  const NodeSpec& n = cluster.node;
  dtype_ = precision;
  elem_bytes_ = dtype_bytes(precision);
  grad_reduce_bytes_ = framework.grad_reduce_bytes > 0 ? framework.grad_reduce_bytes : elem_bytes_;
  peak_flops_ = g.peak_flops(precision);
  gemm_peak_flops_ = peak_flops_ * g.gemm_max_efficiency;
  fp32_flops_ = g.peak_flops_fp32;
  gemm_half_flops_ = g.gemm_half_efficiency_flops;
  tile_m_ = std::max(1, g.gemm_tile_m);
  tile_n_ = std::max(1, g.gemm_tile_n);
  sm_count_ = g.sm_count;
  const double flash = framework.attention_kernel == AttentionKernel::flash1
                           ? g.attention_flash1_efficiency
                           : g.attention_flash_efficiency;
  flash_attention_flops_ = peak_flops_ * flash;
  standard_attention_flops_ = peak_flops_ * g.attention_standard_efficiency;
  hbm_bytes_per_s_ = g.hbm_bandwidth_gbps * 1e9 * g.memory_efficiency;
  launch_s_ = g.kernel_launch_s;
  interference_ = std::max(1.0, g.compute_comm_interference);
  const int gpus_per_node = std::max(1, n.gpus_per_node);
  host_flops_per_gpu_ = n.host_flops / gpus_per_node;
  host_bytes_per_s_per_gpu_ = n.host_memory_bandwidth_gbps * 1e9 / gpus_per_node;
}

// ---- compute ---------------------------------------------------------------------------------

double CostModel::gemm_efficiency(const Gemm& g) const {
  const double f = g.flops();
  if (f <= 0) return 0;
  // Small GEMMs cannot fill the machine and pay fixed prologue/epilogue time.
  const double size = f / (f + gemm_half_flops_);
  // The output is cut into tile_m x tile_n tiles; partial tiles at the edges compute padding,
  // and tiles run in waves of sm_count, the last wave leaving SMs idle.
  const double tm = double((g.m + tile_m_ - 1) / tile_m_);
  const double tn = double((g.n + tile_n_ - 1) / tile_n_);
  const double tiles = tm * tn * double(std::max<int64_t>(1, g.count));
  double slots = tiles;
  if (sm_count_ > 0) slots = std::ceil(tiles / sm_count_) * sm_count_;
  const double useful = double(g.m) * double(g.n) * double(std::max<int64_t>(1, g.count));
  const double quant = useful / (slots * tile_m_ * tile_n_);
  return cluster_.gpu.gemm_max_efficiency * size * quant;
}

double CostModel::gemm_time_s(const Gemm& g) const {
  const double f = g.flops();
  if (f <= 0) return 0;
  const double eff = gemm_efficiency(g);
  const double compute = f / (peak_flops_ * eff);
  // Skinny GEMMs (small k or small m, n) can be bound by reading operands and writing C.
  const double bytes = double(elem_bytes_) * double(std::max<int64_t>(1, g.count)) *
                       (double(g.m) * g.k + double(g.k) * g.n + double(g.m) * g.n);
  return std::max(compute, bytes / hbm_bytes_per_s_);
}

double CostModel::attention_time_s(double flops, bool flash_attention) const {
  if (flops <= 0) return 0;
  return flops / (flash_attention ? flash_attention_flops_ : standard_attention_flops_);
}

void CostModel::check_precision(const Op& op) const {
  if (op.dtype != dtype_)
    throw std::logic_error(std::string("cost model: op ") + op_name(op) + " is in " +
                           to_string(op.dtype) + ", the cost model prices " + to_string(dtype_));
}

double CostModel::elementwise_time_s(double bytes) const {
  return bytes > 0 ? bytes / hbm_bytes_per_s_ : 0;
}

double overlapped_time_s(double interference, double kernels_s, double critical_s,
                         double dp_stream_s, double copy_stream_s) {
  const double busy =
      kernels_s + critical_s + (interference - 1) * std::min(kernels_s, dp_stream_s);
  return std::max({busy, dp_stream_s, copy_stream_s});
}

double CostModel::host_compute_time_s(double flops, double bytes) const {
  return std::max(flops / host_flops_per_gpu_, bytes / host_bytes_per_s_per_gpu_);
}

double CostModel::host_issue_time_s(const Op& op) const {
  if (!framework_.host_issue_modelled() || op.kind != OpKind::compute || op.layer < 0) return 0;
  const bool attention = op.block == Block::attention &&
                         (op.part == AttentionPart::whole || op.part == AttentionPart::pre);
  if (!attention && op.block != Block::mlp && op.block != Block::experts) return 0;
  switch (op.phase) {
    case Phase::forward:
      return 0.5 * framework_.host_layer_forward_s();
    case Phase::backward:
      return 0.5 * framework_.host_layer_backward_s();
    case Phase::recompute:
      // Selective recompute re-runs only the attention core: a few kernels, not the layer.
      return op.recompute == Recompute::full ? 0.5 * framework_.host_layer_forward_s() : 0;
    default:
      return 0;
  }
}

double CostModel::host_issue_layer_s(const LayerStrategy& s) const {
  if (!framework_.host_issue_modelled()) return 0;  // the search's estimator: nothing to add
  // The ops that carry a layer's host time, in each phase (the rule is host_issue_time_s's).
  Op op;
  op.layer = 0;
  op.recompute = s.recompute;
  double t = 0;
  for (Block b : {Block::attention, Block::mlp})
    for (Phase ph : {Phase::forward, Phase::backward, Phase::recompute}) {
      op.block = b, op.phase = ph;
      t += host_issue_time_s(op);
    }
  return t;
}

double CostModel::block_time_s(const BlockWork& w) const {
  double t = 0;
  for (int i = 0; i < w.num_gemms; ++i) t += gemm_time_s(w.gemms[i]);
  t += attention_time_s(w.attention_flops, w.flash_attention);
  t += elementwise_time_s(w.elementwise_bytes);
  t += w.kernels * launch_s_;
  return t;
}

double CostModel::backward_block_time_s(const LayerStrategy& s, Block b, int samples,
                                        bool flash_attention) const {
  const BlockWork w = backward_work(model_, s, b, samples, flash_attention);
  return with_gradient_passes_s(block_time_s(w), s, b, w.num_gemms);
}

// W: the weight-gradient GEMMs and the passes over the block's gradients that follow them.
double CostModel::weight_grad_time_s(const LayerStrategy& s, Block b, int samples) const {
  const BlockWork w = weight_grad_of(forward_work(model_, s, b, samples, false));
  return with_gradient_passes_s(block_time_s(w), s, b, 2 * w.num_gemms);
}

double CostModel::attention_part_time_s(const Op& op) const {
  const LayerStrategy s = layer_strategy(op);
  const BlockWork f = attention_part_work(model_, s, op.part, op.samples, op.flash_attention);
  if (op.phase != Phase::backward) return block_time_s(f);
  const double t = block_time_s(backward_of(f));
  if (op.part != AttentionPart::pre) return t;
  // The block's gradient passes go with its last part, pre's backward (the block's backward
  // has 4 GEMMs: the data and weight gradients of QKV and of the output projection).
  return with_gradient_passes_s(t, s, Block::attention, 4);
}

double CostModel::with_gradient_passes_s(double t, const LayerStrategy& s, Block b,
                                         int num_gemms) const {
  const bool per_mb_reduce = s.zero >= 2 && s.dp_cp() > 1;
  const bool pre_reduce = per_mb_reduce && framework_.pre_reduce_bytes_per_param > 0;
  if (framework_.wgrad_accumulation_fused && !pre_reduce) return t;
  const int64_t whole = block_parameters_per_rank(model_, s.tp, b);
  // Passes over the block's whole gradients before each micro-batch's reduce-scatter.
  if (pre_reduce) t += elementwise_time_s(double(whole) * framework_.pre_reduce_bytes_per_param);
  if (framework_.wgrad_accumulation_fused) return t;
  // Under ZeRO-2/3 each micro-batch's gradients are reduce-scattered first and only the shard
  // is accumulated.
  const int64_t params = s.zero >= 2 ? (whole + s.dp_cp() - 1) / s.dp_cp() : whole;
  // Read the fresh gradient and the buffer, write the buffer: one kernel per parameter tensor
  // (each weight GEMM's weight and bias, and the norm's).
  const double bytes = double(params) * (elem_bytes_ + 2.0 * framework_.grad_accumulation_bytes);
  const int per_weight = model_.bias ? 2 : 1;
  const int tensors = (num_gemms / 2) * per_weight + per_weight;
  return t + elementwise_time_s(bytes) + tensors * launch_s_;
}

// Megatron-core --tp-comm-overlap (Transformer Engine userbuffers, te.module.base
// initialize_ub): the sequence-parallel collectives of a layer run beside the GEMM next to them.
// Forward: the input all-gather beside the first GEMM (qkv, fc1) as a ring exchange of tp chunks,
// the reduce-scatter beside the second (proj, fc2), split into tp chunks. Backward: the output
// gradient's all-gather beside the second GEMM's data gradient, the re-gather of the sharded
// input beside the first GEMM's data gradient, and the reduce-scatter of that data gradient
// beside the first GEMM's weight gradient (the same pairing in recompute as in forward).
// A ring of tp chunks, each step moving one chunk while the GEMM works on the previous one:
// exposed = (tp-1)/tp x max(0, comm - gemm); the reduce-scatter adds its last chunk.
double CostModel::tp_exposed_s(double comm_s, Collective c, const LayerStrategy& s, Block b,
                               Phase ph, int samples) const {
  if (!framework_.tp_comm_overlap || !s.sequence_parallel || s.tp <= 1 || comm_s <= 0 ||
      (b != Block::attention && b != Block::mlp) || samples <= 0)
    return comm_s;
  // Its GEMMs: the attention kernel does not change them.
  const BlockWork f = forward_work(model_, s, b, samples, /*flash_attention=*/false);
  if (f.num_gemms < 2) return comm_s;
  const bool rs = c == Collective::reduce_scatter;
  auto exposed = [&](const Gemm& g) {
    const double p = s.tp;
    return (p - 1) / p * std::max(0.0, comm_s - gemm_time_s(g)) + (rs ? comm_s / p : 0.0);
  };
  const Gemm& first = f.gemms[0];
  const Gemm& second = f.gemms[f.num_gemms - 1];
  if (ph != Phase::backward) return exposed(rs ? second : first);
  // backward_of: data gradient (m, k, n), weight gradient (k, n, m) of each forward GEMM.
  const Gemm dgrad_first{first.m, first.k, first.n, first.count};
  const Gemm wgrad_first{first.k, first.n, first.m, first.count};
  const Gemm dgrad_second{second.m, second.k, second.n, second.count};
  if (rs) return exposed(wgrad_first);
  // The two all-gathers of a block's backward are alike in bytes: each the mean of the two.
  return 0.5 * (exposed(dgrad_second) + exposed(dgrad_first));
}

BlockWork CostModel::head_work(Phase phase, int samples, double elementwise_bytes, int tp,
                               int cp) const {
  const int64_t T = int64_t(samples) * (model_.seq_len / std::max(1, cp));
  const int64_t h = model_.hidden;
  tp = std::max(1, tp);
  const int64_t v = vocab_rows_per_rank(model_, tp);  // vocabulary-parallel logits
  BlockWork w;
  if (phase == Phase::backward) {
    w.add({T, h, v});  // grad of the hidden states
    w.add({h, v, T});  // grad of the (tied) word embedding
    w.kernels += 2;    // softmax-cross-entropy gradient
  } else {
    w.add({T, v, h});  // logits
    w.kernels += 3;    // max, sum-exp and loss over the vocabulary shard
  }
  w.elementwise_bytes = elementwise_bytes;
  // A framework that states its loss's traffic replaces the Program's count (an fp32 logits
  // write and read, 8 bytes per logit, in each phase) with its own.
  const double stated = phase == Phase::backward ? framework_.loss_backward_bytes_per_logit
                                                 : framework_.loss_forward_bytes_per_logit;
  if (stated > 0) w.elementwise_bytes += (stated - 8.0) * double(T) * double(v);
  return w;
}

double CostModel::compute_time_s(const Op& op) const {
  if (op.kind == OpKind::host_compute) return host_compute_time_s(op.flops, double(op.bytes));
  if (op.kind != OpKind::compute) return 0;
  auto roofline = [&](double fp_flops) {
    return std::max(op.flops / fp_flops, elementwise_time_s(double(op.bytes))) + launch_s_;
  };
  switch (op.block) {
    case Block::attention:
    case Block::mlp: {
      if (op.layer < 0 || op.samples <= 0) return roofline(gemm_peak_flops_);
      check_precision(op);
      const LayerStrategy s = layer_strategy(op);
      const bool flash = op.flash_attention;
      if (op.part != AttentionPart::whole) return attention_part_time_s(op);
      if (op.phase == Phase::forward)
        return block_time_s(forward_work(model_, s, op.block, op.samples, flash));
      if (op.phase == Phase::backward && op.wgrad_deferred)
        return block_time_s(input_grad_of(forward_work(model_, s, op.block, op.samples, flash)));
      if (op.phase == Phase::backward) return backward_block_time_s(s, op.block, op.samples, flash);
      if (op.phase == Phase::weight_grad) return weight_grad_time_s(s, op.block, op.samples);
      if (s.recompute == Recompute::full)
        return block_time_s(forward_work(model_, s, op.block, op.samples, flash));
      // Selective recompute rebuilds only the attention probabilities; the op says how much.
      BlockWork w = attention_core_work(model_, s, op.samples, flash);
      w.attention_flops = op.flops;
      w.elementwise_bytes = double(op.bytes);
      return block_time_s(w);
    }
    case Block::router:
    case Block::experts:
    case Block::combine:
      if (op.layer < 0 || op.samples <= 0) return roofline(gemm_peak_flops_);
      check_precision(op);
      return moe_compute_time_s(op);
    case Block::head:
      if (op.samples <= 0) return roofline(gemm_peak_flops_);
      check_precision(op);
      return block_time_s(
          head_work(op.phase, op.samples, double(op.bytes), op.strategy.tp, op.strategy.cp));
    case Block::embedding:
      // Lookup (forward) or zero + scatter-add (backward) of the embedding rows.
      return elementwise_time_s(double(op.bytes)) +
             (op.phase == Phase::backward ? 2 : 1) * launch_s_;
    case Block::optimizer: {
      // AdamW math is fp32 on CUDA cores and streams every state through HBM. A framework that
      // states its step's traffic per parameter replaces the Program's count; the op's FLOPs
      // are kAdamwFlopsPerParam per parameter (iteration.hpp's adamw_op).
      if (framework_.optimizer_bytes_per_param <= 0) return roofline(fp32_flops_);
      const double bytes = op.flops / kAdamwFlopsPerParam * framework_.optimizer_bytes_per_param;
      return std::max(op.flops / fp32_flops_, elementwise_time_s(bytes)) + launch_s_;
    }
    default:
      return roofline(gemm_peak_flops_);
  }
}

CommCost CostModel::comm_cost(const Op& op, const Layout& layout, int rank) const {
  switch (op.kind) {
    case OpKind::collective: {
      const int g = resolve_group(layout, rank, op);
      if (g < 0) return {};
      if (op.stream == Stream::ep_comm) {
        const std::vector<int>& ranks = layout.group(g).ranks;
        return moe_comm_cost(op.collective, op.bytes, int(ranks.size()),
                             fabric_.nodes_spanned(ranks), op.strategy.expert_load,
                             op.strategy.moe_node_limit);
      }
      int64_t bytes = op.bytes;
      // Gradient reductions over dp carry the framework's reduce dtype (the Program counts
      // them in the op's precision).
      const int elem_bytes = dtype_bytes(op.dtype);
      const int reduce_bytes =
          framework_.grad_reduce_bytes > 0 ? framework_.grad_reduce_bytes : elem_bytes;
      if (op.group == GroupKind::dp && op.phase == Phase::backward && reduce_bytes != elem_bytes &&
          (op.collective == Collective::reduce_scatter || op.collective == Collective::all_reduce))
        bytes = op.bytes / elem_bytes * reduce_bytes;
      CommCost cc = fabric_.collective_cost(op.collective, bytes, layout.group(g).ranks);
      if (framework_.tp_comm_overlap && op.group == GroupKind::tp && op.layer >= 0 &&
          (op.collective == Collective::all_gather ||
           op.collective == Collective::reduce_scatter)) {
        // What the GEMM beside it does not hide (tp_exposed_s); the op's samples follow from
        // its bytes, e x samples x s x h.
        const LayerStrategy s = layer_strategy(op);
        const int64_t per_sample = int64_t(elem_bytes) * (model_.seq_len / s.cp) * model_.hidden;
        const int samples = int(op.bytes / per_sample);
        const double t = cc.time_s();
        const double x = tp_exposed_s(t, op.collective, s, op.block, op.phase, samples);
        if (t > 0 && x < t) cc.latency_s *= x / t, cc.link_bytes *= x / t;
      }
      return cc;
    }
    case OpKind::send:
    case OpKind::recv: {
      const int peer = resolve_peer(layout, rank, op);
      if (peer < 0) return {};
      return fabric_.p2p_cost(op.bytes, rank, peer);
    }
    case OpKind::copy_d2h:
    case OpKind::copy_h2d:
      return fabric_.copy_cost(op.bytes);
    default:
      return {};
  }
}

double CostModel::op_time_s(const Op& op, const Layout& layout, int rank) const {
  switch (op.kind) {
    case OpKind::compute:
    case OpKind::host_compute:
      return compute_time_s(op);
    case OpKind::alloc:
    case OpKind::free:
      return 0;
    default:
      return comm_cost(op, layout, rank).time_s();
  }
}

}  // namespace stratagem
