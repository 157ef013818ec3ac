// What each compute op of the Program does on this rank: the Transformer's pieces
// (transformer.hpp) on the micro-batch's tensors, which live in the Program's buffers.
#include <cmath>
#include <vector>

#include "src/runtime/context_parallel.hpp"
#include "src/runtime/exec/impl.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

exec::Micro& Executor::Impl::mb(int m) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  auto [it, fresh] = current_step.micro.try_emplace(m);
  exec::Micro& s = it->second;
  if (fresh && (stage == 0 || stage == plan.pp - 1)) {
    // This rank's samples of micro-batch m, indexed globally so that any layout sees the same
    // global batch; under context parallelism, the rows of its two chunks of each.
    s.tokens.resize(size_t(sh.N));
    s.targets.resize(size_t(sh.N));
    const int whole_len = model_spec.seq_len;
    std::vector<int32_t> tokens(static_cast<size_t>(whole_len)),
        targets(static_cast<size_t>(whole_len));
    const std::vector<int64_t> rows = sequence.split()
                                          ? cp_positions(sequence.cp_rank, sequence.cp, whole_len)
                                          : std::vector<int64_t>{};
    for (int i = 0; i < sh.B; ++i) {
      const int64_t index = int64_t(m) * sh.B * sh.dp + int64_t(sh.dp_index) * sh.B + i;
      if (!sequence.split()) {
        samples.sample(current_step.index, index, T, s.tokens.data() + size_t(i) * T,
                       s.targets.data() + size_t(i) * T);
        continue;
      }
      samples.sample(current_step.index, index, whole_len, tokens.data(), targets.data());
      for (int t = 0; t < T; ++t) {
        s.tokens[size_t(i) * T + t] = tokens[size_t(rows[t])];
        s.targets[size_t(i) * T + t] = targets[size_t(rows[t])];
      }
    }
    const int64_t begin = sh.local.vocab_begin(sh.tp_index),
                  valid = sh.local.vocab_valid(sh.tp_index);
    s.ids.resize(s.tokens.size());
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= whole.vocab)
        throw InputError("token id " + std::to_string(s.tokens[i]) + " outside the vocabulary");
      const int64_t id = s.tokens[i] - begin;
      s.ids[i] = id >= 0 && id < valid ? static_cast<int32_t>(id) : -1;
    }
  }
  return s;
}

Tensor Executor::Impl::materialize(exec::Flow& f, int buf, Shape shape) {
  if (!f.defined()) throw std::logic_error("executor: a block input is missing");
  if (f.producer >= 0) complete(f.producer);
  Tensor x = buffers.pool.take(buf, shape);
  if (f.add.defined())
    backend.residual_forward(x, f.base.view(shape), f.add.view(shape));
  else
    backend.copy(x, f.base.view(shape));
  f = exec::Flow{};  // consumed: its scratch goes now
  return x;
}

// A forward keeps the attention probabilities for its backward unless the layer recomputes
// them (or flash attention never forms them); a recompute rebuilds them.
bool Executor::Impl::attention_keeps_probs(const Op& op) const {
  if (sequence.split()) return false;  // blocks of the sequence: never whole rows of scores
  return !op.flash_attention && (op.phase == Phase::recompute || op.recompute == Recompute::none);
}

// The block's input and its normalization: on the whole stream, or on this rank's token shard
// before the all-gather under sequence parallelism (called by that gather).
void Executor::Impl::block_input(const Op& op, exec::Micro& m, exec::LayerState& ls) {
  const int l = op.layer;
  const bool rec = op.phase == Phase::recompute, attn = op.block == Block::attention;
  const bool full = op.recompute == Recompute::full;
  const exec::LayerShare& sh = share(l);
  const Shape s = stream_shape(l);
  Tensor x;
  int acts = -1;
  if (attn) {
    if (rec) {
      x = ls.x_in;  // the saved layer input
    } else {
      fit_flow(m.fwd, l);  // this rank's samples, where the previous layer's dp was smaller
      x = ls.x_in =
          materialize(m.fwd, buffers.of(Block::attention, Phase::forward, l, op.microbatch), s);
    }
    acts = rec ? buffers.of(Block::attention, Phase::recompute, l, op.microbatch)
               : (full ? -1 : buffers.of(Block::attention, Phase::forward, l, op.microbatch));
  } else {
    acts = rec ? buffers.of(Block::mlp, Phase::recompute, l, op.microbatch)
               : (full ? -1 : buffers.of(Block::mlp, Phase::forward, l, op.microbatch));
    x = ls.x_mid = materialize(rec ? m.rec : m.fwd, acts, s);
  }
  Tensor out = buffers.pool.take(acts, s);
  Tensor mean = whole.norm == Norm::layernorm ? buffers.pool.take(acts, Shape{sh.Ns}) : Tensor{};
  Tensor rstd = buffers.pool.take(acts, Shape{sh.Ns});
  const LayerWeights& w = shards.model.weights.layer(l);
  if (attn) {
    norm_forward(backend, sh.local, x, w.attn_norm_w, w.attn_norm_b, out, mean, rstd);
    ls.attn.norm_out = out, ls.attn.norm_mean = mean, ls.attn.norm_rstd = rstd;
  } else {
    norm_forward(backend, sh.local, x, w.mlp_norm_w, w.mlp_norm_b, out, mean, rstd);
    ls.mlp.norm_out = out, ls.mlp.norm_mean = mean, ls.mlp.norm_rstd = rstd;
  }
}

void Executor::Impl::block_forward(const Op& op) {
  exec::Micro& m = mb(op.microbatch);
  const int l = op.layer;
  exec::LayerState& ls = m.layers[l];
  const Recompute rc = op.recompute;
  const bool rec = op.phase == Phase::recompute, attn = op.block == Block::attention;
  const exec::LayerShare& sh = share(l);
  const TransformerConfig& lc = sh.local;
  const int b = sh.B;
  if (rec && attn && rc == Recompute::selective && sequence.split()) return;  // none kept
  if (rec && attn && rc == Recompute::selective) {
    // Rebuild the attention probabilities from the saved q, k (selective recompute).
    Tensor att = buffers.pool.take(buffers.of(Block::attention, Phase::recompute, l, op.microbatch),
                                   Shape{b, lc.heads, T, T});
    attention_recompute(backend, lc, ls.attn, att);
    return;
  }
  if (op.part == AttentionPart::core) {
    cp_core(op);
    return;
  }
  const Shape full_s = full_shape(l);
  const bool bias = sh.tp_index == 0;  // the row-parallel bias counts once in the group's sum
  const LayerWeights& w = shards.model.weights.layer(l);
  Tensor y;
  if (op.part == AttentionPart::post) {  // cp: the core's output rows are in place
    cp_finish(op);
    y = buffers.pool.scratch(full_s);
    attention_proj_forward(backend, w, y, ls.attn, bias);
  } else {
    if (!sh.sequence_parallel) block_input(op, m, ls);
    int acts =
        rec ? buffers.of(op.block, Phase::recompute, l, op.microbatch)
            : (rc == Recompute::full ? -1 : buffers.of(op.block, Phase::forward, l, op.microbatch));
    // A cp forward that keeps nothing holds its tensors in the pass's working buffer
    // (iteration.hpp's CpComm), over the pass's ops.
    if (acts < 0 && op.part == AttentionPart::pre) acts = cp_work_buffer(op);
    const Tensor& norm_out = attn ? ls.attn.norm_out : ls.mlp.norm_out;
    Tensor xn = sh.sequence_parallel ? m.gathered.view(full_s) : norm_out.view(full_s);
    m.gathered = Tensor{};
    if (attn) {
      AttentionActs& a = ls.attn;
      a.qkv = buffers.pool.take(acts, Shape{b, T, lc.qkv_width()});
      a.att =
          attention_keeps_probs(op) ? buffers.pool.take(acts, Shape{b, lc.heads, T, T}) : Tensor{};
      a.lse = buffers.pool.take(acts, Shape{b, lc.heads, T});
      a.out = buffers.pool.take(acts, Shape{b, T, lc.attn_width()});
      if (op.part == AttentionPart::pre) {  // cp: the core and its transfers are ops of their own
        // a2a: the core's output over the head group, for the backward (not under full
        // recompute's forward: the recompute's serves it).
        if (sequence.kind == CpKind::a2a && acts >= 0)
          a.out_heads = buffers.pool.take(acts, a.out.shape);
        attention_qkv_forward(backend, lc, w, xn, a, sequence);
        cp_run(op);
        return;
      }
      y = buffers.pool.scratch(full_s);
      attention_forward(backend, lc, w, xn, y, a, bias);
    } else {
      MlpActs& a = ls.mlp;
      a.fc1_out = buffers.pool.take(acts, Shape{b, T, lc.fc1_width()});
      a.act_out = buffers.pool.take(acts, Shape{b, T, lc.ffn_hidden});
      y = buffers.pool.scratch(full_s);
      mlp_forward(backend, lc, w, xn, y, a, bias);
    }
  }
  if (!rec && rc == Recompute::full) {  // under full recompute forward keeps only the layer input
    if (attn)
      ls.attn = AttentionActs{};
    else
      ls.mlp = MlpActs{};
  }
  exec::Flow& flow = rec ? m.rec : m.fwd;
  const Tensor& base = attn ? ls.x_in : ls.x_mid;
  if (sh.tp == 1) {
    flow = exec::Flow{base, y, -1};
    drop_unsaved_block_input(op, ls);
  } else {
    m.partial = y;  // the tp reduction that follows completes the flow
  }
}

void Executor::Impl::drop_unsaved_block_input(const Op& op, exec::LayerState& ls) {
  // Under full recompute forward keeps only the layer input: the mlp's input lives on in the
  // residual flow until the next block takes it, and backward's recompute rebuilds it.
  if (op.block == Block::mlp && op.phase == Phase::forward && op.recompute == Recompute::full)
    ls.x_mid = Tensor{};
}

void Executor::Impl::block_backward(const Op& op) {
  exec::Micro& m = mb(op.microbatch);
  const int l = op.layer;
  if (op.part == AttentionPart::core) {
    cp_core(op);
    return;
  }
  exec::LayerState& ls = m.layers.at(l);
  const exec::LayerShare& sh = share(l);
  const Shape full_s = full_shape(l);
  const bool attn = op.block == Block::attention;
  const LayerWeights& w = shards.model.weights.layer(l);
  LayerWeights& g = shards.model.grad_weights.layer(l);
  // The block's output gradient is read first (cp: by post, the first part), its normalized
  // input last (cp: by pre).
  if (op.part != AttentionPart::pre) {
    stage_gradients(l);
    fit_grad(m, l);  // this rank's samples, where the next layer's dp was smaller
  }
  auto output_grad = [&] {
    return sh.sequence_parallel ? m.gathered_dy.view(full_s) : m.grad.view(full_s);
  };
  if (op.part == AttentionPart::post) {
    Tensor dy = output_grad();
    Tensor d_attn = attention_grads(sh.local, *sh.ws, sh.B, T).d_attn;
    attention_proj_backward(backend, w, g, dy, ls.attn, d_attn);
    m.gathered_dy = Tensor{};
    cp_run(op);
    return;
  }
  const Tensor& norm_out = attn ? ls.attn.norm_out : ls.mlp.norm_out;
  Tensor xn = sh.sequence_parallel ? m.gathered.view(full_s) : norm_out.view(full_s);
  Tensor d_xn = buffers.pool.scratch(full_s);
  if (op.part == AttentionPart::pre) {
    cp_finish(op);
    Tensor d_qkv = attention_grads(sh.local, *sh.ws, sh.B, T).d_qkv;
    attention_qkv_backward(backend, sh.local, w, g, d_qkv, xn, d_xn, sequence);
  } else if (attn) {
    attention_backward(backend, sh.local, w, g, output_grad(), xn, d_xn, ls.attn, *sh.ws);
  } else {
    mlp_backward(backend, sh.local, w, g, output_grad(), xn, d_xn, ls.mlp, *sh.ws);
  }
  m.gathered = m.gathered_dy = Tensor{};
  if (sh.tp == 1)
    finish_block_backward(l, op.block, m, d_xn);
  else
    m.partial = d_xn;
}

// The norm's backward on the reduced gradient of its output: accumulates into the stream's
// gradient, which so also takes the residual branch.
void Executor::Impl::finish_block_backward(int l, Block b, exec::Micro& m, const Tensor& d_xn) {
  exec::LayerState& ls = m.layers.at(l);
  const LayerWeights& w = shards.model.weights.layer(l);
  LayerWeights& g = shards.model.grad_weights.layer(l);
  const TransformerConfig& lc = share(l).local;
  const Shape s = stream_shape(l);
  Tensor dx = m.grad.view(s);
  Tensor dn = d_xn.view(s);
  if (b == Block::attention) {
    norm_backward(backend, lc, dx, g.attn_norm_w, g.attn_norm_b, dn, ls.x_in, w.attn_norm_w,
                  ls.attn.norm_mean, ls.attn.norm_rstd);
    m.layers.erase(l);  // the layer's backward is done
  } else {
    norm_backward(backend, lc, dx, g.mlp_norm_w, g.mlp_norm_b, dn, ls.x_mid, w.mlp_norm_w,
                  ls.mlp.norm_mean, ls.mlp.norm_rstd);
  }
}

void Executor::Impl::embedding_forward(const Op& op) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  exec::Micro& m = mb(op.microbatch);
  m.embedded = true;
  Tensor x = buffers.pool.scratch(full_shape());
  stratagem::embedding_forward(backend, sh.local, shards.model.weights, m.ids, x, sh.tp_index == 0,
                               sequence);
  if (sh.tp == 1)
    m.fwd = exec::Flow{x, {}, -1};
  else
    m.partial = x;  // vocabulary shards' partial rows: summed by the collective that follows
}

void Executor::Impl::embedding_backward(const Op& op) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  exec::Micro& m = mb(op.microbatch);
  stage_gradients(-1);
  fit_grad(m, -1);
  Tensor dx = sh.sequence_parallel ? m.gathered_dy.view(full_shape()) : m.grad.view(full_shape());
  stratagem::embedding_backward(backend, sh.local, shards.model.grad_weights, m.ids, dx, sequence);
  current_step.micro.erase(op.microbatch);
}

// The final norm's input and output: whole, or this rank's token shard before the gather.
void Executor::Impl::norm_head_input(exec::Micro& m) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  const Shape s = stream_shape();
  fit_flow(m.fwd, -1);
  m.x_final = materialize(m.fwd, -1, s);
  m.xn = buffers.pool.scratch(s);
  m.head_mean = whole.norm == Norm::layernorm ? buffers.pool.scratch(Shape{sh.Ns}) : Tensor{};
  m.head_rstd = buffers.pool.scratch(Shape{sh.Ns});
  const ModelWeights& w = shards.model.weights;
  norm_forward(backend, sh.local, m.x_final, w.norm_f_w, w.norm_f_b, m.xn, m.head_mean,
               m.head_rstd);
}

void Executor::Impl::head_forward(const Op& op) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  exec::Micro& m = mb(op.microbatch);
  if (!sh.sequence_parallel) norm_head_input(m);
  // Under sequence parallelism the token shard went into the gather: only the whole is read
  // from here on.
  if (sh.sequence_parallel)
    m.xn_whole = m.gathered, m.gathered = m.xn = Tensor{};
  else
    m.xn_whole = m.xn;
  m.logits = buffers.pool.take(buffers.of(Block::head, Phase::forward, -1, op.microbatch),
                               Shape{sh.N, sh.local.vocab_rows});
  lm_head_forward(backend, shards.model.weights, m.xn_whole.view(Shape{sh.N, whole.hidden}),
                  m.logits);
  m.ce_max = buffers.pool.scratch(Shape{sh.N});
  backend.crossentropy_row_max(m.ce_max, m.logits, sh.local.vocab_valid(sh.tp_index));
  if (sh.tp == 1) {
    head_loss_sums(m);
    head_loss(m);
  }  // else: max all-reduce, then sums all-reduce (ops_comm.cpp)
}

void Executor::Impl::head_loss_sums(exec::Micro& m) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  m.ce_sums = buffers.pool.scratch(Shape{sh.N, 2});
  backend.crossentropy_sums(m.ce_sums, m.logits, m.ce_max, m.targets,
                            sh.local.vocab_begin(sh.tp_index), sh.local.vocab_valid(sh.tp_index));
}

void Executor::Impl::head_loss(exec::Micro& m) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  if (sh.tp_index != 0) return;            // every tp rank holds the same reduced statistics
  std::vector<float> mx(static_cast<size_t>(sh.N)), sums(static_cast<size_t>(2 * sh.N));
  backend.download(mx.data(), m.ce_max);
  backend.download(sums.data(), m.ce_sums);
  double total = 0;
  for (int64_t i = 0; i < sh.N; ++i)
    total += std::log(double(sums[2 * i])) + mx[i] - sums[2 * i + 1];
  current_step.loss_sum += total;
}

void Executor::Impl::head_backward(const Op& op) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  exec::Micro& m = mb(op.microbatch);
  stage_gradients(-1);
  // Gradient of the mean loss over the global batch's tokens (a cp group's ranks each hold
  // N of a sample's).
  const float scale = 1.0f / float(double(program.num_microbatches) * sh.dp * sh.cp * sh.N);
  backend.crossentropy_shard_backward(m.logits, m.logits, m.ce_max, m.ce_sums, m.targets,
                                      sh.local.vocab_begin(sh.tp_index),
                                      sh.local.vocab_valid(sh.tp_index), scale);
  Tensor d_xn = buffers.pool.scratch(Shape{sh.N, whole.hidden});
  lm_head_backward(backend, shards.model.weights, shards.model.grad_weights, m.logits,
                   m.xn_whole.view(Shape{sh.N, whole.hidden}), d_xn);
  // The norm's backward reads its input and statistics, not its output: the output goes here.
  m.logits = m.ce_max = m.ce_sums = m.xn_whole = m.xn = Tensor{};
  if (sh.tp == 1)
    finish_head_backward(m, d_xn);
  else
    m.partial = d_xn;
}

void Executor::Impl::finish_head_backward(exec::Micro& m, const Tensor& d_xn) {
  const exec::LayerShare& sh = share(-1);  // the embedding and head's
  m.grad = buffers.pool.scratch(stream_shape());
  m.grad_producer = -1;
  backend.fill(m.grad, 0.0f);
  ModelWeights& g = shards.model.grad_weights;
  const ModelWeights& w = shards.model.weights;
  norm_backward(backend, sh.local, m.grad, g.norm_f_w, g.norm_f_b, d_xn.view(stream_shape()),
                m.x_final, w.norm_f_w, m.head_mean, m.head_rstd);
  m.x_final = m.xn = m.head_mean = m.head_rstd = Tensor{};
}

void Executor::Impl::stage_gradients(int layer) {
  if (!shards.sharding.of(layer).sharded_grads() || shards.staging.count(layer)) return;
  auto& bufs = shards.staging[layer];
  auto at = buffers.staging.find(layer);
  if (at == buffers.staging.end())
    throw std::logic_error("executor: no staging buffer in the Program for layer " +
                           std::to_string(layer));
  for (auto [a, b] : shards.sharding.of(layer).runs) {
    Tensor t = buffers.pool.take(at->second, Shape{b - a});
    backend.fill(t, 0.0f);
    bufs.push_back({a, t});
    for (const ParamInfo& e : shards.model.table.entries())
      if (e.offset >= a && e.offset + e.numel() <= b)
        // Non-owning: the staging goes with its reduce-scatter, not with these views.
        weight_field(shards.model.grad_weights, e.name) =
            Tensor{t.data + (e.offset - a), e.shape, nullptr};
  }
}

std::vector<const ParamInfo*> Executor::Impl::fetch_set(const Op& op, exec::Micro* m) const {
  std::vector<const ParamInfo*> out;
  const std::string prefix = "layers." + std::to_string(op.layer) + ".";
  // Layer -1: the lookup's weights before the micro-batch's embedding has run on this stage,
  // the head's afterwards (the Program fetches them apart).
  const bool lookup = op.layer < 0 && stage == 0 && m && !m->embedded;
  // An MoE layer's experts apart from it are fetched on their own (Block::experts), not with
  // the rest of the layer.
  const bool apart =
      op.layer >= 0 && shards.sharding.segments.count(exec::expert_segment(op.layer));
  const bool experts = op.block == Block::experts;
  for (const ParamInfo& e : shards.model.table.entries()) {
    if (op.layer >= 0 && apart && is_expert_param(e.name) != experts) continue;
    const bool in = op.layer >= 0 ? e.name.rfind(prefix, 0) == 0
                    : lookup      ? e.name == "wte" || e.name == "wpe"
                                  : e.name.rfind("norm_f.", 0) == 0 || e.name == "lm_head.weight" ||
                                   (e.name == "wte" && whole.tied_embeddings);
    if (in) out.push_back(&e);
  }
  return out;
}

void Executor::Impl::optimizer_step() {
  complete_all();  // every gradient reduction of the step has landed
  if (!options.update) return;
  double sq = 0;
  for (auto [a, b] : shards.sharding.norm_runs)
    sq +=
        backend.sum_squares(shards.model.grads.slice(shards.sharding.grads.local(a), Shape{b - a}));
  parallel.world().all_reduce_sum(&sq, 1);
  const double norm = std::sqrt(sq);
  current_step.result->grad_norm = static_cast<float>(norm);
  current_step.result->lr = options.schedule.at(current_step.index);
  // A non-finite norm (the same on every rank: it is all-reduced) leaves the weights and the
  // optimizer state as they were; the trainer decides whether to stop or go on.
  if (!std::isfinite(norm)) return;
  const float coef = clip_coefficient(norm, options.grad_clip);
  // The gradients of the elements whose state this rank holds (on the device, before any
  // copy down).
  if (coef != 1.0f)
    for (const FlatRun& r : shards.sharding.all_state) {
      Tensor g = shards.model.grads.slice(shards.sharding.grads.local(r.flat_begin),
                                          Shape{r.flat_end - r.flat_begin});
      backend.scale(g, coef);
    }
  if (offload.adamw) {  // the host_compute op updates, once the gradients are down
    offload.adamw->set_steps_taken(
        shards.adamw->steps_taken());  // (checkpoints count the device's)
    offload.update_pending = true;
    offload.lr = current_step.result->lr;
  }
  shards.adamw->step(backend, shards.adamw_runs, current_step.result->lr);
}

void Executor::Impl::compute(const Op& op) {
  switch (op.block) {
    case Block::optimizer:
      optimizer_step();
      return;
    case Block::embedding:
      op.phase == Phase::forward ? embedding_forward(op) : embedding_backward(op);
      return;
    case Block::attention:
    case Block::mlp:
      op.phase == Phase::backward ? block_backward(op) : block_forward(op);
      return;
    case Block::head:
      op.phase == Phase::forward ? head_forward(op) : head_backward(op);
      return;
    case Block::router:
    case Block::experts:
    case Block::combine:
      moe_compute(op);
      return;
    default:
      throw NotSupported("compute op " + op_name(op) + " is not executed by the runtime yet");
  }
}

}  // namespace stratagem
