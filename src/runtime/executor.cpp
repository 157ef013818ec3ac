#include "stratagem/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "stratagem/error.hpp"

namespace stratagem {

namespace {
using Clock = std::chrono::steady_clock;

std::vector<Tensor*> tensors_of(AttentionActs& a) {
  return {&a.norm_out, &a.norm_mean, &a.norm_rstd, &a.qkv, &a.att, &a.lse, &a.out};
}
std::vector<Tensor*> tensors_of(MlpActs& a) {
  return {&a.norm_out, &a.norm_mean, &a.norm_rstd, &a.fc1_out, &a.act_out};
}

void require_supported(const Plan& p) {
  auto check = [](const LayerStrategy& s, const std::string& where) {
    if (s.tp != 1)
      throw NotSupported(where + ": tp " + std::to_string(s.tp) +
                         " needs the hybrid-parallel runtime; the CPU runtime runs tp = 1");
    if (s.zero > 1)
      throw NotSupported(where + ": ZeRO-" + std::to_string(s.zero) +
                         " is not in the CPU runtime yet (ZeRO 0 and 1 are)");
    if (s.offload_optimizer || s.offload_params || s.offload_activations)
      throw NotSupported(where + ": offloading is not in the CPU runtime yet");
  };
  if (p.pp != 1)
    throw NotSupported("pp " + std::to_string(p.pp) +
                       " needs the hybrid-parallel runtime; the CPU runtime runs pp = 1");
  check(p.embedding, "embedding");
  for (size_t l = 0; l < p.layers.size(); ++l) {
    check(p.layers[l], "layer " + std::to_string(l));
    if (p.layers[l].zero != p.embedding.zero)
      throw NotSupported("per-layer ZeRO stages differ; the CPU runtime needs one ZeRO stage");
  }
}
}  // namespace

// Everything one micro-batch keeps between its forward and its backward.
struct Executor::MicroState {
  std::vector<int32_t> tokens, targets;
  std::vector<Tensor> x;  // residual streams (B,T,C): x[2l] enters layer l, x[2l+1] its mlp
  std::vector<AttentionActs> attn;
  std::vector<MlpActs> mlp;
  Tensor dx;      // (B,T,C) gradient of the residual stream
  Tensor logits;  // (B*T,V) fp32, from the head forward to its backward
};

Executor::Executor(MPI_Comm world, const ModelSpec& model, const ClusterSpec& cluster,
                   const Plan& plan, Backend& backend, const TokenDataset& data,
                   ExecutorOptions options)
    : world_(world),
      spec_(model),
      plan_(plan),
      be_(backend),
      data_(data),
      opt_cfg_(options),
      layout_(plan, cluster),
      program_(build_program(model, plan)),
      cfg_(transformer_config(model)) {
  require_supported(plan);
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  if (size != layout_.world_size())
    throw InputError("the plan needs " + std::to_string(layout_.world_size()) +
                     " MPI ranks but this job has " + std::to_string(size) +
                     " (check mpirun -np / srun -n against --nodes and the plan)");
  data.check_fits(model.seq_len, model.vocab);
  dp_ = plan.embedding.dp;
  zero_ = plan.embedding.zero;
  dp_index_ = Layout::dp_index(layout_.coords(rank).local, 1);
  samples_ = plan.samples_per_rank(dp_);

  // dp groups come from the Layout, so the runtime and the simulator use the same ones.
  std::vector<std::vector<int>> groups;
  for (const auto& g : layout_.groups())
    if (g.kind == GroupKind::dp) groups.push_back(g.ranks);
  groups_ = std::make_unique<MpiGroups>(world, groups);
  for (size_t i = 0; i < groups.size(); ++i)
    if (groups_->comm(static_cast<int>(i)) != MPI_COMM_NULL)
      dp_comm_ = make_mpi_communicator(groups_->comm(static_cast<int>(i)));

  model_ = make_model(be_, cfg_, options.seed);
  in_use_[static_cast<int>(MemCategory::weights)] += model_.params.numel() * 4;
  in_use_[static_cast<int>(MemCategory::grads)] += model_.grads.numel() * 4;
  // ZeRO-1 partition: contiguous, even slices of the flat buffer.
  const int64_t N = model_.table.size();
  for (int d = 0; d <= dp_; ++d) shard_bounds_.push_back(N * d / dp_);
  shard_begin_ = zero_ >= 1 ? shard_bounds_[dp_index_] : 0;
  shard_end_ = zero_ >= 1 ? shard_bounds_[dp_index_ + 1] : N;
  opt_ = std::make_unique<AdamW>(be_, shard_end_ - shard_begin_, options.adamw);
  in_use_[static_cast<int>(MemCategory::optimizer)] += 2 * (shard_end_ - shard_begin_) * 4;

  const int T = model.seq_len;
  ws_ = allocate_workspace(be_, cfg_, samples_, T);
  bool any_full = false;
  for (const auto& l : plan.layers) any_full |= l.recompute == Recompute::full;
  if (any_full) {
    scratch_attn_ = allocate_attention_acts(be_, cfg_, samples_, T, Recompute::selective);
    scratch_mlp_ = allocate_mlp_acts(be_, cfg_, samples_, T);
    scratch_mid_ = be_.allocate(Shape{samples_, T, cfg_.hidden});
    scratch_out_ = be_.allocate(Shape{samples_, T, cfg_.hidden});
  }
  auto count = [&](std::vector<Tensor*> ts) {
    for (Tensor* t : ts)
      if (t->defined()) in_use_[static_cast<int>(MemCategory::buffers)] += t->numel() * 4;
  };
  count({&ws_.d_norm, &ws_.d_qkv, &ws_.d_attn, &ws_.d_fc1, &ws_.d_act, &ws_.head_norm_out,
         &ws_.head_mean, &ws_.head_rstd, &ws_.losses, &scratch_mid_, &scratch_out_});
  count(tensors_of(scratch_attn_));
  count(tensors_of(scratch_mlp_));
}

Executor::~Executor() = default;

void Executor::track(const std::vector<Tensor*>& tensors, MemCategory cat) {
  for (Tensor* t : tensors)
    if (t->defined()) {
      ledger_[t->data] = {cat, t->numel() * 4};
      in_use_[static_cast<int>(cat)] += t->numel() * 4;
    }
}

Tensor& Executor::alloc_tracked(Tensor& slot, Shape shape, MemCategory cat) {
  slot = be_.allocate(shape);
  track({&slot}, cat);
  return slot;
}

void Executor::release(Tensor& t) {
  if (!t.defined()) return;
  auto it = ledger_.find(t.data);
  if (it != ledger_.end()) {
    in_use_[static_cast<int>(it->second.first)] -= it->second.second;
    ledger_.erase(it);
  }
  t = Tensor{};
}

void Executor::sample_memory(int64_t now_ns, StepResult& out) {
  MemorySample s;
  s.time_ns = now_ns;
  s.bytes_in_use = in_use_;
  int64_t total = 0;
  for (int64_t b : in_use_) total += b;
  high_water_ = std::max(high_water_, total);
  out.memory.push_back(s);
}

Executor::MicroState& Executor::micro(int mb) {
  auto& slot = micro_[mb];
  if (!slot) {
    slot = std::make_unique<MicroState>();
    slot->x.resize(2 * cfg_.layers + 1);
    slot->attn.resize(cfg_.layers);
    slot->mlp.resize(cfg_.layers);
  }
  return *slot;
}

std::vector<std::pair<int64_t, int64_t>> Executor::layer_ranges(int layer) const {
  // Flat ranges of a layer's parameters; layer -1 is everything outside the layers (embedding,
  // positions, final norm, LM head), which may be two runs.
  std::vector<std::pair<int64_t, int64_t>> out;
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  for (const auto& e : model_.table.entries()) {
    const bool in_layer = e.name.rfind("layers.", 0) == 0;
    const bool mine = layer >= 0 ? e.name.rfind(prefix, 0) == 0 : !in_layer;
    if (!mine) continue;
    if (!out.empty() && out.back().second == e.offset)
      out.back().second += e.numel();
    else
      out.push_back({e.offset, e.offset + e.numel()});
  }
  return out;
}

std::vector<int64_t> Executor::shard_counts(int64_t a, int64_t b) const {
  std::vector<int64_t> counts(dp_);
  for (int d = 0; d < dp_; ++d)
    counts[d] =
        std::max<int64_t>(0, std::min(b, shard_bounds_[d + 1]) - std::max(a, shard_bounds_[d]));
  return counts;
}

void Executor::dp_reduce(const Op& op) {
  float* g = model_.grads.data;
  for (auto [a, b] : layer_ranges(op.layer)) {
    if (op.collective == Collective::all_reduce) {
      dp_comm_->all_reduce_sum(g + a, b - a);
      continue;
    }
    // ZeRO-1: each rank receives the sum only where the range meets its shard.
    auto counts = shard_counts(a, b);
    std::vector<float> mine(counts[dp_index_]);
    dp_comm_->reduce_scatter_sum_v(g + a, mine.data(), counts);
    std::copy(mine.begin(), mine.end(), g + std::max(a, shard_begin_));
  }
}

void Executor::dp_gather(const Op& op) {
  // After a ZeRO-1 step each rank holds fresh weights only in its shard: gather the others.
  for (auto [a, b] : layer_ranges(op.layer))
    dp_comm_->all_gather_v_inplace(model_.params.data + a, shard_counts(a, b));
}

void Executor::optimizer_step(int64_t step, StepResult& out) {
  // Global gradient norm over this rank's shard, summed across the data-parallel group.
  Tensor g_shard{model_.grads.data + shard_begin_, Shape{shard_end_ - shard_begin_},
                 model_.grads.storage};
  Tensor p_shard{model_.params.data + shard_begin_, Shape{shard_end_ - shard_begin_},
                 model_.params.storage};
  double sq = grad_norm_squared(be_, g_shard);
  if (zero_ >= 1 && dp_ > 1) dp_comm_->all_reduce_sum(&sq, 1);
  const double norm = std::sqrt(sq);
  const float coef = clip_coefficient(norm, opt_cfg_.grad_clip);
  if (coef != 1.0f) be_.scale(g_shard, coef);
  out.grad_norm = static_cast<float>(norm);
  out.lr = opt_cfg_.schedule.at(step);
  auto spans = model_.table.spans(shard_begin_, shard_end_);
  opt_->step(be_, p_shard, g_shard, spans, out.lr);
}

void Executor::run_op(const Op& op, int64_t step, MicroState*& ms_out, StepResult& out) {
  const int L = cfg_.layers, T = spec_.seq_len, B = samples_;
  const Shape stream{B, T, cfg_.hidden};
  auto& w = model_.weights;
  auto& g = model_.grad_weights;
  switch (op.kind) {
    case OpKind::alloc:
    case OpKind::free:
      return;  // the executor allocates real tensors where the compute ops need them
    case OpKind::collective:
      if (dp_ == 1 || op.group != GroupKind::dp)
        throw std::logic_error("executor: unexpected collective " + op_name(op));
      if (op.collective == Collective::all_gather)
        dp_gather(op);
      else
        dp_reduce(op);
      return;
    case OpKind::compute:
      break;
    default:
      throw NotSupported("op " + op_name(op) + " is not executed by the CPU runtime yet");
  }
  if (op.block == Block::optimizer) {
    optimizer_step(step, out);
    return;
  }
  MicroState& ms = micro(op.microbatch);
  ms_out = &ms;
  const int l = op.layer;
  const Recompute rc = l >= 0 ? plan_.layers[l].recompute : Recompute::none;
  const bool full = rc == Recompute::full;
  switch (op.block) {
    case Block::embedding:
      if (op.phase == Phase::forward) {
        // This rank's samples of micro-batch mb, indexed globally so any layout sees the
        // same global batch.
        ms.tokens.resize(size_t(B) * T);
        ms.targets.resize(size_t(B) * T);
        for (int i = 0; i < B; ++i) {
          int64_t sample = int64_t(op.microbatch) * B * dp_ + int64_t(dp_index_) * B + i;
          data_.sample(opt_cfg_.seed, step, sample, T, ms.tokens.data() + size_t(i) * T,
                       ms.targets.data() + size_t(i) * T);
        }
        embedding_forward(be_, cfg_, w, ms.tokens,
                          alloc_tracked(ms.x[0], stream, MemCategory::activations));
      } else {
        embedding_backward(be_, cfg_, g, ms.tokens, ms.dx);
        release(ms.x[0]);
        release(ms.dx);
        micro_.erase(op.microbatch);
        ms_out = nullptr;
      }
      return;
    case Block::attention: {
      AttentionActs& acts = full ? scratch_attn_ : ms.attn[l];
      if (op.phase == Phase::forward) {
        if (!full) {
          acts = allocate_attention_acts(be_, cfg_, B, T, rc);
          track(tensors_of(acts), MemCategory::activations);
        }
        // Under full recompute only the layer input survives: the block output goes to a
        // scratch stream and is rebuilt before backward.
        Tensor& x_out =
            full ? scratch_mid_ : alloc_tracked(ms.x[2 * l + 1], stream, MemCategory::activations);
        attention_forward(be_, cfg_, w.layer(l), ms.x[2 * l], x_out, acts);
      } else if (op.phase == Phase::recompute) {
        // Selective recompute happens inside attention_backward (it rebuilds the
        // probabilities from the saved q, k); full recompute re-runs the block here.
        if (full)
          attention_forward(be_, cfg_, w.layer(l), ms.x[2 * l],
                            alloc_tracked(ms.x[2 * l + 1], stream, MemCategory::activations), acts);
      } else {
        attention_backward(be_, cfg_, w.layer(l), g.layer(l), ms.x[2 * l], ms.dx, acts, ws_);
        if (!full)
          for (Tensor* t : tensors_of(acts)) release(*t);
        release(ms.x[2 * l + 1]);
      }
      return;
    }
    case Block::mlp: {
      MlpActs& acts = full ? scratch_mlp_ : ms.mlp[l];
      if (op.phase == Phase::forward) {
        if (!full) {
          acts = allocate_mlp_acts(be_, cfg_, B, T);
          track(tensors_of(acts), MemCategory::activations);
        }
        const Tensor& x_in = full ? scratch_mid_ : ms.x[2 * l + 1];
        mlp_forward(be_, cfg_, w.layer(l), x_in,
                    alloc_tracked(ms.x[2 * l + 2], stream, MemCategory::activations), acts);
      } else if (op.phase == Phase::recompute) {
        mlp_forward(be_, cfg_, w.layer(l), ms.x[2 * l + 1], scratch_out_, acts);
      } else {
        mlp_backward(be_, cfg_, w.layer(l), g.layer(l), ms.x[2 * l + 1], ms.dx, acts, ws_);
        if (!full)
          for (Tensor* t : tensors_of(acts)) release(*t);
        release(ms.x[2 * l + 2]);
      }
      return;
    }
    case Block::head:
      if (op.phase == Phase::forward) {
        Tensor& logits =
            alloc_tracked(ms.logits, Shape{B * int64_t(T), cfg_.vocab}, MemCategory::activations);
        loss_sum_ += lm_head_forward(be_, cfg_, w, ms.x[2 * L], ms.targets, logits, ws_);
      } else {
        const float scale = 1.0f / float(program_.num_microbatches * dp_);
        lm_head_backward(be_, cfg_, w, g, ms.x[2 * L], ms.targets, scale, ms.logits,
                         alloc_tracked(ms.dx, stream, MemCategory::activations), ws_);
        release(ms.logits);
      }
      return;
    default:
      throw std::logic_error("executor: unexpected compute op " + op_name(op));
  }
}

StepResult Executor::step(int64_t step) {
  StepResult out;
  out.step = step;
  const StageProgram& sp = program_.stages.at(0);
  be_.fill(model_.grads, 0.0f);
  loss_sum_ = 0;
  const auto t0 = Clock::now();
  auto now_ns = [&] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  };
  out.timings.reserve(sp.ops.size());
  sample_memory(0, out);
  for (uint32_t i = 0; i < sp.ops.size(); ++i) {
    const Op& op = sp.ops[i];
    MicroState* ms = nullptr;
    const int64_t start = now_ns();
    run_op(op, step, ms, out);
    be_.synchronize();
    const int64_t end = now_ns();
    if (op.kind != OpKind::alloc && op.kind != OpKind::free)
      out.timings.push_back({i, start, end});
    else
      sample_memory(end, out);
    if (op.kind == OpKind::compute) sample_memory(end, out);
  }
  if (!micro_.empty()) throw std::logic_error("executor: micro-batch state left after the step");
  // Mean loss over the global batch: every micro-batch on every replica weighs the same.
  double loss[1] = {loss_sum_ / program_.num_microbatches};
  if (dp_ > 1) dp_comm_->all_reduce_sum(loss, 1);
  out.loss = static_cast<float>(loss[0] / dp_);
  out.time_s = std::chrono::duration<double>(Clock::now() - t0).count();
  out.high_water_bytes = high_water_;
  return out;
}

}  // namespace stratagem
