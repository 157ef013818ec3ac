// Context parallelism in the Program: the attention block of a layer with cp > 1, in each phase.
//
// Ops of one cp attention (layer l, micro-batch mb; every op carries layer, microbatch, phase,
// chunk, block = attention and tp = the layer's tp; `tp` selects the cp group in the Layout).
// Phases: forward and recompute (full recompute rebuilds the forward with its communication)
// emit the forward ops; backward the backward ops. Bytes come from iteration.hpp's cp_comm.
//
//   alloc  stream compute, category buffers, part whole: the kind's working buffers
//          (CpComm::buffer_bytes), freed on the compute stream after the last compute op.
//   compute part pre   the norm, QKV projection and RoPE of the rank's seq_len / cp tokens
//                      (backward: their gradients, after the core's; the block's dgrad/wgrad).
//   compute part core  the attention core of the rank's queries (cp_step: the ring step, -1
//                      for allgather/a2a, which run it once) against the K/V at hand.
//   compute part post  the output projection, dropout and residual (backward: first).
//
// ring (Megatron-Core AttnFuncWithCPAndKVP2P; the sequence is 2 x cp chunks, rank c holding
// chunks c and 2cp-1-c, so each step's causal work is the same): cp core steps. Step j uses the
// K/V block of cp index (c - j) mod cp.
//   send/recv  stream cp_comm, group cp, part pre, cp_step j (0 .. cp-2), bytes kv_bytes:
//              the K and V block of step j to the next cp rank, the block of step j + 1 from the
//              previous one. Send j waits for pre (j = 0) or receive j - 1; core step j + 1
//              waits for receive j, so the transfer runs beside core step j.
//   backward also: send/recv part core, cp_step j (0 .. cp-1), bytes kv_bytes: the dK, dV
//              accumulator of the block used at step j to the next rank: core step j's
//              partial dK, dV (into a buffer of its own) plus the accumulator received at step
//              j - 1 (none at j = 0) for the same block, so send j waits for core step j and
//              receive j - 1, and no core step waits for an accumulator (Megatron-Core adds
//              the received one after the step's kernel). The last (j = cp - 1) brings each
//              rank its own block's dK, dV, which pre's backward waits for. K/V go around
//              again in backward (they were not kept whole).
//   Stream order on cp_comm: kv 0, [kv j + 1 then dkv j] for each step j.
// Every transfer's `part` says which side of the core it is on: pre, what the core waits for
// (the K/V blocks, the collective before it); core, what carries the core's results (the dK/dV
// accumulators, the collective after it).
// allgather (Llama 3; Megatron-Core's all_gather):
//   collective all_gather, stream cp_comm, group cp, bytes cp x kv_bytes (the gathered K and
//              V; each rank gives its own), before the core (forward: after pre; backward:
//              beside post's backward, re-gathered).
//   backward: collective reduce_scatter, bytes cp x kv_bytes: the whole dK, dV the core
//              backward made, each rank keeping its own block's sum; pre's backward waits.
// a2a (DeepSpeed-Ulysses; heads divide by cp x tp):
//   collective all_to_all, stream cp_comm, group cp, before the core: forward Q, K, V (bytes:
//              the rank's whole local Q, K, V, which it sends 1/cp of to each rank: sequence
//              split -> head split), backward the output gradient (bytes of the output).
//   collective all_to_all after the core: forward the output (head split -> sequence split),
//              backward dQ, dK, dV. The next compute op waits for it.
#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

int CpAttention::cp_compute(AttentionPart part, Phase ph, int layer, int mb, int step) {
  const auto& s = stage_.strat(layer);
  const int b = stage_.samples(layer);
  const BlockWork f = attention_part_work(stage_.model, s, part, b, stage_.plan.flash_attention);
  const BlockWork w = ph == Phase::backward ? backward_of(f) : f;
  const int c = ops_.compute(Block::attention, ph, layer, mb, b, w.flops(), w.elementwise_bytes);
  ops_.op(c).part = part;
  ops_.op(c).cp_step = static_cast<int16_t>(step);
  return c;
}

int CpAttention::cp_transfer(OpKind kind, AttentionPart carries, Phase ph, int layer, int mb,
                             int step, int64_t bytes, std::initializer_list<int> deps) {
  Op op = OpEmitter::make(kind, Stream::cp_comm, Block::attention, ph, layer, mb);
  op.group = GroupKind::cp;
  op.purpose = Purpose::context;
  op.bytes = bytes;
  op.chunk = static_cast<int16_t>(ops_.chunk());
  op.part = carries;
  op.cp_step = static_cast<int16_t>(step);
  return ops_.emit(op, deps);
}

int CpAttention::cp_collective(Collective c, AttentionPart carries, int64_t bytes, Phase ph,
                               int layer, int mb, int after) {
  const int op = ops_.collective(Stream::cp_comm, c, GroupKind::cp, Purpose::context, bytes,
                                 Block::attention, ph, layer, mb, {after});
  ops_.op(op).part = carries;
  ops_.compute_waits_for(op);
  return op;
}

int CpAttention::cp_attention(Phase ph, int layer, int mb) {
  const auto& s = stage_.strat(layer);
  const CpComm c = cp_comm(stage_.model, s, stage_.samples(layer), ph, stage_.plan.dtype);
  const bool bwd = ph == Phase::backward;
  const int buf = ops_.alloc(Stream::compute, MemCategory::buffers, c.buffer_bytes, layer, mb, ph,
                             Block::attention);
  int last = -1;
  if (s.cp_kind == CpKind::ring) {
    const int start = cp_compute(bwd ? AttentionPart::post : AttentionPart::pre, ph, layer, mb);
    auto kv_pair = [&](int j, int after) {
      cp_transfer(OpKind::send, AttentionPart::pre, ph, layer, mb, j, c.kv_bytes, {after});
      return cp_transfer(OpKind::recv, AttentionPart::pre, ph, layer, mb, j, c.kv_bytes, {});
    };
    int kv_recv = c.kv_steps > 0 ? kv_pair(0, start) : -1;
    int kv_prev = -1, dkv_recv = -1;
    for (int j = 0; j < s.cp; ++j) {
      if (kv_prev >= 0) ops_.compute_waits_for(kv_prev);
      const int core = cp_compute(AttentionPart::core, ph, layer, mb, j);
      kv_prev = kv_recv;
      if (j + 1 < c.kv_steps) kv_recv = kv_pair(j + 1, kv_recv);
      if (j < c.dkv_steps) {
        cp_transfer(OpKind::send, AttentionPart::core, ph, layer, mb, j, c.kv_bytes,
                    {core, dkv_recv});
        dkv_recv = cp_transfer(OpKind::recv, AttentionPart::core, ph, layer, mb, j, c.kv_bytes, {});
      }
    }
    if (dkv_recv >= 0) ops_.compute_waits_for(dkv_recv);
    last = cp_compute(bwd ? AttentionPart::pre : AttentionPart::post, ph, layer, mb);
  } else if (!bwd) {
    cp_collective(c.before, AttentionPart::pre, c.before_bytes, ph, layer, mb,
                  cp_compute(AttentionPart::pre, ph, layer, mb));
    const int core = cp_compute(AttentionPart::core, ph, layer, mb);
    if (c.after != Collective::none)
      cp_collective(c.after, AttentionPart::core, c.after_bytes, ph, layer, mb, core);
    last = cp_compute(AttentionPart::post, ph, layer, mb);
  } else {
    // The all-gather re-gathers K and V from the saved local blocks beside post's backward;
    // the all-to-all moves the output gradient post's backward makes.
    const int before_block = ops_.last_compute();
    const bool gather = s.cp_kind == CpKind::allgather;
    int pending = -1;
    if (gather) {
      pending = ops_.collective(Stream::cp_comm, c.before, GroupKind::cp, Purpose::context,
                                c.before_bytes, Block::attention, ph, layer, mb, {before_block});
      ops_.op(pending).part = AttentionPart::pre;
    }
    const int post = cp_compute(AttentionPart::post, ph, layer, mb);
    if (gather)
      ops_.compute_waits_for(pending);
    else
      cp_collective(c.before, AttentionPart::pre, c.before_bytes, ph, layer, mb, post);
    const int core = cp_compute(AttentionPart::core, ph, layer, mb);
    cp_collective(c.after, AttentionPart::core, c.after_bytes, ph, layer, mb, core);
    last = cp_compute(AttentionPart::pre, ph, layer, mb);
  }
  ops_.release(buf, Stream::compute);
  return last;
}

}  // namespace stratagem::program_detail
