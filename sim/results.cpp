// The end of a run: every rank's time accounting against the makespan, deadlock detection, and
// under MPI the results of all processes gathered to process 0 (the same, byte for byte, as one
// process would report).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "sim/accounting.hpp"
#include "sim/engine.hpp"

namespace stratagem::sim {
namespace {

// Gathers each process's bytes to process 0, in process order.
void gather_bytes(MPI_Comm comm, int procs, int me, const void* data, int bytes,
                  std::vector<char>& all) {
  std::vector<int> counts(procs, 0);
  MPI_Gather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm);
  std::vector<int> disp(procs, 0);
  int tot = 0;
  for (int p = 0; p < procs; ++p) disp[p] = tot, tot += counts[p];
  all.resize(me == 0 ? tot : 0);
  MPI_Gatherv(data, bytes, MPI_BYTE, all.data(), counts.data(), disp.data(), MPI_BYTE, 0, comm);
}

template <class T>
void gather_vector(MPI_Comm comm, int procs, int me, std::vector<T>& v) {
  std::vector<char> all;
  gather_bytes(comm, procs, me, v.data(), int(v.size() * sizeof(T)), all);
  if (me == 0) {
    v.resize(all.size() / sizeof(T));
    if (!all.empty()) std::memcpy(v.data(), all.data(), all.size());
  }
}

// Every process keeps the first OOM among its ranks; the run's is the first of those.
void merge_oom(MPI_Comm comm, int procs, int64_t hbm, SimOom& oom) {
  struct OomPod {
    int64_t flag, time, bytes;
    int32_t rank, op, it, pad;
  } mo{oom.oom, oom.time_ns, oom.bytes, oom.rank, oom.op, oom.iteration, 0};
  std::vector<OomPod> all(procs);
  MPI_Allgather(&mo, sizeof mo, MPI_BYTE, all.data(), sizeof mo, MPI_BYTE, comm);
  for (const OomPod& o : all)
    if (o.flag && oom_precedes(o.time, o.rank, oom)) {
      oom.oom = true;
      oom.time_ns = o.time;
      oom.bytes = o.bytes;
      oom.rank = o.rank;
      oom.op = o.op;
      oom.iteration = o.it;
      oom.hbm_bytes = hbm;
    }
}

}  // namespace

SimResult Engine::results(Time last) {
  const MPI_Comm comm = pdes_.comm();
  const int procs = pdes_.procs(), me = pdes_.me();
  const std::vector<int>& local_ranks = pdes_.partition().local_ranks;
  SimResult out;
  out.iterations = iterations_;
  Time end = 0;
  for (int r : local_ranks) end = std::max(end, ranks_[r].end_time);
  bool stuck = false;
  for (int r : local_ranks) stuck |= unfinished(ranks_[r]);
  if (procs > 1) {
    int64_t loc[2] = {end, last}, glo[2];
    MPI_Allreduce(loc, glo, 2, MPI_INT64_T, MPI_MAX, comm);
    end = glo[0];
    last = glo[1];
    int st = stuck, any = 0;
    MPI_Allreduce(&st, &any, 1, MPI_INT, MPI_MAX, comm);
    stuck = any;
  }
  out.makespan_ns = end;
  std::vector<SimRankResult> mine;
  std::vector<int32_t> represented(symmetry_.reduced ? world_size_ : 0, 0);
  for (int m = 0; m < int(represented.size()); ++m) ++represented[symmetry_.rep_of[m]];
  for (int r : local_ranks) {
    RankState& rk = ranks_[r];
    rk.result.end_ns = rk.end_time;
    rk.result.ops_executed = int64_t(rk.ops_done);
    finish_accounting(rk, end);
    stats_.ops_simulated += rk.ops_done;
    stats_.ops_executed += rk.ops_done * (symmetry_.reduced ? uint64_t(represented[r]) : 1);
    mine.push_back(rk.result);
  }
  // Deadlock: every process describes up to 8 of its stuck ranks.
  std::string desc;
  std::vector<int> stuck_ranks;
  if (stuck) {
    for (int r : local_ranks) {
      if (!unfinished(ranks_[r])) continue;
      stuck_ranks.push_back(r);
      if (stuck_ranks.size() <= 8) desc += "  " + describe_stuck(ranks_[r]) + "\n";
    }
  }
  if (procs > 1) {
    gather_vector(comm, procs, me, mine);
    gather_vector(comm, procs, me, stuck_ranks);
    std::vector<char> all;
    gather_bytes(comm, procs, me, desc.data(), int(desc.size()), all);
    if (me == 0) desc.assign(all.begin(), all.end());
    merge_oom(comm, procs, memory_.hbm_bytes(), memory_.first_oom());
    uint64_t sl[4] = {stats_.ops_executed, stats_.heap_events, stats_.messages,
                      stats_.ops_simulated},
             sg[4];
    MPI_Allreduce(sl, sg, 4, MPI_UINT64_T, MPI_SUM, comm);
    stats_.ops_executed = sg[0];
    stats_.heap_events = sg[1];
    stats_.messages = sg[2];
    stats_.ops_simulated = sg[3];
  }
  std::sort(mine.begin(), mine.end(),
            [](const SimRankResult& a, const SimRankResult& b) { return a.rank < b.rank; });
  if (symmetry_.reduced && (procs == 1 || me == 0)) {
    // Every rank reports what its representative did.
    std::vector<int32_t> at(world_size_, -1);
    for (size_t i = 0; i < mine.size(); ++i) at[mine[i].rank] = int32_t(i);
    std::vector<SimRankResult> all(world_size_);
    for (int m = 0; m < world_size_; ++m) {
      all[m] = mine[at[symmetry_.rep_of[m]]];
      all[m].rank = m;
    }
    mine = std::move(all);
  }
  std::sort(stuck_ranks.begin(), stuck_ranks.end());
  out.ranks = std::move(mine);
  SimOom& oom = memory_.first_oom();
  if (oom.oom) {
    const int st = layout_.coords(oom.rank).stage;
    oom.op_name = consumed_program_
                      ? "op " + std::to_string(oom.op) + " of stage " + std::to_string(st)
                      : op_name(program_.stages[st].ops[oom.op]);
  }
  out.oom = oom;
  if (stuck) {
    out.deadlock.deadlocked = true;
    out.deadlock.time_ns = last;
    out.deadlock.ranks = stuck_ranks;
    out.deadlock.message = deadlock_message(last, stuck_ranks, world_size_, desc);
  }
  out.stats = stats_;
  for (const StageData& sd : stages_) out.host_issue = out.host_issue || sd.host_issue;
  trace_.move_into(out, local_ranks, symmetry_.reduced ? symmetry_.rep_of : std::vector<int32_t>{});
  return out;
}

}  // namespace stratagem::sim
