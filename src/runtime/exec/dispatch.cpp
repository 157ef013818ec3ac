// The op loop of one rank: the step, in the Program's order; each op after the transfers it
// depends on, on the handler of its family (exec/impl.hpp lists them); a reduction's
// completion before the free of what it reads; memory samples at each memory event.
#include "src/runtime/exec/dispatch.hpp"

#include <algorithm>
#include <thread>

#include "src/runtime/exec/ops_comm.hpp"
#include "src/runtime/exec/ops_compute.hpp"
#include "src/runtime/exec/ops_offload.hpp"
#include "src/runtime/exec/rank_context.hpp"
#include "src/runtime/exec/run_ahead.hpp"
#include "stratagem/error.hpp"

namespace stratagem::exec {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

int64_t Dispatcher::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - rank_.current_step.t0)
      .count();
}

void Dispatcher::sample_memory() {
  MemorySample s;
  s.time_ns = now_ns();
  s.bytes_in_use = rank_.buffers.ledger->in_use();
  rank_.current_step.result->memory.push_back(s);
}

void Dispatcher::complete(int op) {
  auto it = rank_.requests.in_flight.find(op);
  if (it == rank_.requests.in_flight.end()) return;
  // While the rank waits, the prefetching streams go on as soon as what they wait for lands.
  while (run_ahead_.may_soon_run() && !it->second.request->test()) {
    if (run_ahead_.run())
      sample_memory();
    else
      std::this_thread::yield();
    it = rank_.requests.in_flight.find(op);
    if (it == rank_.requests.in_flight.end()) return;  // what ran ahead completed it
  }
  Requests::InFlight f = std::move(it->second);
  rank_.requests.in_flight.erase(it);
  f.request->wait();
  if (f.on_done) f.on_done();
  auto t = rank_.requests.timing_slot.find(op);
  if (t != rank_.requests.timing_slot.end())
    rank_.current_step.result->timings[t->second].end_ns = now_ns();
}

void Dispatcher::complete_all() {
  while (!rank_.requests.in_flight.empty()) complete(rank_.requests.in_flight.begin()->first);
}

void Dispatcher::poll_sends() {
  // Eager sends complete when the peer has taken the data; their buffers go as soon as they do.
  // Testing every transfer in flight also drives them: MPI's non-blocking collectives move on
  // only inside MPI calls, where a device's network moves on by itself while the rank computes.
  for (auto it = rank_.requests.in_flight.begin(); it != rank_.requests.in_flight.end();) {
    const Op& op = rank_.stage_program->ops[it->first];
    if (it->second.request->test() && op.kind == OpKind::send) {
      const int idx = it->first;
      ++it;
      complete(idx);
    } else {
      ++it;
    }
  }
}

bool Dispatcher::deps_landed(uint32_t i) {
  const Op& op = rank_.stage_program->ops[i];
  const uint32_t* deps = rank_.stage_program->deps_of(op);
  for (uint32_t d = 0; d < op.dep_count; ++d)
    if (!rank_.requests.landed(static_cast<int>(deps[d]))) return false;
  return true;
}

void Dispatcher::complete_deps(uint32_t i) {
  const uint32_t* deps = rank_.stage_program->deps_of(rank_.stage_program->ops[i]);
  for (uint32_t d = 0; d < rank_.stage_program->ops[i].dep_count; ++d)
    complete(static_cast<int>(deps[d]));
}

void Dispatcher::run_pending_free(uint32_t i) {
  complete_deps(i);
  if (rank_.streams.issued[i]) return;  // the streams ran it while it waited
  rank_.streams.issued[i] = 1;          // first: while it waits for its readers, streams run ahead
  run(i);
}

void Dispatcher::drain_frees_before(uint32_t j) {
  for (auto it = rank_.streams.pending_frees.begin(); it != rank_.streams.pending_frees.end();) {
    if (*it < j && !rank_.streams.issued[*it]) run_pending_free(*it);
    it = rank_.streams.issued[*it] ? rank_.streams.pending_frees.erase(it) : it + 1;
  }
}

void Dispatcher::poll_frees() {
  for (auto it = rank_.streams.pending_frees.begin(); it != rank_.streams.pending_frees.end();) {
    const uint32_t i = *it;
    if (rank_.streams.issued[i]) {  // its stream ran it
      it = rank_.streams.pending_frees.erase(it);
      continue;
    }
    if (!deps_landed(i)) {
      ++it;
      continue;
    }
    run_pending_free(i);
    it = rank_.streams.pending_frees.erase(it);
  }
}

void Dispatcher::run_timed(uint32_t i) {
  const Op& op = rank_.stage_program->ops[i];
  const int64_t start = now_ns();
  rank_.current_step.moved_bytes = -1;
  run(i);
  rank_.backend.synchronize();
  if (op.kind != OpKind::alloc && op.kind != OpKind::free) {
    if (rank_.requests.in_flight.count(static_cast<int>(i)))
      rank_.requests.timing_slot[static_cast<int>(i)] = rank_.current_step.result->timings.size();
    rank_.current_step.result->timings.push_back(
        {i, start, now_ns(), rank_.current_step.moved_bytes});
  }
}

void Dispatcher::run_alloc(const Op& op) {
  if (rank_.buffers.static_buffers.count(op.buffer)) return;
  rank_.buffers.pool.alloc(op.buffer, op.category, op.bytes);
  // Each memory event is sampled, as the simulator records each: several may run at once
  // (streams running ahead, frees that waited for their reductions).
  sample_memory();
  rank_.buffers.allocated(op);
}

void Dispatcher::run_free(const Op& op) {
  if (rank_.buffers.static_buffers.count(op.buffer)) return;
  // Whatever still reads the buffer (a reduction's completion) finishes first.
  auto users = rank_.buffers.users.find(op.buffer);
  if (users != rank_.buffers.users.end()) {
    for (int u : users->second) complete(u);
    rank_.buffers.users.erase(users);
  }
  rank_.buffers.pool.free(op.buffer);
  sample_memory();
  rank_.buffers.freed(op);
  rank_.shards.unbind_fetch(op.buffer);  // a fetch buffer's weights go with it
}

void Dispatcher::run(uint32_t i) {
  const Op& op = rank_.stage_program->ops[i];
  switch (op.kind) {
    case OpKind::alloc:
      run_alloc(op);
      return;
    case OpKind::free:
      run_free(op);
      return;
    case OpKind::compute:
      compute_.run(op);
      return;
    case OpKind::collective:
      comm_.collective(op, static_cast<int>(i));
      return;
    case OpKind::send:
      comm_.send(op, static_cast<int>(i));
      return;
    case OpKind::recv:
      comm_.recv(op, static_cast<int>(i));
      return;
    case OpKind::copy_h2d:
    case OpKind::copy_d2h:
      offload_.copy(op, static_cast<int>(i));
      return;
    case OpKind::host_compute:
      offload_.host_compute(op, static_cast<int>(i));
      return;
    default:
      throw NotSupported("op " + op_name(op) + " (" + to_string(op.kind) +
                         ") is not executed by the runtime yet");
  }
}

StepResult Dispatcher::step(int64_t s) {
  StepResult result;
  result.step = s;
  rank_.current_step.result = &result;
  rank_.current_step.index = s;
  rank_.current_step.loss_sum = 0;
  rank_.requests.last_dp_reduce = -1;
  rank_.current_step.t0 = Clock::now();
  rank_.backend.fill(rank_.shards.model.grads, 0.0f);
  rank_.shards.staging.clear();
  result.timings.reserve(rank_.stage_program->ops.size());
  rank_.requests.timing_slot.clear();
  sample_memory();
  run_ahead_.start();
  for (uint32_t i = 0; i < rank_.stage_program->ops.size(); ++i) {
    if (rank_.streams.issued[i]) continue;
    const Op& op = rank_.stage_program->ops[i];
    if (op.kind == OpKind::free && op.stream == Stream::dp_comm && !deps_landed(i)) {
      // The buffer a reduction still reads goes when that reduction lands, as on the Program's
      // dp stream: the rank goes on meanwhile.
      rank_.streams.pending_frees.push_back(i);
      continue;
    }
    // The dp stream is in order: a buffer it allocates (a reduce-scatter's piece) follows the
    // frees before it, which wait for their reductions. On the CPU backend every alloc does:
    // MPI moves a reduction on only inside MPI calls and ranks share cores, so it lands late by
    // the host's scheduling, not by the network the forecast models; holding the Program's
    // memory order costs the rank no more than the late peer costs it at its next collective.
    if (op.kind == OpKind::alloc &&
        (op.stream == Stream::dp_comm || rank_.streams.allocs_follow_frees))
      drain_frees_before(i);
    if (op.kind == OpKind::alloc && rank_.streams.allocs_follow_frees)
      run_ahead_.land_reductions_before(rank_.streams.last_compute);
    complete_deps(i);
    // (It may have run ahead while the rank waited.) A free is marked first: while it waits
    // for its buffer's readers the streams run ahead, and must not run it again. (Other ops
    // are not: what waits for them must not start while they run.)
    if (!rank_.streams.issued[i]) {
      if (op.kind == OpKind::free) rank_.streams.issued[i] = 1;
      run_timed(i);
    }
    rank_.streams.reached = i;
    poll_sends();
    poll_frees();
    // The streams go on where time passes on the rank: after its computations, and while it
    // waits (complete). Issuing a transfer, an alloc or a free takes no time in the Program
    // (nor on a device, where the host runs ahead): a stream's op that landed between two such
    // ops would take a place before the second that the simulator's ranks never give it.
    if (op.kind == OpKind::compute || op.kind == OpKind::host_compute) {
      rank_.streams.last_compute = i;
      run_ahead_.run();
    }
    sample_memory();
  }
  complete_all();
  poll_frees();
  rank_.current_step.micro.clear();
  rank_.shards.staging.clear();
  rank_.buffers.users.clear();
  sample_memory();
  // Mean loss over the global batch: the last stage's tp rank 0 of every replica contributes.
  double loss = rank_.current_step.loss_sum;
  rank_.parallel.world().all_reduce_sum(&loss, 1);
  const double tokens = double(rank_.plan.global_batch) * rank_.model_spec.seq_len;
  result.loss = static_cast<float>(loss / tokens);
  result.time_s = std::chrono::duration<double>(Clock::now() - rank_.current_step.t0).count();
  result.high_water_bytes = rank_.buffers.ledger->high_water();
  result.host_high_water_bytes = rank_.offload.ledger->high_water();
  rank_.current_step.result = nullptr;
  return result;
}

}  // namespace stratagem::exec
