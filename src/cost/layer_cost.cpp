#include "src/cost/layer_cost.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "src/cost/cp_cost.hpp"
#include "stratagem/workload.hpp"

namespace stratagem::cost_detail {
double optimizer_step_s(const CostModel& c, int64_t params) {
  return c.compute_time_s(adamw_op(params, c.dtype()));
}

double host_optimizer_step_s(const CostModel& c, int64_t params, int64_t host_resident) {
  const Dtype dt = c.dtype();
  return c.fabric().copy_cost(params * dtype_bytes(dt)).time_s() +
         c.fabric().copy_cost((params - host_resident) * dtype_bytes(dt)).time_s() +
         c.compute_time_s(adamw_host_op(params, dt));
}

GradSyncCost grad_sync_cost(const CostModel& c, const LayerStrategy& s, int64_t params,
                            int dp_nodes) {
  const GradSync g = grad_sync(s);
  GradSyncCost x;
  x.per_microbatch = g.per_microbatch;
  if (g.reduce == Collective::none) return x;
  const int64_t gbytes = params * c.grad_reduce_bytes();  // gradients on the wire
  x.reduce_s = c.fabric().collective_cost(g.reduce, gbytes, s.dp_cp(), dp_nodes).time_s();
  if (g.gather_after_step)
    x.gather_s = c.fabric()
                     .collective_cost(Collective::all_gather, params * dtype_bytes(c.dtype()),
                                      s.dp_cp(), dp_nodes)
                     .time_s();
  return x;
}

ReshardCost reshard_cost(const CostModel& c, const LayerStrategy& from, int from_samples,
                         const LayerStrategy& to, int to_samples) {
  ReshardCost r;
  auto gather = [&](const LayerStrategy& s, int samples, int size) {
    const int64_t bytes = boundary_activation_bytes(c.model(), s, samples, c.dtype());
    return c.fabric().collective_cost(Collective::all_gather, bytes, size, 1).time_s();
  };
  // As the Program's reshard: forward from `from` to `to`, backward the other way.
  if (const int n = reshard_gather_ranks(from, to)) r.fwd_s = gather(to, to_samples, n);
  if (const int n = reshard_gather_ranks(to, from)) r.bwd_s = gather(from, from_samples, n);
  return r;
}

FetchCost fetch_cost(const CostModel& c, const LayerStrategy& s, int64_t params, int dp_nodes,
                     bool with_time) {
  FetchCost f;
  const WeightFetch w = weight_fetch(s, params, c.dtype());
  f.bytes = w.bytes;
  if (w.bytes == 0 || !with_time) return f;
  if (w.gathers) {
    f.time_s =
        c.fabric().collective_cost(Collective::all_gather, w.bytes, s.dp_cp(), dp_nodes).time_s();
    // ZeRO-3 with offloaded parameters: the shard crosses PCIe before each gather.
    if (w.h2d_bytes > 0) f.time_s += c.fabric().copy_cost(w.h2d_bytes).time_s();
  } else {
    f.time_s = c.fabric().copy_cost(w.h2d_bytes).time_s();
    f.on_h2d = true;
  }
  return f;
}

namespace {

// A dense layer's bytes, tensor by tensor as the Program allocates them, beside `fetch_bytes`
// of fetched weights.
void layer_bytes(const CostModel& c, const Plan& p, const LayerStrategy& s, int b, int64_t params,
                 int64_t fetch_bytes, LayerCost& lc) {
  const ModelSpec& m = c.model();
  const bool flash = p.flash_attention;
  lc.states.add(s, params, p.dtype, c.framework().grad_buffer_bytes);
  const int64_t sa = kept_activation_bytes(m, s, Block::attention, b, s.recompute, flash, p.dtype);
  const int64_t sm = kept_activation_bytes(m, s, Block::mlp, b, s.recompute, flash, p.dtype);
  lc.kept = s.offload_activations ? 0 : sa + sm;
  lc.staged_bytes = staged_gradient_bytes(s, params, p.dtype, c.framework().layer_gradient_staging);
  lc.piece_bytes = receive_piece_bytes(s, params, p.dtype);
  lc.workspace = layer_workspace_bytes(m, s, b, p.dtype);
  lc.pipelined_workspace = layer_workspace_bytes(m, s, b, p.dtype, /*pipelined=*/true);
  lc.fwd_act = sa + sm;
  lc.fwd_buf = fetch_bytes;
  // Backward of the layer: the mlp backward runs with both blocks' saved tensors (and full
  // recompute's rebuilt ones); the attention backward with the attention's only.
  int64_t during_mlp = sa + sm, during_attn = sa;
  auto rebuilt = [&](Block blk) {
    return recomputed_activation_bytes(m, s, blk, b, flash, p.dtype);
  };
  if (s.recompute == Recompute::full) {
    const int64_t re_a = rebuilt(Block::attention);
    during_mlp += re_a + rebuilt(Block::mlp);
    during_attn += re_a;
  } else if (s.recompute == Recompute::selective && !flash) {
    during_attn += rebuilt(Block::attention);  // probabilities
  }
  if (splits_backward(p.schedule)) {
    // A split backward (Program::backward): the mlp's B writes its output gradients for W
    // beside everything; the attention's B runs with what the mlp's left for W, its own, and
    // (full recompute) the rebuilt activations, which stay until W. Then the layer holds what
    // its W reads.
    auto w_in = [&](Block blk) { return weight_input_bytes(m, s, blk, b, p.dtype); };
    auto w_stash = [&](Block blk) { return weight_stash_bytes(m, s, blk, b, p.dtype); };
    const bool full = s.recompute == Recompute::full;
    const int64_t rebuilt_m = full ? rebuilt(Block::mlp) : 0;
    const int64_t rebuilt_a = full ? rebuilt(Block::attention) : 0;
    during_mlp += w_stash(Block::mlp);
    during_attn += w_in(Block::mlp) + w_stash(Block::mlp) + rebuilt_m + w_stash(Block::attention);
    lc.weight_held_bytes = w_in(Block::attention) + w_in(Block::mlp) + w_stash(Block::attention) +
                           w_stash(Block::mlp) + rebuilt_a + rebuilt_m;
  }
  lc.bwd_mlp_act = during_mlp;
  lc.bwd_attn_act = during_attn;
  lc.bwd_buf = fetch_bytes;
  if (s.cp > 1) {
    // The cp attention's working buffers (CpComm::buffer_bytes) beside its activations.
    lc.fwd_buf += cp_comm(m, s, b, Phase::forward, p.dtype).buffer_bytes;
    lc.bwd_buf += cp_comm(m, s, b, Phase::backward, p.dtype).buffer_bytes;
  }
}

// A dense layer's kernels per phase, and under cp the exposed cp communication.
void layer_kernels(const CostModel& c, const LayerStrategy& s, int b, bool flash, bool split,
                   int cp_nodes, LayerCost& lc) {
  const ModelSpec& m = c.model();
  if (s.cp > 1) {
    // The split attention's parts (the ring's steps each a kernel).
    lc.fwd_s = cp_attention_kernels_s(c, s, b, Phase::forward, flash) +
               c.block_time_s(forward_work(m, s, Block::mlp, b, flash));
    lc.bwd_s = cp_attention_kernels_s(c, s, b, Phase::backward, flash) +
               c.backward_block_time_s(s, Block::mlp, b, flash);
    const CpCost x = cp_cost(c, s, b, cp_nodes, flash);
    lc.cp_fwd_s = x.fwd_s;
    lc.cp_bwd_s = x.bwd_s;
    lc.cp_rec_s = s.recompute == Recompute::full ? x.fwd_s : 0;
  } else {
    lc.fwd_s = c.block_time_s(forward_work(m, s, Block::attention, b, flash)) +
               c.block_time_s(forward_work(m, s, Block::mlp, b, flash));
    lc.bwd_s = c.backward_block_time_s(s, Block::attention, b, flash) +
               c.backward_block_time_s(s, Block::mlp, b, flash);
  }
  if (split) {
    // B and W as the Program's ops (CostModel::compute_time_s): their sum is the backward.
    double input_s = 0;
    lc.weight_grad_s = 0;
    for (Block blk : {Block::attention, Block::mlp}) {
      input_s += c.block_time_s(input_grad_of(forward_work(m, s, blk, b, flash)));
      lc.weight_grad_s += c.weight_grad_time_s(s, blk, b);
    }
    lc.bwd_s = input_s + lc.weight_grad_s;
  }
  if (s.recompute == Recompute::full) {
    lc.rec_s = lc.fwd_s;
  } else if (s.recompute == Recompute::selective && !flash) {
    lc.rec_s = c.block_time_s(selective_recompute_work(m, s, b));
  }
}

// A dense layer's tensor-parallel collectives per phase (tp_comm): the attention's and the
// mlp's are alike.
void layer_tp_comm(const CostModel& c, const LayerStrategy& s, int b, int tp_nodes, LayerCost& lc) {
  if (s.tp <= 1) return;
  auto coll = [&](Collective k, int64_t bytes) {
    return c.fabric().collective_cost(k, bytes, s.tp, tp_nodes).time_s();
  };
  const TpComm fwd = tp_comm(s, Block::attention, Phase::forward);
  const TpComm bwd = tp_comm(s, Block::attention, Phase::backward);
  const int64_t msg = token_stream_bytes(c.model(), b, c.dtype(), s.cp);
  const double gather = coll(Collective::all_gather, msg);
  const double after = coll(fwd.after, msg);
  const double per_block = fwd.gathers * gather + after;
  if (c.framework().tp_comm_overlap && s.sequence_parallel) {
    // Each collective beside its GEMM (CostModel::tp_exposed_s), as the simulator costs it.
    auto phase = [&](Phase ph) {
      double t = 0;
      for (Block blk : {Block::attention, Block::mlp}) {
        const TpComm x = tp_comm(s, blk, ph);
        t += x.gathers * c.tp_exposed_s(gather, Collective::all_gather, s, blk, ph, b) +
             c.tp_exposed_s(after, x.after, s, blk, ph, b);
      }
      return t;
    };
    lc.tp_fwd_s = phase(Phase::forward);
    lc.tp_bwd_s = phase(Phase::backward);
    lc.tp_rec_s = s.recompute == Recompute::full ? phase(Phase::recompute) : 0;
  } else {
    lc.tp_fwd_s = 2 * per_block;
    lc.tp_bwd_s = 2 * (per_block + (bwd.gathers - fwd.gathers) * gather);
    lc.tp_rec_s = s.recompute == Recompute::full ? 2 * per_block : 0;
  }
  // (The once-per-iteration sum of the norms' gradients under sequence parallelism, a few KiB,
  // is left to the simulator.)
}

}  // namespace

LayerCost layer_cost(const CostModel& c, const Plan& p, const LayerStrategy& s, int b, int tp_nodes,
                     int dp_nodes, bool with_time, const MoeNodes& moe, int cp_nodes) {
  if (moe.moe) {
    LayerCost lc = layer_cost(c, p, s, b, tp_nodes, dp_nodes, with_time, MoeNodes{}, cp_nodes);
    add_moe_costs(c, p, s, b, tp_nodes, dp_nodes, moe, with_time, lc);
    return lc;
  }
  LayerCost lc;
  const int64_t params = layer_parameters_per_rank(c.model(), s.tp);
  const FetchCost fetch = fetch_cost(c, s, params, dp_nodes, with_time);
  layer_bytes(c, p, s, b, params, fetch.bytes, lc);
  if (!with_time) return lc;
  layer_kernels(c, s, b, p.flash_attention, splits_backward(p.schedule), cp_nodes, lc);
  layer_tp_comm(c, s, b, tp_nodes, lc);
  lc.fetch_s = fetch.time_s;
  lc.fetch_on_h2d = fetch.on_h2d;
  const GradSyncCost sync = grad_sync_cost(c, s, params, dp_nodes);
  (sync.per_microbatch ? lc.grad_rs_mb_s : lc.grad_reduce_s) = sync.reduce_s;
  lc.gather_s = sync.gather_s;
  if (s.offload_activations) {
    lc.act_d2h_s = c.fabric().copy_cost(lc.fwd_act).time_s();
    lc.act_h2d_s = lc.act_d2h_s;
  }
  return lc;
}

EndStates end_states(const CostModel& c, const LayerStrategy& es, bool embedding, bool head,
                     const Geometry& geo, int stage, bool with_time) {
  EndStates x;
  x.params = end_parameters_per_rank(c.model(), es.tp, embedding, head);
  if (x.params == 0) return x;
  x.states.add(es, x.params, c.dtype(), c.framework().grad_buffer_bytes);
  if (with_time && es.dp_cp() > 1)
    x.sync = grad_sync_cost(c, es, x.params, geo.dp_nodes(stage, es.tp));
  return x;
}

double tied_embedding_reduce_s(const CostModel& c, int embedding_tp, int pp, const Geometry& geo) {
  const ModelSpec& m = c.model();
  if (pp == 1 || !m.tied_embeddings) return 0;
  const int64_t bytes = tied_embedding_reduce_bytes(m, embedding_tp, c.dtype());
  return c.fabric()
      .collective_cost(Collective::all_reduce, bytes, 2, geo.same_node(0, pp - 1) ? 1 : 2)
      .time_s();
}

EmbeddingHeadCost embedding_head_cost(const CostModel& c, const LayerStrategy& es, int b, int tpn,
                                      int dpn, bool with_time) {
  const ModelSpec& m = c.model();
  auto coll = [&](Collective k, int64_t bytes) {
    return c.fabric().collective_cost(k, bytes, es.tp, tpn).time_s();
  };
  EmbeddingHeadCost x;
  x.emb_fetch = fetch_cost(c, es, embedding_parameters_per_rank(m, es.tp), dpn, with_time);
  x.head_fetch = fetch_cost(c, es, head_compute_parameters_per_rank(m, es.tp), dpn, with_time);
  const Dtype dt = c.dtype();
  const HeadOps head = head_ops(m, es.tp, b, dt, es.cp);
  x.logits_bytes = head.logits_bytes;
  x.loss_transient_bytes = c.framework().loss_transient_bytes(head.logits_bytes);
  if (!with_time) return x;
  const int64_t act = token_stream_bytes(m, b, dt, es.cp);
  x.emb_fwd_s = c.compute_time_s(embedding_op(m, b, Phase::forward, dt, es.cp));
  x.emb_bwd_s = c.compute_time_s(embedding_op(m, b, Phase::backward, dt, es.cp));
  x.head_fwd_s = c.compute_time_s(head.forward);
  x.head_bwd_s = c.compute_time_s(head.backward);
  if (es.tp == 1) return x;
  // The collectives tp_comm puts around the embedding and the head, in the Program's order.
  auto around = [&](Block blk, Phase ph) {
    const TpComm t = tp_comm(es, blk, ph);
    return std::pair(t.gathers == 0 ? 0.0 : t.gathers * coll(Collective::all_gather, act),
                     t.after == Collective::none ? 0.0 : coll(t.after, act));
  };
  const auto [emb_fwd_gather, emb_fwd_reduce] = around(Block::embedding, Phase::forward);
  const auto [emb_bwd_gather, emb_bwd_reduce] = around(Block::embedding, Phase::backward);
  x.emb_tp_s = emb_fwd_gather + emb_fwd_reduce + emb_bwd_gather + emb_bwd_reduce;
  const auto [head_fwd_gather, head_fwd_reduce] = around(Block::head, Phase::forward);
  const auto [head_bwd_gather, head_bwd_reduce] = around(Block::head, Phase::backward);
  x.head_tp_s = head_fwd_gather + head_fwd_reduce;
  // Vocabulary-parallel cross entropy: the max, then sum-exp and target logit per token.
  x.head_tp_s += coll(Collective::all_reduce, head.loss_max_bytes) +
                 coll(Collective::all_reduce, head.loss_sum_bytes);
  x.head_tp_bwd_s = head_bwd_gather + head_bwd_reduce;
  x.head_tp_s += x.head_tp_bwd_s;
  return x;
}

}  // namespace stratagem::cost_detail
