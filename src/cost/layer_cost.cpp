#include "src/cost/layer_cost.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "stratagem/workload.hpp"

namespace stratagem::cost_detail {
namespace {
int span(int64_t g, int64_t first, int64_t count) {
  return int((first + count - 1) / g - first / g + 1);
}
}  // namespace

int Geometry::tp_nodes(int s, int tp) const {
  const int64_t dp = D / tp;
  int worst = 1;
  for (int64_t k = 0; k < std::min<int64_t>(dp, g); ++k)
    worst = std::max(worst, span(g, s * D + k * tp, tp));
  return worst;
}

int Geometry::dp_nodes(int s, int tp) const {
  const int64_t dp = D / tp;
  int worst = 1;
  for (int64_t j : {int64_t(0), int64_t(tp - 1)}) {
    const int64_t first = s * D + j;
    worst = std::max(worst, int((first + (dp - 1) * tp) / g - first / g + 1));
  }
  return worst;
}

bool Geometry::same_node(int s, int t) const {
  return (s * D) / g == (t * D) / g && (s * D + D - 1) / g == (t * D + D - 1) / g;
}

int64_t optimizer_bytes_per_param(Dtype d) {
  return d == Dtype::fp32 ? 8 : 12;
}

void ModelStates::add(const LayerStrategy& s, int64_t params, int elem_bytes,
                      int64_t opt_bytes_per_param) {
  const int64_t shard = (params + s.dp - 1) / s.dp;
  weights += s.offload_params ? 0 : (s.zero == 3 ? shard : params) * elem_bytes;
  grads += (s.zero >= 2 ? shard : params) * elem_bytes;
  const int64_t n = s.zero >= 1 ? shard : params;
  optimizer += s.offload_optimizer ? 0 : n * opt_bytes_per_param;
  (s.offload_optimizer ? host_opt_params : device_opt_params) += n;
}

FetchCost fetch_cost(const CostModel& c, const LayerStrategy& s, int64_t params, int dp_nodes,
                     bool with_time) {
  FetchCost f;
  const bool gathers = s.zero == 3 && s.dp > 1;
  if (!gathers && !s.offload_params) return f;
  const int64_t pbytes = params * dtype_bytes(c.plan().dtype);
  f.bytes = pbytes;
  if (!with_time) return f;
  if (gathers) {
    f.time_s = c.collective_cost(Collective::all_gather, pbytes, s.dp, dp_nodes).time_s();
    // ZeRO-3 with offloaded parameters: the shard crosses PCIe before each gather.
    if (s.offload_params) f.time_s += c.copy_cost((pbytes + s.dp - 1) / s.dp).time_s();
  } else {
    f.time_s = c.copy_cost(pbytes).time_s();
    f.on_h2d = true;
  }
  return f;
}

LayerCost layer_cost(const CostModel& c, const LayerStrategy& s, int b, int tp_nodes, int dp_nodes,
                     bool with_time) {
  const ModelSpec& m = c.model();
  const Plan& p = c.plan();
  const int e = dtype_bytes(p.dtype);
  const bool flash = p.flash_attention;
  LayerCost lc;
  const int64_t params = block_parameters_per_rank(m, s.tp, Block::attention) +
                         block_parameters_per_rank(m, s.tp, Block::mlp);
  lc.states.add(s, params, e, optimizer_bytes_per_param(p.dtype));
  // Activations, tensor by tensor as the Program allocates them.
  auto saved = [&](Block blk, Recompute rc, bool fl) {
    return kept_activation_bytes(m, s, blk, b, rc, fl, p.dtype);
  };
  const int64_t sa = saved(Block::attention, s.recompute, flash);
  const int64_t sm = saved(Block::mlp, s.recompute, flash);
  const FetchCost fetch = fetch_cost(c, s, params, dp_nodes, with_time);
  const int64_t fetch_bytes = fetch.bytes;
  lc.kept = s.offload_activations ? 0 : sa + sm;
  lc.workspace = layer_workspace_bytes(m, s, b, p.dtype);
  lc.fwd_act = sa + sm;
  lc.fwd_buf = fetch_bytes;
  // Backward of the layer: the mlp backward runs with both blocks' saved tensors (and full
  // recompute's rebuilt ones); the attention backward with the attention's only.
  int64_t during_mlp = sa + sm, during_attn = sa;
  if (s.recompute == Recompute::full) {
    const int64_t re_a = saved(Block::attention, Recompute::none, flash) - sa;
    during_mlp += re_a + saved(Block::mlp, Recompute::none, flash);
    during_attn += re_a;
  } else if (s.recompute == Recompute::selective && !flash) {
    during_attn += saved(Block::attention, Recompute::none, false) - sa;  // probabilities
  }
  lc.bwd_mlp_act = during_mlp;
  lc.bwd_attn_act = during_attn;
  lc.bwd_buf = fetch_bytes;
  if (!with_time) return lc;

  auto coll = [&](Collective k, int64_t bytes, int size, int nodes) {
    return c.collective_cost(k, bytes, size, nodes).time_s();
  };
  lc.fwd_s = c.block_time_s(forward_work(m, s, Block::attention, b, flash)) +
             c.block_time_s(forward_work(m, s, Block::mlp, b, flash));
  lc.bwd_s =
      c.backward_block_time_s(s, Block::attention, b) + c.backward_block_time_s(s, Block::mlp, b);
  if (s.recompute == Recompute::full) {
    lc.rec_s = lc.fwd_s;
  } else if (s.recompute == Recompute::selective && !flash) {
    BlockWork core = attention_core_work(m, s, b, false);
    core.attention_flops /= 2;  // QK^T only: AV's output is saved as the projection input
    lc.rec_s = c.block_time_s(core);
  }
  if (s.tp > 1) {
    const int64_t msg = int64_t(e) * b * m.seq_len * m.hidden;
    // Under sequence parallelism backward gathers twice (output gradient and sharded input).
    const double gather = coll(Collective::all_gather, msg, s.tp, tp_nodes);
    const double per_block = s.sequence_parallel
                                 ? gather + coll(Collective::reduce_scatter, msg, s.tp, tp_nodes)
                                 : coll(Collective::all_reduce, msg, s.tp, tp_nodes);
    if (c.framework().tp_comm_overlap && s.sequence_parallel) {
      // Each collective beside its GEMM (CostModel::tp_exposed_s), as the simulator costs it.
      const double rs = coll(Collective::reduce_scatter, msg, s.tp, tp_nodes);
      auto phase = [&](Phase ph) {
        double t = 0;
        for (Block blk : {Block::attention, Block::mlp}) {
          const int gathers = ph == Phase::backward ? 2 : 1;
          t += gathers * c.tp_exposed_s(gather, Collective::all_gather, s, blk, ph, b) +
               c.tp_exposed_s(rs, Collective::reduce_scatter, s, blk, ph, b);
        }
        return t;
      };
      lc.tp_fwd_s = phase(Phase::forward);
      lc.tp_bwd_s = phase(Phase::backward);
      lc.tp_rec_s = s.recompute == Recompute::full ? phase(Phase::recompute) : 0;
    } else {
      lc.tp_fwd_s = 2 * per_block;
      lc.tp_bwd_s = 2 * (per_block + (s.sequence_parallel ? gather : 0));
      lc.tp_rec_s = s.recompute == Recompute::full ? 2 * per_block : 0;
    }
    // (The once-per-iteration sum of the norms' gradients under sequence parallelism, a few
    // KiB, is left to the simulator.)
  }
  const int64_t pbytes = params * e;
  const int64_t gbytes = params * c.grad_reduce_bytes();  // gradients on the wire
  lc.fetch_s = fetch.time_s;
  lc.fetch_on_h2d = fetch.on_h2d;
  if (s.dp > 1) {
    if (s.zero >= 2) lc.grad_rs_mb_s = coll(Collective::reduce_scatter, gbytes, s.dp, dp_nodes);
    if (s.zero == 0) lc.grad_reduce_s = coll(Collective::all_reduce, gbytes, s.dp, dp_nodes);
    if (s.zero == 1) lc.grad_reduce_s = coll(Collective::reduce_scatter, gbytes, s.dp, dp_nodes);
    if (s.zero == 1 || s.zero == 2)
      lc.gather_s = coll(Collective::all_gather, pbytes, s.dp, dp_nodes);
  }
  if (s.offload_activations) {
    lc.act_d2h_s = c.copy_cost(sa + sm).time_s();
    lc.act_h2d_s = lc.act_d2h_s;
  }
  return lc;
}

EmbeddingHeadCost embedding_head_cost(const CostModel& c, const LayerStrategy& es, int b, int tpn,
                                      int dpn, bool with_time) {
  // head_work shards the vocabulary by the cost model's plan: it must be this strategy's.
  if (c.plan().embedding.tp != es.tp)
    throw std::logic_error("embedding_head_cost: the cost model's plan has embedding tp " +
                           std::to_string(c.plan().embedding.tp) + ", the strategy " +
                           std::to_string(es.tp));
  const ModelSpec& m = c.model();
  const int e = dtype_bytes(c.plan().dtype);
  auto coll = [&](Collective k, int64_t bytes) {
    return c.collective_cost(k, bytes, es.tp, tpn).time_s();
  };
  EmbeddingHeadCost x;
  x.emb_fetch = fetch_cost(c, es, embedding_parameters_per_rank(m, es.tp), dpn, with_time);
  x.head_fetch = fetch_cost(c, es, head_compute_parameters_per_rank(m, es.tp), dpn, with_time);
  const double T = double(b) * m.seq_len;
  x.logits_bytes = static_cast<int64_t>(4.0 * T * vocab_rows_per_rank(m, es.tp));
  if (!with_time) return x;
  const int64_t act = int64_t(e) * b * m.seq_len * m.hidden;
  const double launch = c.cluster().gpu.kernel_launch_s;
  x.emb_fwd_s = c.elementwise_time_s(2.0 * act) + launch;
  x.emb_bwd_s = c.elementwise_time_s(2.0 * act) + 2 * launch;
  const Collective input_reduce =
      es.sequence_parallel ? Collective::reduce_scatter : Collective::all_reduce;
  if (es.tp > 1) x.emb_tp_s = coll(input_reduce, act);
  // Under sequence parallelism the lookup's backward gathers the sharded gradient.
  if (es.tp > 1 && es.sequence_parallel) x.emb_tp_s += coll(Collective::all_gather, act);
  const double ew = 2.0 * x.logits_bytes + 2.0 * e * T * m.hidden;
  x.head_fwd_s = c.block_time_s(c.head_work(Phase::forward, b, ew));
  x.head_bwd_s = c.block_time_s(c.head_work(Phase::backward, b, ew));
  if (es.tp > 1) {
    if (es.sequence_parallel) x.head_tp_s += coll(Collective::all_gather, act);
    // Vocabulary-parallel cross entropy: the max, then sum-exp and target logit per token.
    x.head_tp_s += coll(Collective::all_reduce, static_cast<int64_t>(4 * T)) +
                   coll(Collective::all_reduce, static_cast<int64_t>(8 * T));
    x.head_tp_bwd_s = coll(input_reduce, act);
    x.head_tp_s += x.head_tp_bwd_s;
  }
  return x;
}

}  // namespace stratagem::cost_detail
