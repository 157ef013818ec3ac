// The executor's op loop: construction of this rank's model part inside the Program's static
// buffers, the step, dependencies between ops, and memory samples. What the ops do is in
// exec/ops_compute.cpp and exec/ops_comm.cpp.
#include "stratagem/executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "src/runtime/exec/impl.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

namespace {
using Clock = std::chrono::steady_clock;

}  // namespace

namespace {
// The model part a rank of `stage` holds: its chunks' layers, the embedding on the first
// stage, the head on the last, one tensor-parallel share.
ModelPart stage_part(const Plan& plan, int stage, int tp_rank) {
  ModelPart part;
  part.embedding = stage == 0;
  part.head = stage == plan.pp - 1;
  part.tp = plan.embedding.tp;
  part.tp_rank = tp_rank;
  for (size_t c = stage; c < plan.chunks.size(); c += plan.pp)
    for (int l = plan.chunks[c].begin; l < plan.chunks[c].end; ++l) part.layers.push_back(l);
  std::sort(part.layers.begin(), part.layers.end());
  if (part.layers.empty()) part.first_layer = part.end_layer = 0;
  return part;
}

// Every rank of a node offloads into the same host memory: a plan whose offloaded states and
// activations (as the executor holds them) do not fit there is refused before any work,
// naming the pool and the numbers.
void check_host_pool(const ModelSpec& m, const Plan& p, const ClusterSpec& c) {
  const LayerStrategy& e = p.embedding;
  const bool on_host = e.offload_params || e.offload_optimizer;
  bool acts_offloaded = false;
  for (const LayerStrategy& s : p.layers) acts_offloaded = acts_offloaded || s.offload_activations;
  if (c.node.host_memory_bytes <= 0 || !(on_host || acts_offloaded)) return;
  const TransformerConfig whole = transformer_config(m);
  const Program prog = build_program(m, p);
  const int64_t f = sizeof(float);
  int64_t per_rank = 0, states_max = 0, acts_max = 0;
  for (int stage = 0; stage < p.pp; ++stage) {
    const int64_t n = make_param_table(whole, stage_part(p, stage, 0)).size();
    const int64_t shard = e.zero >= 1 ? (n + e.dp - 1) / e.dp : n;
    int64_t states = e.offload_params ? (e.zero == 3 && e.dp > 1 ? shard : n) * f : 0;
    if (e.offload_optimizer)  // moments, the gradients handed down, the master copy
      states += shard * f * (e.offload_params ? 3 : 4);
    int64_t acts = 0, acts_peak = 0;  // the Program's activation copies, in its order
    for (const Op& op : prog.stages[stage].ops) {
      if (op.category != MemCategory::activations) continue;
      if (op.kind == OpKind::copy_d2h) acts += op.bytes;
      if (op.kind == OpKind::copy_h2d) acts -= op.bytes;
      acts_peak = std::max(acts_peak, acts);
    }
    if (states + acts_peak > per_rank)
      per_rank = states + acts_peak, states_max = states, acts_max = acts_peak;
  }
  const int per_node = std::min(c.node.gpus_per_node, p.world_size());
  if (per_rank * per_node <= c.node.host_memory_bytes) return;
  auto gib = [](int64_t b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.4g", double(b) / double(1LL << 30));
    return std::string(s);
  };
  throw InputError("host pool: the plan offloads " + gib(per_rank) + " GiB per rank (states " +
                   gib(states_max) + ", activations " + gib(acts_max) + ") x " +
                   std::to_string(per_node) + " ranks per node, more than the node's " +
                   gib(c.node.host_memory_bytes) + " GiB of host memory (cluster " + c.name +
                   ", node.host_memory_bytes)");
}
}  // namespace

// Features of the search's space that the runtime does not execute yet, named for the user.
void check_runnable(const ModelSpec& m, const Plan& p, const ClusterSpec& cluster,
                    const std::string& backend) {
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerStrategy& s = p.layers[l];
    const LayerStrategy& e = p.embedding;
    // The weights and the optimizer state are one flat buffer per rank, in one pool.
    if (s.offload_params != e.offload_params || s.offload_optimizer != e.offload_optimizer)
      throw NotSupported("layer " + std::to_string(l) + " (" + s.describe() +
                         ") offloads its parameters or optimizer state unlike the embedding (" +
                         e.describe() +
                         "): per-layer parameter and optimizer offload is not executed yet "
                         "(activation offload is)");
    if (s.tp != e.tp || s.dp != e.dp || s.sequence_parallel != e.sequence_parallel ||
        s.zero != e.zero)
      throw NotSupported("layer " + std::to_string(l) + " (" + s.describe() +
                         ") differs from the embedding's strategy (" + e.describe() +
                         "): per-layer heterogeneous tp/dp/sp/ZeRO plans are not executed yet");
  }
  bool offloads = false;
  for (const LayerStrategy& s : p.layers)
    offloads = offloads || s.offload_optimizer || s.offload_params || s.offload_activations;
  // The host pool and the copy streams are host memory and memcpy: a device backend needs
  // pinned memory and its own copy streams first.
  if (backend != "cpu" && offloads)
    throw NotSupported("offloading on the " + backend +
                       " backend (pinned host pool and copy streams) is not built yet; the cpu "
                       "backend runs it");
  if (backend == "cpu" && p.dtype != Dtype::fp32)
    throw NotSupported(std::string("dtype ") + to_string(p.dtype) +
                       ": the cpu backend computes in fp32 (plan dtype fp32)");
  transformer_config(m).sharded(p.embedding.tp);  // heads, kv heads and ffn divide by tp
  check_host_pool(m, p, cluster);
}

Executor::Impl::Impl(ParallelState& state, const ModelSpec& model_spec, const Plan& plan_in,
                     Backend& backend, const SampleSource& sample_source, ExecutorOptions options)
    : ps(state),
      spec(model_spec),
      plan(plan_in),
      be(backend),
      samples(sample_source),
      opt(options),
      ledger(std::make_shared<exec::MemoryLedger>()),
      pool(backend, ledger),
      host_ledger(std::make_shared<exec::MemoryLedger>()),
      host_pool(backend, host_ledger) {
  check_runnable(spec, plan, ps.cluster(), be.name());
  whole = transformer_config(spec);
  const LayerStrategy& es = plan.embedding;
  tp = es.tp;
  dp = es.dp;
  zero = es.zero;
  sp_on = es.sequence_parallel && tp > 1;
  local = whole.sharded(tp);
  stage = ps.stage();
  tp_index = ps.tp_index(tp);
  dp_index = ps.dp_index(tp);
  B = plan.samples_per_rank(dp);
  T = spec.seq_len;
  N = int64_t(B) * T;
  if (sp_on && N % tp)
    throw InputError("sequence parallel: " + std::to_string(N) +
                     " tokens per micro-batch do not split over tp " + std::to_string(tp));
  Ns = sp_on ? N / tp : N;
  {
    // This runtime stages a ZeRO-2/3 layer's gradients whole until its reduce-scatter
    // (data/frameworks/stratagem.json): the Program holds those buffers.
    FrameworkSpec runtime;
    runtime.layer_gradient_staging = true;
    program = build_program(spec, plan, runtime);
  }
  sp = &program.stages.at(stage);

  // The Program's static buffers (weights, gradients, optimizer states) are resident for the
  // whole run: the model part is built inside them.
  int w_buf = -1, g_buf = -1, o_buf = -1;
  for (const Op& op : sp->ops) {
    if (op.kind != OpKind::alloc || op.phase != Phase::setup) continue;
    pool.alloc(op.buffer, op.category, op.bytes);
    static_buffers[op.buffer] = static_cast<int>(op.category);
    if (op.category == MemCategory::weights) w_buf = op.buffer;
    if (op.category == MemCategory::grads) g_buf = op.buffer;
    if (op.category == MemCategory::optimizer) o_buf = op.buffer;
  }
  const ModelPart part = stage_part(plan, stage, tp_index);
  model.config = local;
  model.tp_rank = tp_index;
  model.table = make_param_table(whole, part);
  const int64_t n = model.table.size();
  // ZeRO partition: contiguous, even slices of the flat buffer over the dp group (every
  // member holds the same layout).
  for (int d = 0; d <= dp; ++d) shard_bounds.push_back(n * d / dp);
  shard_begin = zero >= 1 ? shard_bounds[dp_index] : 0;
  shard_end = zero >= 1 ? shard_bounds[dp_index + 1] : n;
  const int64_t shard = shard_end - shard_begin;
  // ZeRO-2 keeps only this rank's shard of the gradients: a layer's backward writes into a
  // staging buffer that its reduce-scatter folds into the shard (grad_shard()).
  staged = zero >= 2 && dp > 1;
  // ZeRO-3 keeps only this rank's shard of the weights: each use gathers them into the
  // Program's fetch buffer (fetch()).
  sharded_params = zero == 3 && dp > 1;
  // Offloaded parameters (ZeRO-Offload / ZeRO-Infinity) live in the host pool and come up
  // into the Program's fetch buffers for each use, as ZeRO-3's shards are gathered.
  params_on_host = es.offload_params;
  optimizer_on_host = es.offload_optimizer;
  fetched_params = sharded_params || params_on_host;
  const Shape param_shape{sharded_params ? shard : n};
  model.params = params_on_host ? host_tensor(MemCategory::weights, param_shape)
                                : pool.take(w_buf, param_shape);
  model.grads = pool.take(g_buf, Shape{staged ? shard : n});
  if (params_on_host && !sharded_params) {
    init_parameters(be, whole, model.table, model.params, opt.seed);
    model.weights.slot = bind_weights(whole, model.table, model.params).slot;
    model.weights.layers.assign(model.weights.slot.size(), LayerWeights{});
    model.weights.layers.resize(part.layers.size());
  } else if (sharded_params) {
    Tensor all = pool.scratch(Shape{n});
    init_parameters(be, whole, model.table, all, opt.seed);
    be.copy(model.params, all.slice(shard_begin, Shape{shard}));
    model.weights.slot = bind_weights(whole, model.table, all).slot;
    model.weights.layers.assign(model.weights.slot.size(), LayerWeights{});
    model.weights.layers.resize(part.layers.size());
  } else {
    init_parameters(be, whole, model.table, model.params, opt.seed);
    model.weights = bind_weights(whole, model.table, model.params);
  }
  be.fill(model.grads, 0.0f);
  if (!staged)
    model.grad_weights = bind_weights(whole, model.table, model.grads);
  else
    model.grad_weights = model.weights;  // slots only: backward binds its staging
  if (optimizer_on_host) {
    // ZeRO-Offload: AdamW's moments, the master copy of the shard and the gradients it is
    // handed live in the host pool; the update runs there, on a backend of its own.
    adamw = std::make_unique<AdamW>(be, host_tensor(MemCategory::optimizer, Shape{shard}),
                                    host_tensor(MemCategory::optimizer, Shape{shard}), opt.adamw);
    host_be = make_cpu_backend();
    host_grads = host_tensor(MemCategory::grads, Shape{shard});
    Tensor device_shard =
        sharded_params ? model.params : model.params.slice(shard_begin, Shape{shard});
    if (params_on_host) {
      host_master = device_shard;  // already the host's
    } else {
      host_master = host_tensor(MemCategory::weights, Shape{shard});
      be.copy(host_master, device_shard);
    }
  } else {
    adamw = std::make_unique<AdamW>(be, pool.take(o_buf, Shape{shard}),
                                    pool.take(o_buf, Shape{shard}), opt.adamw);
  }

  // The global gradient norm counts each logical element once: one data-parallel replica (or
  // the shard owner), one tp rank for replicated tensors, and not the tied head copy.
  norm_owner.assign(static_cast<size_t>(n), 0);
  for (const ParamInfo& e : model.table.entries()) {
    if (e.tied_copy || (e.replicated && tp_index != 0)) continue;
    for (int64_t i = e.offset; i < e.offset + e.numel(); ++i)
      norm_owner[i] = zero >= 1 ? (i >= shard_begin && i < shard_end) : dp_index == 0;
  }
  ws.B = B;
  ws.T = T;
  ws.d_qkv = pool.scratch(Shape{B, T, local.qkv_width()});
  ws.d_attn = pool.scratch(Shape{B, T, local.attn_width()});
  ws.d_fc1 = pool.scratch(Shape{B, T, local.fc1_width()});
  ws.d_act = pool.scratch(Shape{B, T, local.ffn_hidden});
}

int64_t Executor::Impl::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

void Executor::Impl::sample_memory() {
  MemorySample s;
  s.time_ns = now_ns();
  s.bytes_in_use = ledger->in_use();
  out->memory.push_back(s);
}

void Executor::Impl::issue(int op, RequestPtr request, std::function<void()> on_done) {
  inflight[op] = InFlight{std::move(request), std::move(on_done)};
}

void Executor::Impl::complete(int op) {
  auto it = inflight.find(op);
  if (it == inflight.end()) return;
  InFlight f = std::move(it->second);
  inflight.erase(it);
  f.request->wait();
  if (f.on_done) f.on_done();
  auto t = timing_slot.find(op);
  if (t != timing_slot.end()) out->timings[t->second].end_ns = now_ns();
}

void Executor::Impl::complete_all() {
  while (!inflight.empty()) complete(inflight.begin()->first);
}

void Executor::Impl::poll_sends() {
  // Eager sends complete when the peer has taken the data; their buffers go as soon as they do.
  for (auto it = inflight.begin(); it != inflight.end();) {
    const Op& op = sp->ops[it->first];
    if (op.kind == OpKind::send && it->second.request->test()) {
      const int idx = it->first;
      ++it;
      complete(idx);
    } else {
      ++it;
    }
  }
}

bool Executor::Impl::deps_landed(uint32_t i) {
  const Op& op = sp->ops[i];
  const uint32_t* deps = sp->deps_of(op);
  for (uint32_t d = 0; d < op.dep_count; ++d) {
    auto it = inflight.find(static_cast<int>(deps[d]));
    if (it != inflight.end() && !it->second.request->test()) return false;
  }
  return true;
}

void Executor::Impl::poll_frees() {
  for (auto it = pending_frees.begin(); it != pending_frees.end();) {
    const uint32_t i = *it;
    if (!deps_landed(i)) {
      ++it;
      continue;
    }
    const Op& op = sp->ops[i];
    const uint32_t* deps = sp->deps_of(op);
    for (uint32_t d = 0; d < op.dep_count; ++d) complete(static_cast<int>(deps[d]));
    run(i);
    it = pending_frees.erase(it);
  }
}

void Executor::Impl::run(uint32_t i) {
  const Op& op = sp->ops[i];
  switch (op.kind) {
    case OpKind::alloc:
      if (static_buffers.count(op.buffer)) return;
      pool.alloc(op.buffer, op.category, op.bytes);
      if (op.category == MemCategory::grads)
        staging_buffer[op.layer] = op.buffer;  // ZeRO-2/3: the layer's staged gradients
      else
        buffer_of[{int(op.block), int(op.phase), op.layer, op.microbatch}] = op.buffer;
      return;
    case OpKind::free: {
      if (static_buffers.count(op.buffer)) return;
      // Whatever still reads the buffer (a reduction's completion) finishes first.
      auto users = buffer_users.find(op.buffer);
      if (users != buffer_users.end()) {
        for (int u : users->second) complete(u);
        buffer_users.erase(users);
      }
      pool.free(op.buffer);
      if (op.category != MemCategory::grads)
        buffer_of.erase({int(op.block), int(op.phase), op.layer, op.microbatch});
      else if (auto s = staging_buffer.find(op.layer);
               s != staging_buffer.end() && s->second == op.buffer)
        staging_buffer.erase(s);
      if (auto f = fetched.find(op.buffer); f != fetched.end()) {
        for (const ParamInfo* e : f->second) weight_field(model.weights, e->name) = Tensor{};
        fetched.erase(f);
      }
      return;
    }
    case OpKind::compute:
      compute(op);
      return;
    case OpKind::collective:
      collective(op, static_cast<int>(i));
      return;
    case OpKind::send:
      send(op, static_cast<int>(i));
      return;
    case OpKind::recv:
      recv(op, static_cast<int>(i));
      return;
    case OpKind::copy_h2d:
    case OpKind::copy_d2h:
      copy(op, static_cast<int>(i));
      return;
    case OpKind::host_compute:
      host_compute(op, static_cast<int>(i));
      return;
    default:
      throw NotSupported("op " + op_name(op) + " (" + to_string(op.kind) +
                         ") is not executed by the runtime yet");
  }
}

StepResult Executor::Impl::step(int64_t s) {
  StepResult result;
  result.step = s;
  out = &result;
  step_index = s;
  loss_sum = 0;
  last_dp_reduce = -1;
  t0 = Clock::now();
  be.fill(model.grads, 0.0f);
  staging.clear();
  result.timings.reserve(sp->ops.size());
  timing_slot.clear();
  sample_memory();
  for (uint32_t i = 0; i < sp->ops.size(); ++i) {
    const Op& op = sp->ops[i];
    const uint32_t* deps = sp->deps_of(op);
    if (op.kind == OpKind::free && op.stream == Stream::dp_comm && !deps_landed(i)) {
      // The buffer a reduction still reads goes when that reduction lands, as on the Program's
      // dp stream: the rank goes on meanwhile.
      pending_frees.push_back(i);
      continue;
    }
    for (uint32_t d = 0; d < op.dep_count; ++d) complete(static_cast<int>(deps[d]));
    const int64_t start = now_ns();
    run(i);
    be.synchronize();
    if (op.kind != OpKind::alloc && op.kind != OpKind::free) {
      if (inflight.count(static_cast<int>(i)))
        timing_slot[static_cast<int>(i)] = result.timings.size();
      result.timings.push_back({i, start, now_ns()});
    }
    poll_sends();
    poll_frees();
    sample_memory();
  }
  complete_all();
  poll_frees();
  micro.clear();
  staging.clear();
  buffer_users.clear();
  sample_memory();
  // Mean loss over the global batch: the last stage's tp rank 0 of every replica contributes.
  double loss = loss_sum;
  ps.world().all_reduce_sum(&loss, 1);
  const double tokens = double(plan.global_batch) * spec.seq_len;
  result.loss = static_cast<float>(loss / tokens);
  result.time_s = std::chrono::duration<double>(Clock::now() - t0).count();
  result.high_water_bytes = ledger->high_water();
  result.host_high_water_bytes = host_ledger->high_water();
  out = nullptr;
  return result;
}

// ---- public face ----------------------------------------------------------------------------
Executor::Executor(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
                   const SampleSource& samples, ExecutorOptions options)
    : impl_(std::make_unique<Impl>(state, model, plan, backend, samples, options)) {}
Executor::~Executor() = default;
StepResult Executor::step(int64_t step) {
  return impl_->step(step);
}
Model& Executor::model() {
  return impl_->model;
}
AdamW& Executor::optimizer() {
  return *impl_->adamw;
}
int64_t Executor::shard_begin() const {
  return impl_->shard_begin;
}
int64_t Executor::shard_end() const {
  return impl_->shard_end;
}
bool Executor::params_sharded() const {
  return impl_->sharded_params;
}
int Executor::dp_index() const {
  return impl_->dp_index;
}
int Executor::dp_size() const {
  return impl_->dp;
}
const Program& Executor::program() const {
  return impl_->program;
}
const StageProgram& Executor::stage_program() const {
  return *impl_->sp;
}
int64_t Executor::high_water_bytes() const {
  return impl_->ledger->high_water();
}
int64_t Executor::host_high_water_bytes() const {
  return impl_->host_ledger->high_water();
}
void Executor::weights_loaded() {
  impl_->master_stale = true;
}

}  // namespace stratagem
