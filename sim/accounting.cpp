// Time accounting of the compute stream (see accounting.hpp).
#include "sim/accounting.hpp"

#include <algorithm>
#include <iterator>

namespace stratagem::sim {

void charge_gap(RankState& r, const StageData& sd, const Step& step, Time t) {
  const Time gap = t - r.last_compute_end;
  if (gap <= 0) return;
  // Issued only now: the host was the last thing the kernel waited for.
  if (sd.host_issue && r.host_iteration == r.iteration[int(Stream::compute)] &&
      r.host_origin + sd.issue_ns[step.op] == t) {
    r.busy_and_waits[kHost] += gap;
    return;
  }
  // Several ops may have completed just now; the kernel is taken to have waited for the first
  // in this order, looking at its dependencies' streams, or at every comm stream if none of
  // those completed now.
  static constexpr Cat prio[] = {kRecv, kCp, kTp, kDp, kPp, kOffload, kEp};
  int best = 99, best_s = -1;
  auto consider = [&](int s) {
    if (r.last_done[s] != t) return;
    for (int p = 0; p < int(std::size(prio)); ++p)
      if (r.last_done_cat[s] == prio[p] && p < best) best = p, best_s = s;
  };
  const uint32_t* d = sd.dep_at.data() + step.dep_begin;
  for (uint32_t k = 0; k < step.dep_count; ++k) consider(int(dep_stream(d[k])));
  if (best == 99)
    for (int s = 1; s < kStreams; ++s) consider(s);
  charge_wait(r, best_s, gap, r.busy_and_waits);
}

void charge_wait(const RankState& r, int s, Time gap, Breakdown& acc) {
  if (s < 0 || r.last_done_cat[s] == kNone) {
    acc[kBubble] += gap;
    return;
  }
  const Cat cat = r.last_done_cat[s] == kRecv ? kPp : Cat(r.last_done_cat[s]);
  const Time part = std::min(gap, std::max<Time>(0, r.last_done_moving_ns[s]));
  acc[cat] += part;
  acc[kBubble] += gap - part;
}

void finish_accounting(RankState& r, Time makespan) {
  Breakdown acc = r.busy_and_waits;
  if (r.end_time > r.last_compute_end) {
    Time best = -1;
    int bs = -1;
    for (int s = 1; s < kStreams; ++s)
      if (r.last_done[s] > best) best = r.last_done[s], bs = s;
    charge_wait(r, bs, r.end_time - r.last_compute_end, acc);
  }
  acc[kBubble] += std::max<Time>(0, makespan - std::max(r.end_time, r.last_compute_end));
  SimRankResult& res = r.result;
  res.compute_ns = acc[kCompute];
  res.recompute_ns = acc[kRecompute];
  res.optimizer_ns = acc[kOptimizer];
  res.tp_ns = acc[kTp];
  res.dp_ns = acc[kDp];
  res.pp_ns = acc[kPp];
  res.bubble_ns = acc[kBubble];
  res.offload_ns = acc[kOffload];
  res.ep_ns = acc[kEp];
  res.cp_ns = acc[kCp];
  res.host_ns = acc[kHost];
}

}  // namespace stratagem::sim
