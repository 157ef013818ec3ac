// The executor's op loop: construction of this rank's model part inside the Program's static
// buffers, the step, dependencies between ops, and memory samples. What the ops do is in
// exec/ops_compute.cpp and exec/ops_comm.cpp.
#include "stratagem/executor.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <thread>

#include "src/runtime/exec/impl.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

namespace {
using Clock = std::chrono::steady_clock;

// The layer a parameter belongs to (-1: outside the layers).
int layer_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  return std::stoi(name.substr(7, name.find('.', 7) - 7));
}

}  // namespace

namespace {
// The model part a rank of `stage` (at index `local` in it) holds: its chunks' layers, the
// embedding on the first stage, the head on the last, and of each its tensor-parallel share.
ModelPart stage_part(const Plan& plan, int stage, int local) {
  ModelPart part;
  part.embedding = stage == 0;
  part.head = stage == plan.pp - 1;
  part.tp = plan.embedding.tp;
  part.tp_rank = Layout::tp_index(local, part.tp);
  for (size_t c = stage; c < plan.chunks.size(); c += plan.pp)
    for (int l = plan.chunks[c].begin; l < plan.chunks[c].end; ++l) part.layers.push_back(l);
  std::sort(part.layers.begin(), part.layers.end());
  if (part.layers.empty()) part.first_layer = part.end_layer = 0;
  for (const LayerStrategy& s : plan.layers) {
    part.layer_tp.push_back(s.tp);
    part.layer_tp_rank.push_back(Layout::tp_index(local, s.tp));
  }
  return part;
}

// Every rank of a node offloads into the same host memory: a plan whose offloaded states and
// activations (as the executor holds them) do not fit there is refused before any work,
// naming the pool and the numbers.
void check_host_pool(const ModelSpec& m, const Plan& p, const ClusterSpec& c) {
  const LayerStrategy& e = p.embedding;
  bool on_host = e.offload_params || e.offload_optimizer;
  for (const LayerStrategy& s : p.layers)
    on_host = on_host || s.offload_params || s.offload_optimizer || s.offload_activations;
  if (c.node.host_memory_bytes <= 0 || !on_host) return;
  const TransformerConfig whole = transformer_config(m);
  const Program prog = build_program(m, p);
  const int64_t f = sizeof(float);
  int64_t per_rank = 0, states_max = 0, acts_max = 0;
  for (int stage = 0; stage < p.pp; ++stage) {
    // As the executor holds them (its first data-parallel rank's pieces).
    const ModelPart part = stage_part(p, stage, 0);
    const exec::Sharding sh =
        exec::make_sharding(make_param_table(whole, part), p, part.layer_list(whole.layers), 0);
    // Offloaded weights; offloaded optimizer state: moments, the gradients handed down, and a
    // master copy of the weights that stay on the device.
    int64_t states = (sh.host_weights.size() + 3 * sh.host_state.size()) * f;
    for (const FlatRun& r : sh.host_state.runs())
      if (sh.weights.holds(r.flat_begin)) states += (r.flat_end - r.flat_begin) * f;
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
  // Per-layer strategies: where consecutive layers hold the stream differently
  // (LayerStrategy::stream_tp: (tp, dp), sequence parallelism), activations and gradients are
  // resharded by the Program's reshard all-gathers (or sliced where its replicas shrink),
  // from the embedding into the first layer and from the last into the LM head too.
  const size_t n = p.layers.size();
  for (size_t l = 0; l <= n; ++l) {
    const LayerStrategy& prev = l == 0 ? p.embedding : p.layers[l - 1];
    const LayerStrategy& s = l < n ? p.layers[l] : p.embedding;
    const int a = prev.stream_tp(), b = s.stream_tp();
    if (a % b && b % a)
      throw InputError((l < n ? "layer " + std::to_string(l) : std::string("the LM head")) + " (" +
                       s.describe() + "): tp does not divide the previous layer's (" +
                       prev.describe() + ") nor is divided by it: no reshard group");
    transformer_config(m).sharded(s.tp);
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
  for (const Op& op : sp->ops)
    if (op.kind == OpKind::collective && op.buffer >= 0) received_pieces.insert(op.buffer);
  for (const Op& op : sp->ops) {
    if (op.kind != OpKind::alloc || op.phase != Phase::setup) continue;
    pool.alloc(op.buffer, op.category, op.bytes);
    static_buffers[op.buffer] = static_cast<int>(op.category);
    if (op.category == MemCategory::weights) w_buf = op.buffer;
    if (op.category == MemCategory::grads) g_buf = op.buffer;
    if (op.category == MemCategory::optimizer) o_buf = op.buffer;
  }
  const ModelPart part = stage_part(plan, stage, ps.coords().local);
  shares[-1] = LayerShare{tp, tp_index, dp, dp_index, sp_on, B, N, Ns, local, nullptr};
  // Every layer's (a neighbouring stage's layers too: what crosses the boundary is in their
  // layout); scratch for this stage's.
  const std::vector<int> held = part.layer_list(whole.layers);
  for (int l = 0; l < whole.layers; ++l) {
    const LayerStrategy& s = plan.layers[l];
    LayerShare sh;
    sh.tp = s.tp;
    sh.tp_index = ps.tp_index(s.tp);
    sh.dp = s.dp;
    sh.dp_index = ps.dp_index(s.tp);
    sh.sp = s.sequence_parallel && s.tp > 1;
    sh.B = plan.samples_per_rank(s.dp);
    sh.N = int64_t(sh.B) * T;
    if (sh.sp && sh.N % sh.tp)
      throw InputError("sequence parallel: " + std::to_string(sh.N) +
                       " tokens per micro-batch do not split over tp " + std::to_string(sh.tp));
    sh.Ns = sh.sp ? sh.N / sh.tp : sh.N;
    sh.local = whole.sharded(s.tp);
    if (!std::binary_search(held.begin(), held.end(), l)) {
      shares[l] = sh;
      continue;
    }
    // The backward's scratch, one set of views per tp degree (B x width / tp is the same for
    // every layer of a degree), carved below from one arena.
    auto [w, fresh] = workspaces.try_emplace(s.tp);
    if (fresh) w->second.B = sh.B, w->second.T = T, scratch_config[s.tp] = sh.local;
    sh.ws = &w->second;
    shares[l] = sh;
  }
  // One layer's backward runs at a time, so the degrees share one arena sized for the largest,
  // as the estimator counts the stage's workspace (the largest layer's).
  auto scratch_widths = [](const TransformerConfig& c) {
    return std::array<int64_t, 4>{c.qkv_width(), c.attn_width(), c.fc1_width(), c.ffn_hidden};
  };
  int64_t arena_numel = 0;
  for (auto& [deg, w] : workspaces) {
    int64_t row = 0;
    for (int64_t width : scratch_widths(scratch_config.at(deg))) row += width;
    arena_numel = std::max(arena_numel, int64_t(w.B) * w.T * row);
  }
  if (arena_numel > 0) scratch_arena = pool.scratch(Shape{arena_numel});
  for (auto& [deg, w] : workspaces) {
    const auto widths = scratch_widths(scratch_config.at(deg));
    Tensor* views[4] = {&w.d_qkv, &w.d_attn, &w.d_fc1, &w.d_act};
    int64_t at = 0;
    for (int i = 0; i < 4; ++i) {
      *views[i] = scratch_arena.slice(at, Shape{w.B, w.T, widths[i]});
      at += int64_t(w.B) * w.T * widths[i];
    }
  }
  model.config = local;
  model.tp_rank = tp_index;
  model.table = make_param_table(whole, part);
  const int64_t n = model.table.size();
  // Each layer's ZeRO stage decides what of its partition this rank keeps: ZeRO-3 layers only
  // their weights' piece (gathered into the Program's fetch buffer for each use), ZeRO-2 their
  // gradients' piece (a layer's backward writes into staging that its reduce-scatter folds into
  // the piece), ZeRO-1 their optimizer state's piece.
  shards = exec::make_sharding(model.table, plan, held, ps.coords().local);
  // Offloaded parameters (ZeRO-Offload / ZeRO-Infinity) live in the host pool and come up
  // into the Program's fetch buffers for each use, as ZeRO-3's pieces are gathered.
  // Layer by layer (H3T): a layer's weights are on the device or in the host pool.
  const Shape state_shape{shards.state.size()};
  model.params = pool.take(w_buf, Shape{shards.weights.size()});
  if (shards.host_weights.size() > 0)
    host_params = host_tensor(MemCategory::weights, Shape{shards.host_weights.size()});
  model.grads = pool.take(g_buf, Shape{shards.grads.size()});
  {
    // Initialized whole (the same values under any layout), then each held run kept.
    Tensor all = pool.scratch(Shape{n});
    init_parameters(be, whole, model.table, all, opt.seed);
    for (const FlatRun& r : shards.all_weights) {
      Tensor dst = param_slice(r.flat_begin, r.flat_end - r.flat_begin);
      be.copy(dst, all.slice(r.flat_begin, dst.shape));
    }
    model.weights = bind_weights(whole, model.table, all);  // slots; fields bound below
    model.grad_weights = model.weights;
  }
  for (const ParamInfo& e : model.table.entries()) {
    const exec::Segment& seg = shards.of(layer_of(e.name));
    // Weights stay bound where they are resident on the device; the others only while a
    // fetch buffer holds them.
    weight_field(model.weights, e.name) =
        seg.sharded_weights() || seg.params_on_host
            ? Tensor{}
            : model.params.slice(shards.weights.local(e.offset), e.shape);
    // Staged layers bind their gradients to staging in backward (stage_gradients).
    weight_field(model.grad_weights, e.name) =
        seg.sharded_grads() ? Tensor{} : model.grads.slice(shards.grads.local(e.offset), e.shape);
  }
  be.fill(model.grads, 0.0f);
  // AdamW on the device for the layers that keep their optimizer state there...
  adamw = shards.state.size() > 0
              ? std::make_unique<AdamW>(be, pool.take(o_buf, state_shape),
                                        pool.take(o_buf, state_shape), opt.adamw)
              : std::make_unique<AdamW>(be, int64_t(0), opt.adamw);
  for (const FlatRun& r : shards.state.runs()) {
    const Shape len{r.flat_end - r.flat_begin};
    adamw_runs.push_back({param_slice(r.flat_begin, len.numel()),
                          model.grads.slice(shards.grads.local(r.flat_begin), len), r.local,
                          model.table.spans(r.flat_begin, r.flat_end)});
  }
  // ... and on the host for those that offload it (ZeRO-Offload): its moments, the gradients
  // handed down and a master copy of the weights that stay on the device live in the host
  // pool, laid out as the state; the update runs there, on a backend of its own.
  const exec::FlatMap& hs = shards.host_state;
  if (hs.size() > 0) {
    host_adamw =
        std::make_unique<AdamW>(be, host_tensor(MemCategory::optimizer, Shape{hs.size()}),
                                host_tensor(MemCategory::optimizer, Shape{hs.size()}), opt.adamw);
    host_be = make_cpu_backend();
    host_grads = host_tensor(MemCategory::grads, Shape{hs.size()});
    bool master = false;
    for (const FlatRun& r : hs.runs()) master = master || shards.weights.holds(r.flat_begin);
    if (master) {
      host_master = host_tensor(MemCategory::weights, Shape{hs.size()});
      for (auto& [m, p] : host_state_pairs(host_master, false)) be.copy(m, p);
    }
    for (const FlatRun& r : hs.runs()) {
      const Shape len{r.flat_end - r.flat_begin};
      host_adamw_runs.push_back(
          {shards.weights.holds(r.flat_begin) ? host_master.slice(r.local, len)
                                              : param_slice(r.flat_begin, len.numel()),
           host_grads.slice(r.local, len), r.local, model.table.spans(r.flat_begin, r.flat_end)});
    }
  }
  // Transfers in flight progress while the rank computes (Backend::set_progress).
  be.set_progress([this] {
    for (auto& [index, f] : inflight) f.request->test();
  });
}

Executor::Impl::~Impl() {
  be.set_progress({});
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
  // While the rank waits, the prefetching streams go on as soon as what they wait for lands.
  while (may_soon_run_ahead() && !it->second.request->test()) {
    if (run_ahead())
      sample_memory();
    else
      std::this_thread::yield();
    it = inflight.find(op);
    if (it == inflight.end()) return;  // what ran ahead completed it
  }
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
  // Testing every transfer in flight also drives them: MPI's non-blocking collectives move on
  // only inside MPI calls, where a device's network moves on by itself while the rank computes.
  for (auto it = inflight.begin(); it != inflight.end();) {
    const Op& op = sp->ops[it->first];
    if (it->second.request->test() && op.kind == OpKind::send) {
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

bool Executor::Impl::pending(uint32_t i) const {
  return std::find(pending_frees.begin(), pending_frees.end(), i) != pending_frees.end();
}

void Executor::Impl::complete_deps(uint32_t i) {
  const uint32_t* deps = sp->deps_of(sp->ops[i]);
  for (uint32_t d = 0; d < sp->ops[i].dep_count; ++d) complete(static_cast<int>(deps[d]));
}

void Executor::Impl::run_pending_free(uint32_t i) {
  complete_deps(i);
  run(i);
  ran_ahead[i] = 1;
}

void Executor::Impl::drain_frees_before(uint32_t j) {
  for (auto it = pending_frees.begin(); it != pending_frees.end();) {
    if (*it < j && !ran_ahead[*it]) run_pending_free(*it);
    it = ran_ahead[*it] ? pending_frees.erase(it) : it + 1;
  }
}

void Executor::Impl::poll_frees() {
  for (auto it = pending_frees.begin(); it != pending_frees.end();) {
    const uint32_t i = *it;
    if (ran_ahead[i]) {  // its stream ran it
      it = pending_frees.erase(it);
      continue;
    }
    if (!deps_landed(i)) {
      ++it;
      continue;
    }
    run_pending_free(i);
    it = pending_frees.erase(it);
  }
}

void Executor::Impl::run_timed(uint32_t i) {
  const Op& op = sp->ops[i];
  const int64_t start = now_ns();
  run(i);
  be.synchronize();
  if (op.kind != OpKind::alloc && op.kind != OpKind::free) {
    if (inflight.count(static_cast<int>(i))) timing_slot[static_cast<int>(i)] = out->timings.size();
    out->timings.push_back({i, start, now_ns()});
  }
}

void Executor::Impl::run(uint32_t i) {
  const Op& op = sp->ops[i];
  switch (op.kind) {
    case OpKind::alloc:
      if (static_buffers.count(op.buffer)) return;
      pool.alloc(op.buffer, op.category, op.bytes);
      // Each memory event is sampled, as the simulator records each: several may run at once
      // (streams running ahead, frees that waited for their reductions).
      sample_memory();
      if (op.category == MemCategory::grads)
        staging_buffer[op.layer] = op.buffer;      // ZeRO-2/3: the layer's staged gradients
      else if (!received_pieces.count(op.buffer))  // a piece is found through its reduce-scatter
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
      sample_memory();
      if (received_pieces.count(op.buffer)) return;  // a reduce-scatter's (the op names it)
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
  start_run_ahead();
  for (uint32_t i = 0; i < sp->ops.size(); ++i) {
    if (ran_ahead[i]) continue;
    const Op& op = sp->ops[i];
    if (op.kind == OpKind::free && op.stream == Stream::dp_comm && !deps_landed(i)) {
      // The buffer a reduction still reads goes when that reduction lands, as on the Program's
      // dp stream: the rank goes on meanwhile.
      pending_frees.push_back(i);
      continue;
    }
    // The dp stream is in order: a buffer it allocates (a reduce-scatter's piece) follows the
    // frees before it, which wait for their reductions. On the CPU backend every alloc does:
    // MPI moves a reduction on only inside MPI calls and ranks share cores, so it lands late by
    // the host's scheduling, not by the network the forecast models; holding the Program's
    // memory order costs the rank no more than the late peer costs it at its next collective.
    if (op.kind == OpKind::alloc && (op.stream == Stream::dp_comm || allocs_follow_frees))
      drain_frees_before(i);
    if (op.kind == OpKind::alloc && allocs_follow_frees) land_reductions_before(last_compute);
    complete_deps(i);
    if (!ran_ahead[i]) run_timed(i);  // (it may have run ahead while the rank waited)
    reached = i;
    poll_sends();
    poll_frees();
    // The streams go on where time passes on the rank: after its computations, and while it
    // waits (complete). Issuing a transfer, an alloc or a free takes no time in the Program
    // (nor on a device, where the host runs ahead): a stream's op that landed between two such
    // ops would take a place before the second that the simulator's ranks never give it.
    if (op.kind == OpKind::compute || op.kind == OpKind::host_compute) {
      last_compute = i;
      run_ahead();
    }
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
const std::vector<FlatRun>& Executor::param_runs() const {
  return impl_->shards.all_weights;
}
Tensor& Executor::host_params() {
  return impl_->host_params;
}
const std::vector<FlatRun>& Executor::optimizer_runs() const {
  return impl_->shards.all_state;
}
AdamW* Executor::host_optimizer() {
  return impl_->host_adamw.get();
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
