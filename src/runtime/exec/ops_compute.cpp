// What each compute op of the Program does on this rank: the Transformer's pieces
// (transformer.hpp) on the micro-batch's tensors, which live in the Program's buffers.
#include "src/runtime/exec/ops_compute.hpp"

#include <cmath>
#include <vector>

#include "src/runtime/exec/dispatch.hpp"
#include "src/runtime/exec/ops_comm.hpp"
#include "src/runtime/exec/ops_cp.hpp"
#include "src/runtime/exec/ops_moe.hpp"
#include "src/runtime/exec/rank_context.hpp"
#include "stratagem/error.hpp"

namespace stratagem::exec {

Tensor ComputeOps::materialize(Flow& f, int buf, Shape shape) {
  if (!f.defined()) throw std::logic_error("executor: a block input is missing");
  if (f.producer >= 0) dispatcher_.complete(f.producer);
  Tensor x = rank_.buffers.pool.take(buf, shape);
  if (f.add.defined())
    rank_.backend.residual_forward(x, f.base.view(shape), f.add.view(shape));
  else
    rank_.backend.copy(x, f.base.view(shape));
  f = Flow{};  // consumed: its scratch goes now
  return x;
}

// A forward keeps the attention probabilities for its backward unless the layer recomputes
// them (or flash attention never forms them); a recompute rebuilds them.
bool ComputeOps::attention_keeps_probs(const Op& op) const {
  if (rank_.sequence.split()) return false;  // blocks of the sequence: never whole rows of scores
  return !op.flash_attention && (op.phase == Phase::recompute || op.recompute == Recompute::none);
}

// The block's input and its normalization: on the whole stream, or on this rank's token shard
// before the all-gather under sequence parallelism (called by that gather).
void ComputeOps::block_input(const Op& op, Micro& m, LayerState& ls) {
  const int l = op.layer;
  const bool rec = op.phase == Phase::recompute, attn = op.block == Block::attention;
  const bool full = op.recompute == Recompute::full;
  const LayerShare& sh = rank_.share(l);
  const Shape s = rank_.stream_shape(l);
  Tensor x;
  int acts = -1;
  if (attn) {
    if (rec) {
      x = ls.x_in;  // the saved layer input
    } else {
      comm_.fit_flow(m.fwd,
                     l);  // this rank's samples, where the previous layer's dp was smaller
      x = ls.x_in = materialize(
          m.fwd, rank_.buffers.of(Block::attention, Phase::forward, l, op.microbatch), s);
    }
    acts = rec ? rank_.buffers.of(Block::attention, Phase::recompute, l, op.microbatch)
               : (full ? -1 : rank_.buffers.of(Block::attention, Phase::forward, l, op.microbatch));
  } else {
    acts = rec ? rank_.buffers.of(Block::mlp, Phase::recompute, l, op.microbatch)
               : (full ? -1 : rank_.buffers.of(Block::mlp, Phase::forward, l, op.microbatch));
    x = ls.x_mid = materialize(rec ? m.rec : m.fwd, acts, s);
  }
  // A split backward's W reads the first GEMM's input from a buffer of its own (under sp it
  // takes the gathered one from B instead).
  const int kept = sh.sequence_parallel ? -1 : weight_kept_buffer(op);
  Tensor out = rank_.buffers.pool.take(kept >= 0 ? kept : acts, s);
  Tensor mean = rank_.whole.norm == Norm::layernorm
                    ? rank_.buffers.pool.take(acts, Shape{sh.shard_tokens})
                    : Tensor{};
  Tensor rstd = rank_.buffers.pool.take(acts, Shape{sh.shard_tokens});
  const LayerWeights& w = rank_.shards.model.weights.layer(l);
  if (attn) {
    norm_forward(rank_.backend, sh.local, x, w.attn_norm_w, w.attn_norm_b, out, mean, rstd);
    ls.attn.norm_out = out, ls.attn.norm_mean = mean, ls.attn.norm_rstd = rstd;
  } else {
    norm_forward(rank_.backend, sh.local, x, w.mlp_norm_w, w.mlp_norm_b, out, mean, rstd);
    ls.mlp.norm_out = out, ls.mlp.norm_mean = mean, ls.mlp.norm_rstd = rstd;
  }
}

void ComputeOps::block_forward(const Op& op) {
  Micro& m = rank_.mb(op.microbatch);
  const int l = op.layer;
  LayerState& ls = m.layers[l];
  const Recompute rc = op.recompute;
  const bool rec = op.phase == Phase::recompute, attn = op.block == Block::attention;
  const LayerShare& sh = rank_.share(l);
  const TransformerConfig& lc = sh.local;
  const int b = sh.samples;
  if (rec && attn && rc == Recompute::selective && rank_.sequence.split()) return;  // none kept
  if (rec && attn && rc == Recompute::selective) {
    // Rebuild the attention probabilities from the saved q, k (selective recompute).
    Tensor att = rank_.buffers.pool.take(
        rank_.buffers.of(Block::attention, Phase::recompute, l, op.microbatch),
        Shape{b, lc.heads, rank_.T, rank_.T});
    attention_recompute(rank_.backend, lc, ls.attn, att);
    return;
  }
  if (op.part == AttentionPart::core) {
    cp_.core(op);
    return;
  }
  const Shape full_s = rank_.full_shape(l);
  const bool bias = sh.tp_index == 0;  // the row-parallel bias counts once in the group's sum
  const LayerWeights& w = rank_.shards.model.weights.layer(l);
  Tensor y;
  if (op.part == AttentionPart::post) {  // cp: the core's output rows are in place
    cp_.finish(op);
    y = rank_.buffers.pool.scratch(full_s);
    attention_proj_forward(rank_.backend, w, y, ls.attn, bias);
  } else {
    if (!sh.sequence_parallel) block_input(op, m, ls);
    int acts = rec ? rank_.buffers.of(op.block, Phase::recompute, l, op.microbatch)
                   : (rc == Recompute::full
                          ? -1
                          : rank_.buffers.of(op.block, Phase::forward, l, op.microbatch));
    // A cp forward that keeps nothing holds its tensors in the pass's working buffer
    // (iteration.hpp's CpComm), over the pass's ops.
    if (acts < 0 && op.part == AttentionPart::pre) acts = cp_.work_buffer(op);
    const Tensor& norm_out = attn ? ls.attn.norm_out : ls.mlp.norm_out;
    Tensor xn = sh.sequence_parallel ? m.gathered.view(full_s) : norm_out.view(full_s);
    m.gathered = Tensor{};
    if (attn) {
      AttentionActs& a = ls.attn;
      a.qkv = rank_.buffers.pool.take(acts, Shape{b, rank_.T, lc.qkv_width()});
      a.att = attention_keeps_probs(op)
                  ? rank_.buffers.pool.take(acts, Shape{b, lc.heads, rank_.T, rank_.T})
                  : Tensor{};
      a.lse = rank_.buffers.pool.take(acts, Shape{b, lc.heads, rank_.T});
      const int kept = weight_kept_buffer(op);  // the projection's input, for W
      a.out = rank_.buffers.pool.take(kept >= 0 ? kept : acts, Shape{b, rank_.T, lc.attn_width()});
      if (op.part == AttentionPart::pre) {  // cp: the core and its transfers are ops of their own
        // a2a: the core's output over the head group, for the backward (not under full
        // recompute's forward: the recompute's serves it).
        if (rank_.sequence.kind == CpKind::a2a && acts >= 0)
          a.out_heads = rank_.buffers.pool.take(acts, a.out.shape);
        attention_qkv_forward(rank_.backend, lc, w, xn, a, rank_.sequence);
        cp_.run_of(op);
        return;
      }
      y = rank_.buffers.pool.scratch(full_s);
      attention_forward(rank_.backend, lc, w, xn, y, a, bias);
    } else {
      MlpActs& a = ls.mlp;
      a.fc1_out = rank_.buffers.pool.take(acts, Shape{b, rank_.T, lc.fc1_width()});
      const int kept = weight_kept_buffer(op);  // fc2's input, for W
      a.act_out =
          rank_.buffers.pool.take(kept >= 0 ? kept : acts, Shape{b, rank_.T, lc.ffn_hidden});
      y = rank_.buffers.pool.scratch(full_s);
      mlp_forward(rank_.backend, lc, w, xn, y, a, bias);
    }
  }
  if (!rec && rc == Recompute::full) {  // under full recompute forward keeps only the layer input
    if (attn)
      ls.attn = AttentionActs{};
    else
      ls.mlp = MlpActs{};
  }
  Flow& flow = rec ? m.rec : m.fwd;
  const Tensor& base = attn ? ls.x_in : ls.x_mid;
  if (sh.tp == 1) {
    flow = Flow{base, y, -1};
    drop_unsaved_block_input(op, ls);
  } else {
    m.partial = y;  // the tp reduction that follows completes the flow
  }
}

void ComputeOps::drop_unsaved_block_input(const Op& op, LayerState& ls) {
  // Under full recompute forward keeps only the layer input: the mlp's input lives on in the
  // residual flow until the next block takes it, and backward's recompute rebuilds it.
  if (op.block == Block::mlp && op.phase == Phase::forward && op.recompute == Recompute::full)
    ls.x_mid = Tensor{};
}

void ComputeOps::block_backward(const Op& op) {
  Micro& m = rank_.mb(op.microbatch);
  const int l = op.layer;
  if (op.part == AttentionPart::core) {
    cp_.core(op);
    return;
  }
  LayerState& ls = m.layers.at(l);
  const LayerShare& sh = rank_.share(l);
  const Shape full_s = rank_.full_shape(l);
  const bool attn = op.block == Block::attention;
  const LayerWeights& w = rank_.shards.model.weights.layer(l);
  // A split backward's B leaves the GEMMs' weight gradients to W (none bound here).
  LayerWeights no_grads;
  LayerWeights& g = op.wgrad_deferred ? no_grads : rank_.shards.model.grad_weights.layer(l);
  // The block's output gradient is read first (cp: by post, the first part), its normalized
  // input last (cp: by pre).
  if (op.part != AttentionPart::pre) {
    stage_gradients(l);
    comm_.fit_grad(m, l);  // this rank's samples, where the next layer's dp was smaller
  }
  auto output_grad = [&] {
    return sh.sequence_parallel ? m.gathered_dy.view(full_s) : m.grad.view(full_s);
  };
  if (op.part == AttentionPart::post) {
    Tensor dy = output_grad();
    Tensor d_attn = attention_grads(sh.local, *sh.ws, sh.samples, rank_.T).d_attn;
    attention_proj_backward(rank_.backend, w, g, dy, ls.attn, d_attn);
    m.gathered_dy = Tensor{};
    cp_.run_of(op);
    return;
  }
  const Tensor& norm_out = attn ? ls.attn.norm_out : ls.mlp.norm_out;
  Tensor xn = sh.sequence_parallel ? m.gathered.view(full_s) : norm_out.view(full_s);
  Tensor d_xn = rank_.buffers.pool.scratch(full_s);
  if (op.part == AttentionPart::pre) {
    cp_.finish(op);
    Tensor d_qkv = attention_grads(sh.local, *sh.ws, sh.samples, rank_.T).d_qkv;
    attention_qkv_backward(rank_.backend, sh.local, w, g, d_qkv, xn, d_xn, rank_.sequence);
  } else if (attn) {
    attention_backward(rank_.backend, sh.local, w, g, output_grad(), xn, d_xn, ls.attn, *sh.ws);
  } else {
    mlp_backward(rank_.backend, sh.local, w, g, output_grad(), xn, d_xn, ls.mlp, *sh.ws);
  }
  if (op.wgrad_deferred) keep_for_weight_grad(op, xn, output_grad());
  m.gathered = m.gathered_dy = Tensor{};
  if (sh.tp == 1)
    finish_block_backward(l, op.block, m, d_xn);
  else
    m.partial = d_xn;
}

// The norm's backward on the reduced gradient of its output: accumulates into the stream's
// gradient, which so also takes the residual branch.
void ComputeOps::finish_block_backward(int l, Block b, Micro& m, const Tensor& d_xn) {
  LayerState& ls = m.layers.at(l);
  const LayerWeights& w = rank_.shards.model.weights.layer(l);
  LayerWeights& g = rank_.shards.model.grad_weights.layer(l);
  const TransformerConfig& lc = rank_.share(l).local;
  const Shape s = rank_.stream_shape(l);
  Tensor dx = m.grad.view(s);
  Tensor dn = d_xn.view(s);
  if (b == Block::attention) {
    norm_backward(rank_.backend, lc, dx, g.attn_norm_w, g.attn_norm_b, dn, ls.x_in, w.attn_norm_w,
                  ls.attn.norm_mean, ls.attn.norm_rstd);
    m.layers.erase(l);  // the layer's backward is done
  } else {
    norm_backward(rank_.backend, lc, dx, g.mlp_norm_w, g.mlp_norm_b, dn, ls.x_mid, w.mlp_norm_w,
                  ls.mlp.norm_mean, ls.mlp.norm_rstd);
  }
}

void ComputeOps::embedding_forward(const Op& op) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  Micro& m = rank_.mb(op.microbatch);
  m.embedded = true;
  Tensor x = rank_.buffers.pool.scratch(rank_.full_shape());
  stratagem::embedding_forward(rank_.backend, sh.local, rank_.shards.model.weights, m.ids, x,
                               sh.tp_index == 0, rank_.sequence);
  if (sh.tp == 1)
    m.fwd = Flow{x, {}, -1};
  else
    m.partial = x;  // vocabulary shards' partial rows: summed by the collective that follows
}

void ComputeOps::embedding_backward(const Op& op) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  Micro& m = rank_.mb(op.microbatch);
  stage_gradients(-1);
  comm_.fit_grad(m, -1);
  Tensor dx = sh.sequence_parallel ? m.gathered_dy.view(rank_.full_shape())
                                   : m.grad.view(rank_.full_shape());
  stratagem::embedding_backward(rank_.backend, sh.local, rank_.shards.model.grad_weights, m.ids, dx,
                                rank_.sequence);
  rank_.current_step.micro.erase(op.microbatch);
}

// The final norm's input and output: whole, or this rank's token shard before the gather.
void ComputeOps::norm_head_input(Micro& m) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  const Shape s = rank_.stream_shape();
  comm_.fit_flow(m.fwd, -1);
  m.x_final = materialize(m.fwd, -1, s);
  m.xn = rank_.buffers.pool.scratch(s);
  m.head_mean = rank_.whole.norm == Norm::layernorm
                    ? rank_.buffers.pool.scratch(Shape{sh.shard_tokens})
                    : Tensor{};
  m.head_rstd = rank_.buffers.pool.scratch(Shape{sh.shard_tokens});
  const ModelWeights& w = rank_.shards.model.weights;
  norm_forward(rank_.backend, sh.local, m.x_final, w.norm_f_w, w.norm_f_b, m.xn, m.head_mean,
               m.head_rstd);
}

void ComputeOps::head_forward(const Op& op) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  Micro& m = rank_.mb(op.microbatch);
  if (!sh.sequence_parallel) norm_head_input(m);
  // Under sequence parallelism the token shard went into the gather: only the whole is read
  // from here on.
  if (sh.sequence_parallel)
    m.xn_whole = m.gathered, m.gathered = m.xn = Tensor{};
  else
    m.xn_whole = m.xn;
  m.logits =
      rank_.buffers.pool.take(rank_.buffers.of(Block::head, Phase::forward, -1, op.microbatch),
                              Shape{sh.tokens, sh.local.vocab_rows});
  lm_head_forward(rank_.backend, rank_.shards.model.weights,
                  m.xn_whole.view(Shape{sh.tokens, rank_.whole.hidden}), m.logits);
  m.ce_max = rank_.buffers.pool.scratch(Shape{sh.tokens});
  rank_.backend.crossentropy_row_max(m.ce_max, m.logits, sh.local.vocab_valid(sh.tp_index));
  if (sh.tp == 1) {
    head_loss_sums(m);
    head_loss(m);
  }  // else: max all-reduce, then sums all-reduce (ops_comm.cpp)
}

void ComputeOps::head_loss_sums(Micro& m) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  m.ce_sums = rank_.buffers.pool.scratch(Shape{sh.tokens, 2});
  rank_.backend.crossentropy_sums(m.ce_sums, m.logits, m.ce_max, m.targets,
                                  sh.local.vocab_begin(sh.tp_index),
                                  sh.local.vocab_valid(sh.tp_index));
}

void ComputeOps::head_loss(Micro& m) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  if (sh.tp_index != 0) return;            // every tp rank holds the same reduced statistics
  std::vector<float> mx(static_cast<size_t>(sh.tokens)), sums(static_cast<size_t>(2 * sh.tokens));
  rank_.backend.download(mx.data(), m.ce_max);
  rank_.backend.download(sums.data(), m.ce_sums);
  double total = 0;
  for (int64_t i = 0; i < sh.tokens; ++i)
    total += std::log(double(sums[2 * i])) + mx[i] - sums[2 * i + 1];
  rank_.current_step.loss_sum += total;
}

void ComputeOps::head_backward(const Op& op) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  Micro& m = rank_.mb(op.microbatch);
  stage_gradients(-1);
  // Gradient of the mean loss over the global batch's tokens (a cp group's ranks each hold
  // N of a sample's).
  const float scale =
      1.0f / float(double(rank_.program.num_microbatches) * sh.dp * sh.cp * sh.tokens);
  rank_.backend.crossentropy_shard_backward(m.logits, m.logits, m.ce_max, m.ce_sums, m.targets,
                                            sh.local.vocab_begin(sh.tp_index),
                                            sh.local.vocab_valid(sh.tp_index), scale);
  Tensor d_xn = rank_.buffers.pool.scratch(Shape{sh.tokens, rank_.whole.hidden});
  lm_head_backward(rank_.backend, rank_.shards.model.weights, rank_.shards.model.grad_weights,
                   m.logits, m.xn_whole.view(Shape{sh.tokens, rank_.whole.hidden}), d_xn);
  // The norm's backward reads its input and statistics, not its output: the output goes here.
  m.logits = m.ce_max = m.ce_sums = m.xn_whole = m.xn = Tensor{};
  if (sh.tp == 1)
    finish_head_backward(m, d_xn);
  else
    m.partial = d_xn;
}

void ComputeOps::finish_head_backward(Micro& m, const Tensor& d_xn) {
  const LayerShare& sh = rank_.share(-1);  // the embedding and head's
  m.grad = rank_.buffers.pool.scratch(rank_.stream_shape());
  m.grad_producer = -1;
  rank_.backend.fill(m.grad, 0.0f);
  ModelWeights& g = rank_.shards.model.grad_weights;
  const ModelWeights& w = rank_.shards.model.weights;
  norm_backward(rank_.backend, sh.local, m.grad, g.norm_f_w, g.norm_f_b,
                d_xn.view(rank_.stream_shape()), m.x_final, w.norm_f_w, m.head_mean, m.head_rstd);
  m.x_final = m.xn = m.head_mean = m.head_rstd = Tensor{};
}

void ComputeOps::stage_gradients(int layer) {
  if (!rank_.shards.sharding.of(layer).sharded_grads() || rank_.shards.staging.count(layer)) return;
  auto& bufs = rank_.shards.staging[layer];
  auto at = rank_.buffers.staging.find(layer);
  if (at == rank_.buffers.staging.end())
    throw std::logic_error("executor: no staging buffer in the Program for layer " +
                           std::to_string(layer));
  for (auto [a, b] : rank_.shards.sharding.of(layer).runs) {
    Tensor t = rank_.buffers.pool.take(at->second, Shape{b - a});
    rank_.backend.fill(t, 0.0f);
    bufs.push_back({a, t});
    for (const ParamInfo& e : rank_.shards.model.table.entries())
      if (e.offset >= a && e.offset + e.numel() <= b)
        // Non-owning: the staging goes with its reduce-scatter, not with these views.
        weight_field(rank_.shards.model.grad_weights, e.name) =
            Tensor{t.data + (e.offset - a), e.shape, nullptr};
  }
}

void ComputeOps::optimizer_step() {
  dispatcher_.complete_all();  // every gradient reduction of the step has landed
  if (!rank_.options.update) return;
  double sq = 0;
  for (auto [a, b] : rank_.shards.sharding.norm_runs)
    sq += rank_.backend.sum_squares(
        rank_.shards.model.grads.slice(rank_.shards.sharding.grads.local(a), Shape{b - a}));
  rank_.parallel.world().all_reduce_sum(&sq, 1);
  const double norm = std::sqrt(sq);
  rank_.current_step.result->grad_norm = static_cast<float>(norm);
  rank_.current_step.result->lr = rank_.options.schedule.at(rank_.current_step.index);
  // A non-finite norm (the same on every rank: it is all-reduced) leaves the weights and the
  // optimizer state as they were; the trainer decides whether to stop or go on.
  if (!std::isfinite(norm)) return;
  const float coef = clip_coefficient(norm, rank_.options.grad_clip);
  // The gradients of the elements whose state this rank holds (on the device, before any
  // copy down).
  if (coef != 1.0f)
    for (const FlatRun& r : rank_.shards.sharding.all_state) {
      Tensor g = rank_.shards.model.grads.slice(rank_.shards.sharding.grads.local(r.flat_begin),
                                                Shape{r.flat_end - r.flat_begin});
      rank_.backend.scale(g, coef);
    }
  if (rank_.offload.adamw) {  // the host_compute op updates, once the gradients are down
    rank_.offload.adamw->set_steps_taken(
        rank_.shards.adamw->steps_taken());  // (checkpoints count the device's)
    rank_.offload.update_pending = true;
    rank_.offload.lr = rank_.current_step.result->lr;
  }
  rank_.shards.adamw->step(rank_.backend, rank_.shards.adamw_runs, rank_.current_step.result->lr);
}

void ComputeOps::run(const Op& op) {
  switch (op.block) {
    case Block::optimizer:
      optimizer_step();
      return;
    case Block::embedding:
      op.phase == Phase::forward ? embedding_forward(op) : embedding_backward(op);
      return;
    case Block::attention:
    case Block::mlp:
      if (op.phase == Phase::weight_grad)
        block_weight_grad(op);
      else
        op.phase == Phase::backward ? block_backward(op) : block_forward(op);
      return;
    case Block::head:
      op.phase == Phase::forward ? head_forward(op) : head_backward(op);
      return;
    case Block::router:
    case Block::experts:
    case Block::combine:
      moe_.compute(op);
      return;
    default:
      throw NotSupported("compute op " + op_name(op) + " is not executed by the runtime yet");
  }
}

}  // namespace stratagem::exec
