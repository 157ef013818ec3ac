// The Program's collectives, sends and receives on this rank: which tensors each one moves,
// issued without blocking, and what completes when it lands.
#include "src/runtime/exec/ops_comm.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "src/runtime/exec/dispatch.hpp"
#include "src/runtime/exec/ops_compute.hpp"
#include "src/runtime/exec/ops_cp.hpp"
#include "src/runtime/exec/ops_moe.hpp"
#include "src/runtime/exec/ops_offload.hpp"
#include "src/runtime/exec/rank_context.hpp"
#include "stratagem/error.hpp"

namespace stratagem::exec {

void CommOps::collective(const Op& op, int index) {
  switch (op.group) {
    case GroupKind::tp:
      tp_collective(op, index);
      return;
    case GroupKind::dp:
    case GroupKind::tied_embedding:
      dp_collective(op, index);
      return;
    case GroupKind::reshard:
      reshard(op, index);
      return;
    case GroupKind::expert_dp:
      dp_collective(op, index);
      return;
    case GroupKind::ep:
      moe_.ep_collective(op, index);
      return;
    case GroupKind::expert_tp:
      moe_.etp_collective(op);
      return;
    case GroupKind::cp:
      cp_.transfer(op, index);
      return;
    default:
      throw NotSupported("collective " + op_name(op) + " over the " + to_string(op.group) +
                         " group is not executed by the runtime yet (heterogeneous plans)");
  }
}

void CommOps::tp_collective(const Op& op, int index) {
  switch (op.purpose) {
    case Purpose::replicated_grads:
      tp_norm_grads_sum(op, index);
      return;
    case Purpose::router_stats:
      moe_.aux_sum(op);
      return;
    case Purpose::loss_stats: {
      // Vocabulary-parallel cross entropy: the row maximum, then sum-exp and target logit.
      Micro& m = rank_.mb(op.microbatch);
      Communicator& comm = rank_.group_of(op);
      const int64_t N = rank_.share(-1).tokens;  // the head's tokens
      if (!m.ce_sums.defined()) {
        rank_.requests.issue(index, comm.iall_reduce(m.ce_max.data, N, ReduceOp::max),
                             [this, &m] { compute_.head_loss_sums(m); });
      } else {
        rank_.requests.issue(index, comm.iall_reduce(m.ce_sums.data, 2 * N, ReduceOp::sum),
                             [this, &m] { compute_.head_loss(m); });
      }
      return;
    }
    case Purpose::activations:
      if (op.collective == Collective::all_gather)
        tp_gather(op, index);
      else
        tp_reduce(op, index);
      return;
    default:
      throw std::logic_error("executor: a tp collective for " + std::string(to_string(op.purpose)) +
                             ": " + op_name(op));
  }
}

void CommOps::tp_norm_grads_sum(const Op& op, int index) {
  // Sequence parallel: gradients of the norms of a layer (or the final norm), each computed
  // on one token shard, summed over the group; an MoE layer's router's (the op's block is
  // Block::router), from each rank's token slice.
  Communicator& comm = rank_.group_of(op);
  const std::string layer = "layers." + std::to_string(op.layer) + ".";
  std::vector<Tensor> parts;
  for (const ParamInfo& e : rank_.shards.model.table.entries()) {
    const bool is_norm = e.name.find("norm") != std::string::npos;
    const bool mine = op.layer >= 0 ? e.name.rfind(layer, 0) == 0 : e.name.rfind("norm_f.", 0) == 0;
    const bool summed = op.block == Block::router ? e.name.rfind(layer + "mlp.router.", 0) == 0
                                                  : mine && is_norm && e.replicated;
    if (summed)
      parts.push_back(weight_field(rank_.shards.model.grad_weights, e.name));  // flat or staged
  }
  auto group = std::make_unique<RequestGroup>();
  for (Tensor& t : parts)
    group->parts.push_back(comm.iall_reduce(t.data, t.numel(), ReduceOp::sum));
  rank_.requests.issue(index, std::move(group));
}

void CommOps::tp_gather(const Op& op, int index) {
  Micro& m = rank_.mb(op.microbatch);
  Tensor gathered = rank_.buffers.pool.scratch(rank_.full_shape(op.layer));
  Tensor src;
  if (op.block == Block::head) {  // the final norm on this rank's shard, then gather
    compute_.norm_head_input(m);
    src = m.xn;
    m.gathered = gathered;
  } else if (op.phase == Phase::backward) {
    if (m.grad_producer >= 0) dispatcher_.complete(m.grad_producer);
    if (!m.gathered_dy.defined() || op.block == Block::embedding) {
      fit_grad(m, op.layer);  // this rank's token shard, where the layer above held more
      src = m.grad;           // first: the output gradient
      m.gathered_dy = gathered;
    } else {
      LayerState& ls = m.layers.at(op.layer);  // second: the sharded normalized input
      src = op.block == Block::attention ? ls.attn.norm_out : ls.mlp.norm_out;
      m.gathered = gathered;
    }
  } else {
    compute_.block_input(op, m, m.layers[op.layer]);
    LayerState& ls = m.layers[op.layer];
    src = op.block == Block::attention ? ls.attn.norm_out : ls.mlp.norm_out;
    m.gathered = gathered;
  }
  const int64_t shard_n = rank_.share(op.layer).shard_tokens * int64_t(rank_.whole.hidden);
  rank_.requests.issue(index, rank_.group_of(op).iall_gather(src.data, gathered.data, shard_n),
                       [src] {});
}

// The reduction of a partial sum: a block's (or the lookup's) output in forward, the gradient
// of its normalized input in backward.
void CommOps::tp_reduce(const Op& op, int index) {
  Communicator& comm = rank_.group_of(op);
  const LayerShare& sh = rank_.share(op.layer);  // the block's layer (-1: embedding and head)
  Micro& m = rank_.mb(op.microbatch);
  Tensor partial = m.partial;
  m.partial = Tensor{};
  Tensor reduced = partial;
  RequestPtr req;
  if (op.collective == Collective::reduce_scatter) {
    reduced = rank_.buffers.pool.scratch(rank_.stream_shape(op.layer));
    req = comm.ireduce_scatter(partial.data, reduced.data,
                               sh.shard_tokens * int64_t(rank_.whole.hidden));
  } else {
    req = comm.iall_reduce(partial.data, sh.tokens * int64_t(rank_.whole.hidden), ReduceOp::sum);
  }
  const int mbi = op.microbatch;
  if (op.phase != Phase::backward) {
    Flow* flow = op.phase == Phase::recompute ? &m.rec : &m.fwd;
    Tensor base;
    if (op.block == Block::attention) base = m.layers.at(op.layer).x_in;
    if (op.block == Block::mlp) base = m.layers.at(op.layer).x_mid;
    *flow = Flow{op.block == Block::embedding ? reduced : base,
                 op.block == Block::embedding ? Tensor{} : reduced, index};
    if (op.layer >= 0) compute_.drop_unsaved_block_input(op, m.layers.at(op.layer));
    rank_.requests.issue(index, std::move(req), [partial] {});
    return;
  }
  m.grad_producer = index;
  if (op.block == Block::head) {
    rank_.requests.issue(index, std::move(req), [this, mbi, reduced, partial] {
      compute_.finish_head_backward(rank_.current_step.micro.at(mbi), reduced);
    });
    // Under ZeRO-3 the final norm's weight is in the head's fetched weights.
    rank_.buffers.read_by(Block::none, Phase::forward, -1, mbi, index);
    return;
  }
  const int l = op.layer;
  const Block b = op.block;
  rank_.requests.issue(index, std::move(req), [this, mbi, l, b, reduced, partial] {
    compute_.finish_block_backward(l, b, rank_.current_step.micro.at(mbi), reduced);
  });
  // The completion reads the block's saved input and statistics: their buffers (where
  // offloaded activations came back, the backward's) wait for it.
  for (Phase ph : {Phase::forward, Phase::recompute, Phase::backward})
    rank_.buffers.read_by(b, ph, l, mbi, index);
  // ... and, under ZeRO-3, the norm's weight in the layer's fetched weights.
  rank_.buffers.read_by(Block::none, Phase::backward, l, mbi, index);
}

void CommOps::fetch(const Op& op, int index) {
  Communicator& comm = rank_.group_of(op);
  // (Block::experts: an MoE layer's experts over the expert data-parallel group.)
  const int buf = rank_.buffers.of(op.block, op.phase, op.layer, op.microbatch);
  // Offloaded shards were placed by the h2d copy this gather depends on.
  if (!rank_.shards.fetched.count(buf)) offload_.place_fetch(op, nullptr, index);
  const Segment& seg = rank_.shards.sharding.of(rank_.segment_key(op));
  auto group = std::make_unique<RequestGroup>();
  for (const ParamInfo* e : rank_.shards.fetched.at(buf)) {
    // In place: this rank's piece is at its displacement.
    Tensor& dst = weight_field(rank_.shards.model.weights, e->name);
    group->parts.push_back(
        comm.iall_gather_v_inplace(dst.data, seg.counts(e->offset, e->offset + e->numel())));
  }
  rank_.requests.issue(index, std::move(group));
}

void CommOps::dp_collective(const Op& op, int index) {
  if (op.purpose == Purpose::weight_fetch) {
    fetch(op, index);
    return;
  }
  Communicator& comm = rank_.group_of(op);
  auto group = std::make_unique<RequestGroup>();
  if (op.purpose == Purpose::tied_grads) {
    // First and last stage sum their copies of the tied word embedding's gradient.
    Tensor& wte = weight_field(rank_.shards.model.grad_weights, "wte");  // flat or staged
    group->parts.push_back(comm.iall_reduce(wte.data, wte.numel(), ReduceOp::sum));
    rank_.requests.issue(index, std::move(group));
    return;
  }
  // The layer's own partition over the group (layer -1: the embedding and head's; an MoE
  // layer's experts over the expert data-parallel group).
  const Segment& seg = rank_.shards.sharding.of(rank_.segment_key(op));
  auto grads_at = [this](int64_t flat) {
    return rank_.shards.model.grads.data + rank_.shards.sharding.grads.local(flat);
  };
  auto grads_slice = [this](int64_t flat, int64_t n) {
    return rank_.shards.model.grads.slice(rank_.shards.sharding.grads.local(flat), Shape{n});
  };
  if (op.purpose == Purpose::updated_weights) {
    // ZeRO-1/2: every rank updated its piece; gather the others' fresh weights.
    for (auto [a, b] : seg.runs)
      group->parts.push_back(
          comm.iall_gather_v_inplace(rank_.shards.param_slice(a, b - a).data, seg.counts(a, b)));
    rank_.requests.issue(index, std::move(group));
    return;
  }
  if (op.purpose != Purpose::grad_reduce)
    throw std::logic_error("executor: a data-parallel collective for " +
                           std::string(to_string(op.purpose)) + ": " + op_name(op));
  if (op.collective == Collective::all_reduce) {
    for (auto [a, b] : seg.runs)
      group->parts.push_back(comm.iall_reduce(grads_at(a), b - a, ReduceOp::sum));
    rank_.requests.issue(index, std::move(group));
    return;
  }
  // The dp stream is in order (as the Program's): one reduce-scatter and its received piece at
  // a time.
  if (rank_.requests.last_dp_reduce >= 0) dispatcher_.complete(rank_.requests.last_dp_reduce);
  rank_.requests.last_dp_reduce = index;
  if (seg.sharded_grads()) {
    // ZeRO-2/3: this micro-batch's staged gradients, reduce-scattered and added to the piece.
    auto it = rank_.shards.staging.find(rank_.segment_key(op));
    if (it == rank_.shards.staging.end())
      throw std::logic_error("executor: no staged gradients for " + op_name(op));
    std::vector<std::pair<Tensor, Tensor>> landed;  // (piece of model.grads, sum)
    std::vector<Tensor> sent;
    for (auto& [a, t] : it->second) {
      const int64_t b = a + t.numel();
      auto counts = seg.counts(a, b);
      Tensor mine = received_piece(op, index, counts[seg.dp_index]);
      group->parts.push_back(comm.ireduce_scatter_v(t.data, mine.data, counts));
      sent.push_back(t);
      if (counts[seg.dp_index] > 0)
        landed.push_back({grads_slice(seg.piece_begin(a, b, seg.dp_index), counts[seg.dp_index]),
                          mine.slice(0, Shape{counts[seg.dp_index]})});
    }
    rank_.shards.staging.erase(it);  // the next micro-batch stages afresh
    rank_.requests.issue(index, std::move(group), [this, landed, sent] {
      for (auto [dst, t] : landed) rank_.backend.residual_forward(dst, dst, t);
    });
    return;
  }
  // ZeRO-1 reduce-scatter: this rank receives the sum where the range meets its piece. (MPI has
  // no in-place form that leaves the result at the piece's position, as NCCL's has: the sum
  // lands in scratch and is copied there.)
  std::vector<std::pair<Tensor, Tensor>> landed;  // (piece of model.grads, sum)
  for (auto [a, b] : seg.runs) {
    auto counts = seg.counts(a, b);
    Tensor mine = received_piece(op, index, counts[seg.dp_index]);
    group->parts.push_back(comm.ireduce_scatter_v(grads_at(a), mine.data, counts));
    if (counts[seg.dp_index] > 0)
      landed.push_back({grads_slice(seg.piece_begin(a, b, seg.dp_index), counts[seg.dp_index]),
                        mine.slice(0, Shape{counts[seg.dp_index]})});
  }
  rank_.requests.issue(index, std::move(group), [this, landed] {
    for (auto [dst, t] : landed) rank_.backend.copy(dst, t);
  });
}

Tensor CommOps::received_piece(const Op& op, int index, int64_t n) {
  const Shape shape{std::max<int64_t>(1, n)};
  if (op.buffer < 0) return rank_.buffers.pool.scratch(shape);
  // The Program's buffer for the piece: its free waits for the reduction's completion.
  auto& users = rank_.buffers.users[op.buffer];
  if (std::find(users.begin(), users.end(), index) == users.end()) users.push_back(index);
  return rank_.buffers.pool.take(op.buffer, shape);
}

int CommOps::pp_tag(const Op& op, bool sending) const {
  // One tag per (chunk boundary, micro-batch, direction): an interleaved pipeline of two
  // stages sends both ways between the same two ranks.
  const bool fwd = op.phase == Phase::forward;
  int boundary = op.chunk;
  if (fwd && !sending) boundary = op.chunk - 1;
  if (!fwd && sending) boundary = op.chunk - 1;
  return 2 * (boundary * rank_.program.num_microbatches + op.microbatch) + (fwd ? 0 : 1);
}

void CommOps::send(const Op& op, int index) {
  if (op.group == GroupKind::cp) {  // the cp ring's (ops_cp.cpp)
    cp_.transfer(op, index);
    return;
  }
  Micro& m = rank_.mb(op.microbatch);
  const int peer = resolve_peer(rank_.parallel.layout(), rank_.parallel.rank(), op);
  Tensor data;
  if (op.phase == Phase::forward) {
    data = compute_.materialize(m.fwd, -1, rank_.stream_shape(op.layer));
    m.fwd = Flow{};
  } else {
    fit_grad(m, op.layer);  // in the layout of the previous stage's last layer
    data = m.grad;
    m.grad = Tensor{};
    m.grad_producer = -1;
  }
  rank_.requests.issue(
      index, rank_.parallel.world().isend(data.data, data.numel(), peer, pp_tag(op, true)),
      [data] {});
  // A stage's first chunk sends the micro-batch's last gradient: its state is done.
  if (op.phase == Phase::backward && op.chunk == rank_.stage)
    rank_.current_step.micro.erase(op.microbatch);
}

void CommOps::recv(const Op& op, int index) {
  if (op.group == GroupKind::cp) {  // the cp ring's (ops_cp.cpp)
    cp_.transfer(op, index);
    return;
  }
  Micro& m = rank_.mb(op.microbatch);
  const int peer = resolve_peer(rank_.parallel.layout(), rank_.parallel.rank(), op);
  // The sender's layer: forward, the previous stage's last; backward, this chunk's last.
  Tensor data = rank_.buffers.pool.scratch(rank_.stream_shape(op.layer));
  rank_.requests.issue(
      index, rank_.parallel.world().irecv(data.data, data.numel(), peer, pp_tag(op, false)));
  if (op.phase == Phase::forward) {
    m.fwd = Flow{data, {}, index};
  } else {
    m.grad = data;
    m.grad_producer = index;
  }
}

}  // namespace stratagem::exec
