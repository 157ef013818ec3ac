// The Program's prefetching streams run ahead of the rank's place in the Program, as the
// simulator's streams do: the next op of the h2d stream (weight fetches of offloaded layers,
// activation reloads) and of the dp stream (ZeRO-3 weight gathers, the free of staged
// gradients) starts once the op before it on its stream and everything it depends on have
// landed, so the next layer's weights come up while this one computes. Each stream still issues its
// ops in its own order, so every rank of a group issues the group's collectives in one order.
#include "src/runtime/exec/run_ahead.hpp"

#include <algorithm>

#include "src/runtime/exec/dispatch.hpp"
#include "src/runtime/exec/rank_context.hpp"
#include "stratagem/parallel_state.hpp"

namespace stratagem::exec {

namespace {
// What may run ahead: work that only fills its own buffer, and the free of staged gradients and
// of a reduce-scatter's received piece once it has landed (as the simulator's dp stream frees
// them). The
// optimizer's copy of updated weights writes the weights the rank computes with; reductions
// read gradients the rank is still writing; other frees keep their place.
bool prefetch_op(const Op& op) {
  if (op.block == Block::optimizer || op.phase == Phase::optimizer) return false;
  if (op.kind == OpKind::free)  // staged gradients, a reduce-scatter's received piece
    return op.stream == Stream::dp_comm &&
           (op.category == MemCategory::grads || op.category == MemCategory::buffers);
  if (op.kind == OpKind::alloc)
    return op.category == MemCategory::buffers || op.category == MemCategory::activations ||
           op.category == MemCategory::weights;
  if (op.stream == Stream::h2d) return op.kind == OpKind::copy_h2d;
  return op.kind == OpKind::collective && op.collective == Collective::all_gather &&
         op.group == GroupKind::dp;
}
}  // namespace

void RunAhead::start() {
  if (rank_.streams.ahead.empty()) {
    for (Stream s : {Stream::h2d, Stream::dp_comm}) {
      Streams::Ahead a;
      for (uint32_t i = 0; i < rank_.stage_program->ops.size(); ++i)
        if (rank_.stage_program->ops[i].stream == s) a.ops.push_back(i);
      if (!a.ops.empty()) rank_.streams.ahead.push_back(std::move(a));
    }
  }
  if (!rank_.streams.shared_comms_known) {
    // Groups with the same members share one communicator (ParallelState), and each
    // communicator's collectives must start in one order on every member: a gather whose
    // communicator another stream uses keeps its place in the Program.
    for (const Op& op : rank_.stage_program->ops)
      if (op.kind == OpKind::collective && op.stream != Stream::dp_comm)
        rank_.streams.shared_comms.insert(&rank_.group_of(op));
    rank_.streams.shared_comms_known = true;
    // MPI progresses non-blocking collectives of different communicators in any order. NCCL
    // asks every rank to issue the operations of concurrently used communicators in one order
    // (a device backend's collectives keep the Program's order, which is the same on all
    // ranks), and its gathers run on the device's own streams anyway.
    rank_.streams.collectives_run_ahead = rank_.backend.name() == "cpu";
    rank_.streams.allocs_follow_frees = rank_.backend.name() == "cpu";
  }
  for (Streams::Ahead& a : rank_.streams.ahead) a.next = 0;
  rank_.streams.reached = -1;
  rank_.streams.last_compute = -1;
  rank_.streams.issued.assign(rank_.stage_program->ops.size(), 0);
}

bool RunAhead::waits_only_on_issued(uint32_t j) const {
  const Op& op = rank_.stage_program->ops[j];
  const uint32_t* deps = rank_.stage_program->deps_of(op);
  for (uint32_t d = 0; d < op.dep_count; ++d)
    if (int64_t(deps[d]) > rank_.streams.reached && !rank_.streams.issued[deps[d]]) return false;
  return true;
}

bool RunAhead::may_run(const Streams::Ahead& a, uint32_t j) {
  const Op& op = rank_.stage_program->ops[j];
  if (!prefetch_op(op) || !waits_only_on_issued(j)) return false;
  if (a.next > 0 && !rank_.requests.landed(static_cast<int>(a.ops[a.next - 1]))) return false;
  const uint32_t* deps = rank_.stage_program->deps_of(op);
  for (uint32_t d = 0; d < op.dep_count; ++d)
    if (!rank_.requests.landed(static_cast<int>(deps[d]))) return false;
  if (op.kind == OpKind::collective && (!rank_.streams.collectives_run_ahead ||
                                        rank_.streams.shared_comms.count(&rank_.group_of(op))))
    return false;
  if (op.kind != OpKind::alloc && op.category == MemCategory::weights) {
    // The weights are bound to one fetch buffer at a time: while an earlier buffer of the same
    // tensors is in use, this fetch waits for its place in the Program.
    const int buf = rank_.buffers.of(op.block, op.phase, op.layer, op.microbatch);
    if (rank_.shards.fetched.count(buf))
      return true;  // placed by its h2d copy: the gather fills it
    Micro* m = op.microbatch >= 0 ? &rank_.mb(op.microbatch) : nullptr;
    for (const ParamInfo* e : rank_.fetch_set(op, m))
      for (const auto& [other, bound] : rank_.shards.fetched)
        if (std::find(bound.begin(), bound.end(), e) != bound.end()) return false;
  }
  return true;
}

void RunAhead::free_landed_before(uint32_t j) {
  // Memory events follow program order where both may happen: a dp-stream free the Program
  // puts before this alloc, whose reduction has landed, goes first (as on the simulator's dp
  // stream), so an alloc that runs ahead never holds memory beside a buffer already released.
  // A free on the rank's own stream is at the same instant when only ops that take no time lie
  // between the rank's place and it (no computation, no alloc still to run, which the free must
  // not overtake): it goes first too (the next micro-batch's first fetches otherwise meet the
  // last layer's buffer, the layer below's backward prefetch the mlp's activations).
  bool at_rank = true;
  for (uint32_t i = static_cast<uint32_t>(rank_.streams.reached + 1); i < j; ++i) {
    const Op& op = rank_.stage_program->ops[i];
    if (op.kind == OpKind::compute || (op.kind == OpKind::alloc && !rank_.streams.issued[i]))
      at_rank = false;
    const bool placed = op.stream == Stream::dp_comm || (at_rank && op.stream == Stream::compute);
    if (op.kind != OpKind::free || !placed || rank_.streams.issued[i]) continue;
    if (!waits_only_on_issued(i) || !dispatcher_.deps_landed(i) || rank_.streams.pending(i)) {
      // The rank's stream is in order: a free still waiting (the activations' free for the
      // block's tp reduction) holds the frees after it. The next one may be the layer's fetched
      // weights, whose norm weight that reduction's completion reads.
      if (op.stream == Stream::compute) at_rank = false;
      continue;
    }
    dispatcher_.complete_deps(i);
    if (rank_.streams.issued[i]) continue;  // the streams ran it while it waited
    rank_.streams.issued[i] = 1;            // first: a free waits for its readers, streams run on
    dispatcher_.run(i);
  }
}

bool RunAhead::run() {
  // Not from inside itself: an op it runs may wait (a free, for its buffer's readers), and
  // while it does the streams' places are this call's.
  if (rank_.streams.running_ahead) return false;
  struct Running {
    bool& flag;
    explicit Running(bool& f) : flag(f) { flag = true; }
    ~Running() { flag = false; }
  } running(rank_.streams.running_ahead);
  bool ran = false;
  for (Streams::Ahead& a : rank_.streams.ahead) {
    while (a.next < a.ops.size()) {
      const uint32_t j = a.ops[a.next];
      // A free the rank passed that waits for its reduction (pending_frees) holds its stream.
      if (rank_.streams.pending(j)) break;
      if (int64_t(j) > rank_.streams.reached && !rank_.streams.issued[j]) {
        if (!may_run(a, j)) break;
        if (rank_.stage_program->ops[j].kind == OpKind::alloc) free_landed_before(j);
        // (A free: the reduction's completion reads the buffer.)
        const bool free = rank_.stage_program->ops[j].kind == OpKind::free;
        if (free) dispatcher_.complete_deps(j);
        if (!rank_.streams.issued[j]) {  // (unless that ran it)
          // A free is marked first, as at the rank's place (Dispatcher::step); other ops after, so
          // that nothing waiting for them starts while they run.
          if (free) rank_.streams.issued[j] = 1;
          dispatcher_.run_timed(j);
          rank_.streams.issued[j] = 1;
          ran = true;
        }
      }
      ++a.next;
    }
  }
  return ran;
}

void RunAhead::land_reductions_before(int64_t compute) {
  // CPU backend, at an alloc: a reduction issued before the rank's last computation has had
  // that computation's time to land, as it has in the forecast, whose network moves on while
  // the rank computes. Here 8 ranks share 2 cores and the peers' scheduling decides when it
  // lands; the dp stream's frees that wait only for such reductions go first, so that the
  // memory the Program's order allows is the forecast's, not the host's (a layer's staged
  // gradients beside the next layer's after its recompute: +29% grads in half the runs).
  for (Streams::Ahead& a : rank_.streams.ahead) {
    while (a.next < a.ops.size()) {
      const uint32_t j = a.ops[a.next];
      // A free the rank passed that waits for its reduction (pending_frees) holds its stream.
      if (rank_.streams.pending(j)) break;
      if (rank_.streams.issued[j] || int64_t(j) <= rank_.streams.reached) {  // run already
        ++a.next;
        continue;
      }
      const Op& op = rank_.stage_program->ops[j];
      if (op.kind != OpKind::free || op.stream != Stream::dp_comm || !prefetch_op(op)) break;
      // (An op before the rank's last computation has been issued: only frees are passed over.)
      const uint32_t* deps = rank_.stage_program->deps_of(op);
      if (!std::all_of(deps, deps + op.dep_count, [&](uint32_t d) { return int64_t(d) < compute; }))
        break;
      // (While it waits, the streams run ahead, and may run this free themselves.)
      dispatcher_.complete_deps(j);
      if (!rank_.streams.issued[j]) {
        rank_.streams.issued[j] = 1;
        dispatcher_.run_timed(j);
      }
    }
  }
}

bool RunAhead::may_soon_run() const {
  for (const Streams::Ahead& a : rank_.streams.ahead) {
    if (a.next >= a.ops.size()) continue;
    const uint32_t j = a.ops[a.next];
    if (int64_t(j) > rank_.streams.reached && prefetch_op(rank_.stage_program->ops[j]) &&
        waits_only_on_issued(j))
      return true;
  }
  return false;
}

}  // namespace stratagem::exec
