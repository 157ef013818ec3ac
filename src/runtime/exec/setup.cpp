// Building one rank's context (rank_context.hpp): the Program (with the run's framework file),
// each layer's share of the stage, the Program's static buffers with the model part built inside
// them, the backward's scratch, and the optimizers (on the device, and on the host for the layers
// that offload theirs).
#include <algorithm>
#include <array>

#include "src/runtime/exec/rank_context.hpp"
#include "stratagem/error.hpp"
#include "stratagem/workload_moe.hpp"

namespace stratagem::exec {

namespace {
// The layer a parameter belongs to (-1: outside the layers).
int layer_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::stoi(name.substr(7, name.find('.', 7) - 7));
}
}  // namespace

RankContext::RankContext(ParallelState& state, const ModelSpec& model_in, const Plan& plan_in,
                         Backend& backend_in, const SampleSource& sample_source,
                         ExecutorOptions options_in)
    : parallel(state),
      model_spec(model_in),
      plan(plan_in),
      backend(backend_in),
      samples(sample_source),
      options(std::move(options_in)),
      buffers(backend_in),
      offload(backend_in) {
  check_runnable(model_spec, plan, parallel.cluster(), backend.name(), options.framework);
  stage = parallel.stage();
  whole = transformer_config(model_spec);
  T = model_spec.seq_len / plan.embedding.cp;  // check_runnable: one cp for all, 2 cp | seq_len
  if (plan.embedding.cp > 1) {                 // one cp and one tp through the model (validated)
    const int cp_group = parallel.layout().cp_group(parallel.rank(), plan.embedding.tp);
    sequence.cp = plan.embedding.cp;
    sequence.cp_rank = parallel.layout().cp_index(parallel.coords().local, plan.embedding.tp);
    sequence.seq_len = model_spec.seq_len;
    sequence.comm = &parallel.group(cp_group);
    sequence.kind = plan.embedding.cp_kind;
  }
  const ModelPart part = stage_part(plan, stage, parallel.coords().local);
  // Every layer's share (a neighbouring stage's layers too: what crosses the boundary is in
  // their layout); scratch for this stage's.
  const std::vector<int> held = part.layer_list(whole.layers);
  program = build_program(model_spec, plan, runtime_framework(options.framework, plan));
  stage_program = &program.stages.at(stage);
  make_shares(held);
  const auto [weights_buffer, grads_buffer, optimizer_buffer] = place_static_buffers();
  make_scratch();
  make_model(part, held, weights_buffer, grads_buffer);
  make_device_optimizer(optimizer_buffer);
  make_host_optimizer();
  // Transfers in flight progress while the rank computes (Backend::set_progress).
  backend.set_progress([this] { requests.progress(); });
}

RankContext::~RankContext() {
  backend.set_progress({});
}

// The layers this rank holds may lie on another stage (a neighbouring stage's boundary layer):
// every stage's ops are looked at. nullptr when no op runs the layer's experts (a Program
// without micro-batches): then they need no scratch.
const Op* RankContext::experts_op(int layer) const {
  for (const StageProgram& sp : program.stages)
    for (const Op& op : sp.ops)
      if (op.kind == OpKind::compute && op.block == Block::experts && op.layer == layer) return &op;
  return nullptr;
}

void RankContext::make_shares(const std::vector<int>& held) {
  const int local_index = parallel.coords().local;
  shares[-1] = layer_share(plan, whole, T, -1, local_index);
  for (int l = 0; l < whole.layers; ++l) {
    LayerShare sh = layer_share(plan, whole, T, l, local_index);
    if (std::binary_search(held.begin(), held.end(), l)) {
      // The backward's scratch, one set of views per tp degree (B x width / tp is the same for
      // every layer of a degree), carved by make_scratch from one arena.
      auto [w, fresh] = buffers.workspaces.try_emplace(sh.tp);
      if (fresh)
        w->second.B = sh.samples, w->second.T = T, buffers.scratch_config[sh.tp] = sh.local;
      sh.ws = &w->second;
      if (!model_spec.is_moe_layer(l)) {
        buffers.dense_ffn_degrees.insert(sh.tp);
      } else {
        // The forecast's rule, with the busiest expert rank's rows the plan allows for, as the
        // layer's experts op carries them.
        if (const Op* op = experts_op(l)) {
          const int64_t bytes = moe_expert_workspace_bytes(
              model_spec, layer_strategy(*op), sh.samples, op->dtype, op->strategy.expert_load);
          buffers.moe_scratch_floats =
              std::max(buffers.moe_scratch_floats, bytes / dtype_bytes(op->dtype));
        }
      }
    }
    shares[l] = sh;
  }
}

std::tuple<int, int, int> RankContext::place_static_buffers() {
  // The Program's static buffers (weights, gradients, optimizer states) are resident for the
  // whole run: the model part is built inside them.
  int weights_buffer = -1, grads_buffer = -1, optimizer_buffer = -1;
  for (const Op& op : stage_program->ops)
    if (op.kind == OpKind::collective && op.buffer >= 0) buffers.received_pieces.insert(op.buffer);
  for (const Op& op : stage_program->ops) {
    if (op.kind != OpKind::alloc || op.phase != Phase::setup) continue;
    buffers.pool.alloc(op.buffer, op.category, op.bytes);
    buffers.static_buffers[op.buffer] = static_cast<int>(op.category);
    if (op.category == MemCategory::weights) weights_buffer = op.buffer;
    if (op.category == MemCategory::grads) grads_buffer = op.buffer;
    if (op.category == MemCategory::optimizer) optimizer_buffer = op.buffer;
  }
  return {weights_buffer, grads_buffer, optimizer_buffer};
}

void RankContext::make_scratch() {
  // One layer's backward runs at a time, so the degrees share one arena sized for the largest,
  // as the estimator counts the stage's workspace (the largest layer's): the attention's
  // gradients, then a dense FFN's or an MoE layer's transients in the same place.
  auto attention_widths = [](const TransformerConfig& c) {
    return std::array<int64_t, 2>{c.qkv_width(), c.attn_width()};
  };
  auto ffn_widths = [](const TransformerConfig& c) {
    return std::array<int64_t, 2>{c.fc1_width(), c.ffn_hidden};
  };
  int64_t arena_numel = 0, moe_at = 0;
  for (auto& [deg, w] : buffers.workspaces) {
    const TransformerConfig& c = buffers.scratch_config.at(deg);
    const int64_t tokens = int64_t(w.B) * w.T;
    const auto [qkv, attn] = attention_widths(c);
    const auto [fc1, act] = ffn_widths(c);
    const int64_t dense_ffn = buffers.dense_ffn_degrees.count(deg) ? tokens * (fc1 + act) : 0;
    moe_at = std::max(moe_at, tokens * (qkv + attn));
    arena_numel = std::max(arena_numel, tokens * (qkv + attn) + dense_ffn);
  }
  arena_numel = std::max(arena_numel, moe_at + buffers.moe_scratch_floats);
  if (arena_numel > 0) buffers.scratch_arena = buffers.pool.scratch(Shape{arena_numel});
  for (auto& [deg, w] : buffers.workspaces) {
    const TransformerConfig& c = buffers.scratch_config.at(deg);
    const auto [qkv, attn] = attention_widths(c);
    const auto [fc1, act] = ffn_widths(c);
    w.d_qkv = buffers.scratch_arena.slice(0, Shape{w.B, w.T, qkv});
    w.d_attn = buffers.scratch_arena.slice(w.d_qkv.numel(), Shape{w.B, w.T, attn});
    if (!buffers.dense_ffn_degrees.count(deg)) continue;  // only MoE layers of this degree
    const int64_t at = w.d_qkv.numel() + w.d_attn.numel();
    w.d_fc1 = buffers.scratch_arena.slice(at, Shape{w.B, w.T, fc1});
    w.d_act = buffers.scratch_arena.slice(at + w.d_fc1.numel(), Shape{w.B, w.T, act});
  }
  if (buffers.moe_scratch_floats > 0)
    buffers.moe_scratch = ScratchArena(
        buffers.scratch_arena.slice(moe_at, Shape{arena_numel - moe_at}), backend, buffers.ledger);
}

void RankContext::make_model(const ModelPart& part, const std::vector<int>& held,
                             int weights_buffer, int grads_buffer) {
  Model& model = shards.model;
  model.config = share(-1).local;  // the embedding and head's tp share
  model.tp_rank = share(-1).tp_index;
  model.table = make_param_table(whole, part);
  // Each layer's ZeRO stage decides what of its partition this rank keeps: ZeRO-3 layers only
  // their weights' piece (gathered into the Program's fetch buffer for each use), ZeRO-2 their
  // gradients' piece (a layer's backward writes into staging that its reduce-scatter folds into
  // the piece), ZeRO-1 their optimizer state's piece.
  const Sharding& sharding = shards.sharding =
      make_sharding(model.table, segment_placements(plan, held), parallel.coords().local);
  // Offloaded parameters (ZeRO-Offload / ZeRO-Infinity) live in the host pool and come up
  // into the Program's fetch buffers for each use, as ZeRO-3's pieces are gathered.
  // Layer by layer (H3T): a layer's weights are on the device or in the host pool.
  model.params = buffers.pool.take(weights_buffer, Shape{sharding.weights.size()});
  if (sharding.host_weights.size() > 0)
    shards.host_params = offload.tensor(MemCategory::weights, Shape{sharding.host_weights.size()});
  model.grads = buffers.pool.take(grads_buffer, Shape{sharding.grads.size()});
  {
    // Initialized whole (the same values under any layout), then each held run kept.
    Tensor all = buffers.pool.scratch(Shape{model.table.size()});
    init_parameters(backend, whole, model.table, all, options.seed);
    for (const FlatRun& r : sharding.all_weights) {
      Tensor dst = shards.param_slice(r.flat_begin, r.flat_end - r.flat_begin);
      backend.copy(dst, all.slice(r.flat_begin, dst.shape));
    }
    model.weights = bind_weights(whole, model.table, all);  // slots; fields bound below
    model.grad_weights = model.weights;
  }
  for (const ParamInfo& e : model.table.entries()) {
    const Segment& seg = sharding.of_param(e.name, layer_of(e.name));
    // Weights stay bound where they are resident on the device; the others only while a
    // fetch buffer holds them.
    weight_field(model.weights, e.name) =
        seg.sharded_weights() || seg.params_on_host
            ? Tensor{}
            : model.params.slice(sharding.weights.local(e.offset), e.shape);
    // Staged layers bind their gradients to staging in backward (stage_gradients).
    weight_field(model.grad_weights, e.name) =
        seg.sharded_grads() ? Tensor{} : model.grads.slice(sharding.grads.local(e.offset), e.shape);
  }
  backend.fill(model.grads, 0.0f);
}

// AdamW on the device for the layers that keep their optimizer state there.
void RankContext::make_device_optimizer(int optimizer_buffer) {
  const Sharding& sharding = shards.sharding;
  const Shape state_shape{sharding.state.size()};
  shards.adamw =
      sharding.state.size() > 0
          ? std::make_unique<AdamW>(backend, buffers.pool.take(optimizer_buffer, state_shape),
                                    buffers.pool.take(optimizer_buffer, state_shape), options.adamw)
          : std::make_unique<AdamW>(backend, int64_t(0), options.adamw);
  for (const FlatRun& r : sharding.state.runs()) {
    const Shape len{r.flat_end - r.flat_begin};
    shards.adamw_runs.push_back({shards.param_slice(r.flat_begin, len.numel()),
                                 shards.model.grads.slice(sharding.grads.local(r.flat_begin), len),
                                 r.local, shards.model.table.spans(r.flat_begin, r.flat_end)});
  }
}

// AdamW on the host for the layers that offload their optimizer state (ZeRO-Offload): its
// moments, the gradients handed down and a master copy of the weights that stay on the device
// live in the host pool, laid out as the state; the update runs there, on a backend of its own.
void RankContext::make_host_optimizer() {
  const Sharding& sharding = shards.sharding;
  const FlatMap& hs = sharding.host_state;
  if (hs.size() == 0) return;
  offload.adamw = std::make_unique<AdamW>(
      backend, offload.tensor(MemCategory::optimizer, Shape{hs.size()}),
      offload.tensor(MemCategory::optimizer, Shape{hs.size()}), options.adamw);
  offload.backend = make_cpu_backend();
  offload.grads = offload.tensor(MemCategory::grads, Shape{hs.size()});
  bool master = false;
  for (const FlatRun& r : hs.runs()) master = master || sharding.weights.holds(r.flat_begin);
  if (master) {
    offload.master = offload.tensor(MemCategory::weights, Shape{hs.size()});
    for (auto& [m, p] : shards.host_state_pairs(offload.master, false)) backend.copy(m, p);
  }
  for (const FlatRun& r : hs.runs()) {
    const Shape len{r.flat_end - r.flat_begin};
    offload.adamw_runs.push_back({sharding.weights.holds(r.flat_begin)
                                      ? offload.master.slice(r.local, len)
                                      : shards.param_slice(r.flat_begin, len.numel()),
                                  offload.grads.slice(r.local, len), r.local,
                                  shards.model.table.spans(r.flat_begin, r.flat_end)});
  }
}

}  // namespace stratagem::exec
