// The op loop of one rank: the step, in the Program's order; each op after the transfers it
// depends on; a reduction's completion before the free of what it reads; memory samples at
// each memory event. What the ops do is in ops_compute.cpp, ops_comm.cpp and ops_offload.cpp.
#include <algorithm>
#include <thread>

#include "src/runtime/exec/impl.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

int64_t Executor::Impl::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - current_step.t0)
      .count();
}

void Executor::Impl::sample_memory() {
  MemorySample s;
  s.time_ns = now_ns();
  s.bytes_in_use = buffers.ledger->in_use();
  current_step.result->memory.push_back(s);
}

void Executor::Impl::complete(int op) {
  auto it = requests.in_flight.find(op);
  if (it == requests.in_flight.end()) return;
  // While the rank waits, the prefetching streams go on as soon as what they wait for lands.
  while (may_soon_run_ahead() && !it->second.request->test()) {
    if (run_ahead())
      sample_memory();
    else
      std::this_thread::yield();
    it = requests.in_flight.find(op);
    if (it == requests.in_flight.end()) return;  // what ran ahead completed it
  }
  exec::Requests::InFlight f = std::move(it->second);
  requests.in_flight.erase(it);
  f.request->wait();
  if (f.on_done) f.on_done();
  auto t = requests.timing_slot.find(op);
  if (t != requests.timing_slot.end()) current_step.result->timings[t->second].end_ns = now_ns();
}

void Executor::Impl::complete_all() {
  while (!requests.in_flight.empty()) complete(requests.in_flight.begin()->first);
}

void Executor::Impl::poll_sends() {
  // Eager sends complete when the peer has taken the data; their buffers go as soon as they do.
  // Testing every transfer in flight also drives them: MPI's non-blocking collectives move on
  // only inside MPI calls, where a device's network moves on by itself while the rank computes.
  for (auto it = requests.in_flight.begin(); it != requests.in_flight.end();) {
    const Op& op = stage_program->ops[it->first];
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
  const Op& op = stage_program->ops[i];
  const uint32_t* deps = stage_program->deps_of(op);
  for (uint32_t d = 0; d < op.dep_count; ++d)
    if (!requests.landed(static_cast<int>(deps[d]))) return false;
  return true;
}

void Executor::Impl::complete_deps(uint32_t i) {
  const uint32_t* deps = stage_program->deps_of(stage_program->ops[i]);
  for (uint32_t d = 0; d < stage_program->ops[i].dep_count; ++d)
    complete(static_cast<int>(deps[d]));
}

void Executor::Impl::run_pending_free(uint32_t i) {
  complete_deps(i);
  if (streams.issued[i]) return;  // the streams ran it while it waited
  streams.issued[i] = 1;          // first: while it waits for its readers, streams run ahead
  run(i);
}

void Executor::Impl::drain_frees_before(uint32_t j) {
  for (auto it = streams.pending_frees.begin(); it != streams.pending_frees.end();) {
    if (*it < j && !streams.issued[*it]) run_pending_free(*it);
    it = streams.issued[*it] ? streams.pending_frees.erase(it) : it + 1;
  }
}

void Executor::Impl::poll_frees() {
  for (auto it = streams.pending_frees.begin(); it != streams.pending_frees.end();) {
    const uint32_t i = *it;
    if (streams.issued[i]) {  // its stream ran it
      it = streams.pending_frees.erase(it);
      continue;
    }
    if (!deps_landed(i)) {
      ++it;
      continue;
    }
    run_pending_free(i);
    it = streams.pending_frees.erase(it);
  }
}

void Executor::Impl::run_timed(uint32_t i) {
  const Op& op = stage_program->ops[i];
  const int64_t start = now_ns();
  current_step.moved_bytes = -1;
  run(i);
  backend.synchronize();
  if (op.kind != OpKind::alloc && op.kind != OpKind::free) {
    if (requests.in_flight.count(static_cast<int>(i)))
      requests.timing_slot[static_cast<int>(i)] = current_step.result->timings.size();
    current_step.result->timings.push_back({i, start, now_ns(), current_step.moved_bytes});
  }
}

void Executor::Impl::run_alloc(const Op& op) {
  if (buffers.static_buffers.count(op.buffer)) return;
  buffers.pool.alloc(op.buffer, op.category, op.bytes);
  // Each memory event is sampled, as the simulator records each: several may run at once
  // (streams running ahead, frees that waited for their reductions).
  sample_memory();
  buffers.allocated(op);
}

void Executor::Impl::run_free(const Op& op) {
  if (buffers.static_buffers.count(op.buffer)) return;
  // Whatever still reads the buffer (a reduction's completion) finishes first.
  auto users = buffers.users.find(op.buffer);
  if (users != buffers.users.end()) {
    for (int u : users->second) complete(u);
    buffers.users.erase(users);
  }
  buffers.pool.free(op.buffer);
  sample_memory();
  buffers.freed(op);
  shards.unbind_fetch(op.buffer);  // a fetch buffer's weights go with it
}

void Executor::Impl::run(uint32_t i) {
  const Op& op = stage_program->ops[i];
  switch (op.kind) {
    case OpKind::alloc:
      run_alloc(op);
      return;
    case OpKind::free:
      run_free(op);
      return;
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
  current_step.result = &result;
  current_step.index = s;
  current_step.loss_sum = 0;
  requests.last_dp_reduce = -1;
  current_step.t0 = Clock::now();
  backend.fill(shards.model.grads, 0.0f);
  shards.staging.clear();
  result.timings.reserve(stage_program->ops.size());
  requests.timing_slot.clear();
  sample_memory();
  start_run_ahead();
  for (uint32_t i = 0; i < stage_program->ops.size(); ++i) {
    if (streams.issued[i]) continue;
    const Op& op = stage_program->ops[i];
    if (op.kind == OpKind::free && op.stream == Stream::dp_comm && !deps_landed(i)) {
      // The buffer a reduction still reads goes when that reduction lands, as on the Program's
      // dp stream: the rank goes on meanwhile.
      streams.pending_frees.push_back(i);
      continue;
    }
    // The dp stream is in order: a buffer it allocates (a reduce-scatter's piece) follows the
    // frees before it, which wait for their reductions. On the CPU backend every alloc does:
    // MPI moves a reduction on only inside MPI calls and ranks share cores, so it lands late by
    // the host's scheduling, not by the network the forecast models; holding the Program's
    // memory order costs the rank no more than the late peer costs it at its next collective.
    if (op.kind == OpKind::alloc && (op.stream == Stream::dp_comm || streams.allocs_follow_frees))
      drain_frees_before(i);
    if (op.kind == OpKind::alloc && streams.allocs_follow_frees)
      land_reductions_before(streams.last_compute);
    complete_deps(i);
    // (It may have run ahead while the rank waited.) A free is marked first: while it waits
    // for its buffer's readers the streams run ahead, and must not run it again. (Other ops
    // are not: what waits for them must not start while they run.)
    if (!streams.issued[i]) {
      if (op.kind == OpKind::free) streams.issued[i] = 1;
      run_timed(i);
    }
    streams.reached = i;
    poll_sends();
    poll_frees();
    // The streams go on where time passes on the rank: after its computations, and while it
    // waits (complete). Issuing a transfer, an alloc or a free takes no time in the Program
    // (nor on a device, where the host runs ahead): a stream's op that landed between two such
    // ops would take a place before the second that the simulator's ranks never give it.
    if (op.kind == OpKind::compute || op.kind == OpKind::host_compute) {
      streams.last_compute = i;
      run_ahead();
    }
    sample_memory();
  }
  complete_all();
  poll_frees();
  current_step.micro.clear();
  shards.staging.clear();
  buffers.users.clear();
  sample_memory();
  // Mean loss over the global batch: the last stage's tp rank 0 of every replica contributes.
  double loss = current_step.loss_sum;
  parallel.world().all_reduce_sum(&loss, 1);
  const double tokens = double(plan.global_batch) * model_spec.seq_len;
  result.loss = static_cast<float>(loss / tokens);
  result.time_s = std::chrono::duration<double>(Clock::now() - current_step.t0).count();
  result.high_water_bytes = buffers.ledger->high_water();
  result.host_high_water_bytes = offload.ledger->high_water();
  current_step.result = nullptr;
  return result;
}

}  // namespace stratagem
