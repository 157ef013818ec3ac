#include "stratagem/iteration.hpp"

namespace stratagem {

void ModelStates::add(const LayerStrategy& s, int64_t params, Dtype dt, int grad_bytes) {
  const int64_t e = dtype_bytes(dt);
  const int64_t shard = (params + s.dp_cp() - 1) / s.dp_cp();
  weights += s.offload_params ? 0 : (s.zero == 3 ? shard : params) * e;
  grads += (s.zero >= 2 ? shard : params) * (grad_bytes > 0 ? grad_bytes : e);
  const int64_t n = s.zero >= 1 ? shard : params;
  optimizer += s.offload_optimizer ? 0 : n * optimizer_bytes_per_param(dt);
  (s.offload_optimizer ? host_opt_params : device_opt_params) += n;
  if (s.offload_optimizer && s.offload_params) host_resident_params += n;
}

namespace {
Op adamw(OpKind kind, int64_t params, Dtype dt) {
  Op op;
  op.kind = kind;
  op.block = Block::optimizer;
  op.phase = Phase::optimizer;
  op.dtype = dt;
  op.flops = kAdamwFlopsPerParam * double(params);
  op.bytes = params * (2 * optimizer_bytes_per_param(dt) + 2 * dtype_bytes(dt));
  return op;
}
}  // namespace

Op adamw_op(int64_t params, Dtype dt) {
  return adamw(OpKind::compute, params, dt);
}

Op adamw_host_op(int64_t params, Dtype dt) {
  Op op = adamw(OpKind::host_compute, params, dt);
  op.stream = Stream::d2h;
  return op;
}

TpComm tp_comm(const LayerStrategy& s, Block b, Phase ph) {
  TpComm t;
  if (s.tp == 1) return t;
  const bool sp = s.sequence_parallel;
  const Collective reduce = sp ? Collective::reduce_scatter : Collective::all_reduce;
  const bool bwd = ph == Phase::backward;
  if (b == Block::embedding) {
    t.gathers = bwd && sp ? 1 : 0;
    t.after = bwd ? Collective::none : reduce;
  } else if (b == Block::head) {
    t.gathers = !bwd && sp ? 1 : 0;
    t.after = bwd ? reduce : Collective::none;
  } else {
    t.gathers = sp ? (bwd ? 2 : 1) : 0;
    t.after = reduce;
  }
  return t;
}

WeightFetch weight_fetch(const LayerStrategy& s, int64_t params, Dtype dt) {
  WeightFetch f;
  f.gathers = s.zero == 3 && s.dp_cp() > 1;
  if (!f.gathers && !s.offload_params) return f;
  f.bytes = params * dtype_bytes(dt);
  // ZeRO-Infinity: the rank's shard crosses PCIe into its place in the gather buffer.
  if (s.offload_params) f.h2d_bytes = f.gathers ? (f.bytes + s.dp_cp() - 1) / s.dp_cp() : f.bytes;
  return f;
}

int64_t end_parameters_per_rank(const ModelSpec& m, int tp, bool first, bool last) {
  int64_t n = 0;
  if (first) n += embedding_parameters_per_rank(m, tp);
  if (last) n += head_parameters_per_rank(m, tp);
  if (last && !first && m.tied_embeddings) n += vocab_rows_per_rank(m, tp) * m.hidden;
  return n;
}

int64_t tied_embedding_reduce_bytes(const ModelSpec& m, int tp, Dtype dt) {
  return vocab_rows_per_rank(m, tp) * m.hidden * dtype_bytes(dt);
}

Op embedding_op(const ModelSpec& m, int samples, Phase ph, Dtype dt, int cp) {
  Op op;
  op.kind = OpKind::compute;
  op.block = Block::embedding;
  op.phase = ph;
  op.dtype = dt;
  op.strategy.cp = cp;
  op.samples = samples;
  // The lookup reads the rows and writes the stream; the backward zeroes and scatter-adds.
  op.bytes = static_cast<int64_t>(2.0 * double(token_stream_bytes(m, samples, dt, cp)));
  return op;
}

HeadOps head_ops(const ModelSpec& m, int tp, int samples, Dtype dt, int cp) {
  HeadOps h;
  const double T = double(samples) * (m.seq_len / cp);
  const int64_t v = vocab_rows_per_rank(m, tp);
  const double logits_flops = 2.0 * T * m.hidden * v;
  h.logits_bytes = static_cast<int64_t>(4.0 * T * v);
  // Each phase writes and reads the fp32 logits (or their gradient) and the hidden states.
  const auto bytes =
      static_cast<int64_t>(2.0 * h.logits_bytes + 2.0 * dtype_bytes(dt) * T * m.hidden);
  for (Op* op : {&h.forward, &h.backward}) {
    op->kind = OpKind::compute;
    op->block = Block::head;
    op->dtype = dt;
    op->strategy.tp = tp;  // what shapes the logits (build_program adds the embedding's rest)
    op->strategy.cp = cp;
    op->samples = samples;
    op->bytes = bytes;
  }
  h.forward.phase = Phase::forward;
  h.forward.flops = logits_flops;
  h.backward.phase = Phase::backward;
  h.backward.flops = 2 * logits_flops;
  h.loss_max_bytes = static_cast<int64_t>(4 * T);
  h.loss_sum_bytes = static_cast<int64_t>(8 * T);
  return h;
}

}  // namespace stratagem
