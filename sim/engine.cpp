// The discrete-event simulator's core: setup, the event loop, and how a rank's streams start and
// complete ops (see engine.hpp and sim/README.md).
#include "sim/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "sim/accounting.hpp"
#include "sim/tunables.hpp"
#include "stratagem/error.hpp"

namespace stratagem {
namespace sim {

// ================================================================================ setup ====

void Engine::setup() {
  iterations_ = std::max(1, options_.iterations);
  pdes_.init(options_.comm);
  const double f =
      options_.interference > 0 ? options_.interference : cluster_.gpu.compute_comm_interference;
  slowed_rate_ = std::clamp<int64_t>(std::llround(double(kS) / std::max(1.0, f)), 1, kS);
  memory_.init(cluster_);
  if (int(program_.stages.size()) != layout_.pp())
    throw std::runtime_error("simulate: the program has " + std::to_string(program_.stages.size()) +
                             " stages but the layout " + std::to_string(layout_.pp()));
  if (options_.mirror && pdes_.procs() != layout_.world_size())
    throw InputError("simulate --mirror: the MPI world has " + std::to_string(pdes_.procs()) +
                     " processes but the plan needs " + std::to_string(layout_.world_size()) +
                     " (one process per simulated rank)");
  const bool lookahead = pdes_.procs() > 1;  // the PDES lower bounds
  stages_ = build_stages(program_, costs_, lookahead, consumed_program_);
  world_size_ = layout_.world_size();
  gpus_per_node_ = std::max(1, cluster_.node.gpus_per_node);
  init_ranks(ranks_, stages_, rank_groups_, layout_, gpus_per_node_);
  for (StageData& sd : stages_) cost_rank_classes(sd, layout_, cluster_, costs_, lookahead);
  symmetry_ = options_.full || options_.mirror
                  ? no_symmetry(world_size_)
                  : find_symmetry(ranks_, stages_, rank_groups_, layout_, gpus_per_node_);
  for (int r : symmetry_.reps) {
    RankState& rk = ranks_[r];
    rk.nic_mult = symmetry_.nic_mult[r];
    // cp ring channels point at the representatives of the ring neighbours (symmetry.hpp).
    for (int ch = 2; ch < 4; ++ch)
      if (rk.channels[ch].peer >= 0) rk.channels[ch].peer = symmetry_.rep_of[rk.channels[ch].peer];
    rk.channel_of_key[3] = rk.channels[3].peer == rk.channels[2].peer ? 2 : 3;
  }
  stats_.symmetric = symmetry_.reduced;
  stats_.simulated_ranks = int(symmetry_.reps.size());
  // A collective waits for the members that are simulated.
  std::vector<int32_t> group_sizes;
  for (const auto& g : layout_.groups()) {
    int32_t n = 0;
    for (int m : g.ranks) n += symmetry_.rep_of[m] == m;
    group_sizes.push_back(n);
  }
  matcher_.init(group_sizes);
  network_.init(world_size_, gpus_per_node_, &matcher_);
  pdes_.distribute(layout_, network_, gpus_per_node_, options_.mirror, symmetry_.rep_of, ranks_,
                   stages_, rank_groups_);
  const std::vector<int>& local_ranks = pdes_.partition().local_ranks;
  for (int r : local_ranks) {
    RankState& rk = ranks_[r];
    rk.result.rank = r;
    rk.result.stage = rk.stage;
    memory_.init_peak(rk.result, stages_[rk.stage].workspace_bytes, stages_[rk.stage].process);
  }
  trace_.init(options_.record_trace, local_ranks.size());
}

// ========================================================================= event loop ====

SimResult Engine::run() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  setup();
  const auto t1 = clock::now();
  stats_.processes = pdes_.procs();
  now_ = 0;
  for (int r : pdes_.partition().local_ranks) mark_dirty(ranks_[r]);
  const Time last = pdes_.procs() == 1 ? run_until(kNever) : pdes_.run(*this);
  stats_.windows = pdes_.windows();
  stats_.messages = pdes_.messages();
  const auto t2 = clock::now();
  stats_.setup_s = std::chrono::duration<double>(t1 - t0).count();
  stats_.run_s = std::chrono::duration<double>(t2 - t1).count();
  return results(last);
}

Time Engine::run_until(Time H) {
  if (!dirty_ranks_.empty()) flush_dirty(now_);
  while (!queue_.empty() && queue_.top().t < H) {
    const Time t = queue_.top().t;
    // Every event is pushed at most one op's duration past the clock: the clock stops here, in
    // range, instead of wrapping or saturating.
    if (t > kMaxClockNs) refuse_beyond_clock("the simulated clock", double(t) * 1e-9);
    now_ = t;
    last_event_ = t;
    do {
      const Ev e = queue_.top();
      queue_.pop();
      ++stats_.heap_events;
      handle(e);
    } while (!queue_.empty() && queue_.top().t == t);
    flush_dirty(t);
  }
  return last_event_;
}

void Engine::receive(const std::vector<Msg>& received, Time horizon) {
  // Received events take effect at or after the horizon; apply them there.
  if (horizon != kNever) now_ = std::max(now_, horizon);
  for (const Msg& m : received) matcher_.apply(m, now_);
  matcher_.flush_owners();
}

void Engine::flush_dirty(Time t) {
  while (!dirty_ranks_.empty()) {
    ranks_to_advance_.swap(dirty_ranks_);
    std::sort(ranks_to_advance_.begin(), ranks_to_advance_.end());
    for (int r : ranks_to_advance_) {
      RankState& rk = ranks_[r];
      rk.dirty = false;
      advance(rk, t);
    }
    ranks_to_advance_.clear();
  }
}

void Engine::handle(const Ev& e) {
  switch (e.type()) {
    case kEvCompute: {
      RankState& r = ranks_[e.id];
      if (!r.kernel.running || e.ver != r.kernel.ver) return;
      r.kernel.running = false;
      const int s = int(Stream::compute);
      const StageData& sd = stages_[r.stage];
      charge_busy(r, sd.steps[s][r.position[s]], e.t - r.op_start[s]);
      r.last_compute_end = e.t;
      complete_op(r, s, e.t, false);
      return;
    }
    case kEvOpEnd:
      complete_op(ranks_[e.id], int(e.ver), e.t, false);
      return;
    case kEvColl:
    case kEvCollDone:
    case kEvXfer:
    case kEvXferDone:
    case kEvDeliver:
      matcher_.handle(e);
      return;
    case kEvHost:
      mark_dirty(ranks_[e.id]);
      return;
  }
}

// ============================================================== a rank's streams ====

// Starts every op that can start now, in stream order; an op that completes at once (alloc,
// free, a recv whose data is there, a zero-cost op) lets its stream and the streams waiting for
// it go on at the same time.
void Engine::advance(RankState& r, Time t) {
  const StageData& sd = stages_[r.stage];
  // Passes over the streams while one made progress. A stream's look at its head depends only
  // on the rank's state, which only a start changes: a pass that has started nothing yet skips
  // the streams last looked at after every start of the pass before (those from `redo` on),
  // which would find what they found then. The same ops start in the same order as with full
  // passes.
  bool progress = true;
  int redo = kStreams;
  while (progress) {
    progress = false;
    bool started = false;
    int next = 0;
    for (int s = 0; s < kStreams && (started || s < redo); ++s) {
      while (!r.running[s] && !stream_done(r, sd, s, iterations_)) {
        const Step& step = sd.steps[s][r.position[s]];
        if (!head_ready(r, sd, s, step)) break;
        if (sd.host_issue && !host_issued(r, sd, s, step, t)) break;
        // Memory events at one instant follow program order, as the rank issues them: an
        // alloc on another stream that the Program puts before this free (a reload emitted
        // before the buffers it outlives go) happens first, and the peak holds both, as the
        // runtime and the estimator count it.
        if (step.kind == OpKind::free && step.key &&
            earlier_alloc_ready(r, sd, s, r.iteration[s], step.op, iterations_)) {
          progress = true;
          next = s + 1;
          break;
        }
        started = true;
        next = s + 1;
        if (!start_op(r, sd, s, step, t)) break;
        progress = true;
      }
    }
    redo = next;
  }
}

// Whether the host has issued `step` (at the head of stream s) by t; if not, a wake-up at the
// time it will have. The host issues an iteration's ops in program order from when the rank
// finished the iteration before (StageData::host_issue).
bool Engine::host_issued(RankState& r, const StageData& sd, int s, const Step& step, Time t) {
  if (r.iteration[s] != r.host_iteration) return r.iteration[s] < r.host_iteration;
  const Time issue = r.host_origin + sd.issue_ns[step.op];
  if (issue <= t) return true;
  if (r.host_wake != issue) {
    r.host_wake = issue;
    queue_.push(issue, kEvHost, uint32_t(r.rank), 0);
  }
  return false;
}

// Returns whether the op completed at once.
bool Engine::start_op(RankState& r, const StageData& sd, int s, const Step& step, Time t) {
  const uint32_t op = step.op;
  r.op_start[s] = t;
  switch (step.kind) {
    case OpKind::alloc:
    case OpKind::free: {
      // From the Step alone (s is the op's stream): the Op record is not read per event.
      memory_.apply(r.memory, r.result, step.mem_category, step.mem_bytes, r.rank, op,
                    int32_t(r.iteration[s]), sd.workspace_bytes, sd.process, t,
                    step.kind == OpKind::alloc ? 1 : -1, trace_.memory_of(r.local_index));
      complete_op(r, s, t, true);
      return true;
    }
    case OpKind::compute:
      if (s == int(Stream::compute)) {
        charge_gap(r, sd, step, t);
        if (step.compute_ns == 0) {
          r.last_compute_end = t;
          complete_op(r, s, t, true);
          return true;
        }
        start_compute(r, step, t);
        return false;
      }
      [[fallthrough]];
    case OpKind::host_compute:
      if (step.compute_ns == 0) {
        complete_op(r, s, t, true);
        return true;
      }
      r.running[s] = 1;
      queue_.push(t + step.compute_ns, kEvOpEnd, uint32_t(r.rank), uint32_t(s));
      return false;
    case OpKind::collective:
      r.running[s] = 1;
      matcher_.arrive(r, sd, s, step, t);
      return false;
    case OpKind::send:
      r.running[s] = 1;
      matcher_.start_send(r, sd, s, step, t);
      return false;
    case OpKind::recv:
      return matcher_.start_recv(r, s, step, t);
    case OpKind::copy_d2h:
    case OpKind::copy_h2d:
      r.running[s] = 1;
      matcher_.start_copy(r, sd, s, step, t);
      return false;
  }
  return false;
}

void Engine::start_compute(RankState& r, const Step& step, Time t) {
  r.running[int(Stream::compute)] = 1;
  r.kernel.running = true;
  r.kernel.remaining = step.compute_ns * kS;
  r.kernel.ref = t;
  r.kernel.end = kernel_end(r.kernel, r.moving_since, slowed_rate_);
  queue_.push(r.kernel.end, kEvCompute, uint32_t(r.rank), ++r.kernel.ver);
}

}  // namespace sim

SimResult simulate(const Program& program, const Layout& layout, const ClusterSpec& cluster,
                   const OpCosts& costs, const SimOptions& options) {
  SimResult r = sim::Engine(program, layout, cluster, costs, options).run();
  if (r.deadlock.deadlocked && r.stats.symmetric) {
    // The deadlock report names the stuck ranks one by one: run every rank.
    SimOptions full = options;
    full.full = true;
    r = sim::Engine(program, layout, cluster, costs, full).run();
  }
  return r;
}

SimResult simulate_consuming(Program&& program, const Layout& layout, const ClusterSpec& cluster,
                             const OpCosts& costs, const SimOptions& options) {
  int procs = 1;
  if (options.comm != MPI_COMM_NULL) MPI_Comm_size(options.comm, &procs);
  // The PDES lookahead, traces and mirrored runs read the ops after setup.
  if (procs > 1 || options.record_trace || options.mirror)
    return simulate(program, layout, cluster, costs, options);
  return sim::Engine(program, layout, cluster, costs, options, &program).run();
}

}  // namespace stratagem
