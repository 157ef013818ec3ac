// Parallel simulation: partition, lookahead and message exchange (see pdes.hpp).
#include "sim/pdes.hpp"

#include <sched.h>

#include <algorithm>

namespace stratagem::sim {
namespace {

// Lower bound of the start of op x (iteration itx) of rank r: the latest of the chains of
// ops on each stream that x depends on, each run at its uncontended duration.
Time lb_start(const RankState& r, const StageData& sd, uint32_t x, uint32_t itx, Time glb) {
  Time lb = glb;
  const auto& md = sd.least_duration_ns[r.rank_class];
  for (int s = 0; s < kStreams; ++s) {
    const int32_t a = sd.anchors[x][s];
    if (a < 0) continue;
    const uint32_t ih = r.iteration[s], ph = r.position[s];
    if (ih > itx || (ih == itx && ph > uint32_t(a))) continue;  // already done
    const uint32_t h = sd.steps[s][ph].op;
    const Time head_end = r.running[s] ? std::max(glb, r.op_start[s] + md[h]) : glb + md[h];
    const auto& pf = sd.least_duration_prefix_ns[r.rank_class][s];
    const Time total = pf[sd.stream_length[s]];
    const Time sum = (Time(itx) * total + pf[a + 1]) - (Time(ih) * total + pf[ph + 1]);
    lb = std::max(lb, head_end + sum);
  }
  return lb;
}

}  // namespace

void wait_yielding(MPI_Request* req) {
  int done = 0;
  for (int spin = 0;; ++spin) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (spin > 64) sched_yield();
  }
}

Partition partition_ranks(const Layout& layout, const Network& net, int gpus_per_node, int procs,
                          int me, bool mirror, bool single, const std::vector<int32_t>& rep_of) {
  const int W = layout.world_size();
  const int G = gpus_per_node;
  auto simulated = [&](int r) { return rep_of[r] == r; };
  int S = 0;
  for (int r = 0; r < W; ++r) S += simulated(r);
  Partition part;
  part.me = me;
  part.owner.assign(W, 0);
  if (procs > 1 && !single) {
    const int pp = layout.pp();
    for (int r = 0, i = 0; r < W; ++r) {
      if (mirror)
        part.owner[r] = r;
      else if (procs <= pp)
        part.owner[r] = int(int64_t(layout.coords(r).stage) * procs / pp);
      else
        part.owner[r] = int(int64_t(i) * procs / S);  // i: index among the simulated ranks
      i += simulated(r);
    }
  }
  for (int r = 0; r < W; ++r)
    if (!simulated(r)) part.owner[r] = -1;
  for (int r = 0; r < W; ++r)
    if (part.owner[r] == me) part.local_ranks.push_back(r);
  const auto& groups = layout.groups();
  part.group_procs.assign(groups.size(), {});
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& pr = part.group_procs[g];
    for (int m : groups[g].ranks)
      if (simulated(m)) pr.push_back(part.owner[m]);
    std::sort(pr.begin(), pr.end());
    pr.erase(std::unique(pr.begin(), pr.end()), pr.end());
  }
  const int nodes = (W + G - 1) / G;
  part.res_holders.assign(net.size(), {});
  for (int n = 0; n < nodes; ++n) {
    std::vector<int> h;
    for (int r = n * G; r < std::min(W, (n + 1) * G); ++r)
      if (simulated(r)) h.push_back(part.owner[r]);
    std::sort(h.begin(), h.end());
    h.erase(std::unique(h.begin(), h.end()), h.end());
    if (h.size() > 1) part.res_holders[net.nic_of_node(n)] = h;
  }
  part.group_nic_shared.assign(groups.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int m : groups[g].ranks)
      if (part.owner[m] == me && !part.res_holders[net.nic_of_node(m / G)].empty())
        part.group_nic_shared[g] = 1;
  return part;
}

bool Mailbox::any() const {
  for (const auto& b : out_)
    if (!b.empty()) return true;
  return false;
}

Time Mailbox::earliest_effect() const {
  Time eot = kNever;
  for (const auto& box : out_)
    for (const Msg& m : box) eot = std::min(eot, m.effect);
  return eot;
}

std::vector<Msg> Mailbox::exchange(MPI_Comm comm) {
  const int P = int(out_.size());
  std::vector<int> scount(P), rcount(P), sdisp(P), rdisp(P);
  for (int p = 0; p < P; ++p) scount[p] = int(out_[p].size() * sizeof(Msg));
  MPI_Request req;
  MPI_Ialltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, comm, &req);
  wait_yielding(&req);
  int stot = 0, rtot = 0;
  for (int p = 0; p < P; ++p) {
    sdisp[p] = stot;
    rdisp[p] = rtot;
    stot += scount[p];
    rtot += rcount[p];
  }
  std::vector<Msg> sbuf(stot / sizeof(Msg)), rbuf(rtot / sizeof(Msg));
  size_t at = 0;
  for (int p = 0; p < P; ++p) {
    std::copy(out_[p].begin(), out_[p].end(), sbuf.begin() + at);
    at += out_[p].size();
    out_[p].clear();
  }
  MPI_Ialltoallv(sbuf.data(), scount.data(), sdisp.data(), MPI_BYTE, rbuf.data(), rcount.data(),
                 rdisp.data(), MPI_BYTE, comm, &req);
  wait_yielding(&req);
  return rbuf;
}

// Ops whose execution sends events to other processes, with the least delay between the op's
// start and the effect of those events.
bool Lookahead::init(int procs, const Partition& part, const std::vector<RankState>& ranks,
                     const std::vector<StageData>& stages, const std::vector<int32_t>& rank_groups,
                     const Network& net) {
  bool unsafe = false;
  clear(part.local_ranks.size());
  if (procs == 1) return !unsafe;
  for (int r : part.local_ranks) {
    const RankState& rk = ranks[r];
    const StageData& sd = stages[rk.stage];
    bool any = !part.res_holders[net.nic_of_node(rk.node)].empty();
    for (size_t k = 0; k < sd.group_keys.size(); ++k) {
      const int g = rank_groups[rk.group_row + k];
      if (g >= 0 && (part.group_procs[g].size() > 1 || part.group_nic_shared[g])) any = true;
    }
    for (int ch = 0; ch < 4; ++ch)
      if (rk.channels[ch].peer >= 0 && !part.local(rk.channels[ch].peer)) any = true;
    if (!any) continue;
    auto& lists = boundary_ops_[rk.local_index];
    for (uint32_t i = 0; i < sd.op_count; ++i) {
      const Op& op = sd.program->ops[i];
      Time delay = kNever;
      if (op.kind == OpKind::collective) {
        const int g = rank_groups[rk.group_row + step_of(sd, i).key];
        if (g < 0) continue;
        const CommSplit& cp = comm_of(sd, rk.rank_class, step_of(sd, i));
        const bool cross = part.group_procs[g].size() > 1;
        const bool shared = cp.link == LinkClass::inter_node && part.group_nic_shared[g];
        if (!cross && !shared) continue;
        delay = cp.head;
        if (cp.head <= 0 || (cross && cp.tail <= 0)) unsafe = true;
      } else if (op.kind == OpKind::send) {
        const int peer = rk.channels[rk.channel_of_key[step_of(sd, i).key]].peer;
        const CommSplit& cp = comm_of(sd, rk.rank_class, step_of(sd, i));
        const bool remote = peer >= 0 && !part.local(peer);
        const int res = net.resource_of(cp.link, r, op.kind);
        const bool shared = res >= 0 && !part.res_holders[res].empty();
        if (!remote && !shared) continue;
        if (remote) {
          delay = cp.total();
          if (cp.tail <= 0 || delay <= 0) unsafe = true;
        }
        if (shared) {
          delay = std::min(delay, cp.head);
          if (cp.head <= 0) unsafe = true;
        }
      } else {
        continue;
      }
      lists[sd.stream_of[i]].push_back({sd.position_of[i], i, delay});
    }
    ranks_with_boundary_ops_.push_back(r);
  }
  return !unsafe;
}

void Lookahead::clear(size_t local_ranks) {
  boundary_ops_.assign(local_ranks, {});
  next_boundary_.assign(local_ranks, {});
  ranks_with_boundary_ops_.clear();
}

Time Lookahead::earliest_output(Time glb, const std::vector<RankState>& ranks,
                                const std::vector<StageData>& stages, int iterations,
                                const CollectiveTable& colls, const TransferPool& xfers) {
  Time eot = kNever;
  const uint32_t K = uint32_t(iterations);
  for (int r : ranks_with_boundary_ops_) {
    const RankState& rk = ranks[r];
    const StageData& sd = stages[rk.stage];
    for (int s = 0; s < kStreams; ++s) {
      const auto& list = boundary_ops_[rk.local_index][s];
      if (list.empty()) continue;
      // Skip the boundary ops the stream has started since the last window.
      auto& [it, k] = next_boundary_[rk.local_index][s];
      while (it < K) {
        const BoundaryOp& b = list[k];
        const bool passed = it < rk.iteration[s] ||
                            (it == rk.iteration[s] && (b.pos < rk.position[s] ||
                                                       (b.pos == rk.position[s] && rk.running[s])));
        if (!passed) break;
        if (++k == list.size()) {
          k = 0;
          ++it;
        }
      }
      if (it >= K) continue;
      const BoundaryOp& b = list[k];
      const Time lb = lb_start(rk, sd, b.op, it, glb);
      eot = std::min(eot, lb + b.delay);
    }
  }
  // In-flight collectives with members elsewhere and remote sends; finished ones leave the lists.
  size_t w = 0;
  for (size_t i = 0; i < cross_colls_.size(); ++i) {
    const auto [id, serial] = cross_colls_[i];
    const Coll& c = colls[id];
    if (!c.live || c.serial != serial || c.local_done) continue;
    cross_colls_[w++] = cross_colls_[i];
    Time lbfin = glb, tail = kNever;
    for (const Member& m : c.members) {
      lbfin = std::max(lbfin, c.start + m.head + m.work);
      tail = std::min(tail, m.tail);
    }
    eot = std::min(eot, lbfin + tail);
  }
  cross_colls_.resize(w);
  w = 0;
  for (size_t i = 0; i < cross_xfers_.size(); ++i) {
    const auto [id, serial] = cross_xfers_[i];
    const Xfer& x = xfers[id];
    if (!x.live || x.serial != serial || x.sent) continue;
    cross_xfers_[w++] = cross_xfers_[i];
    eot = std::min(eot, std::max(glb, x.start + x.head + x.work) + x.tail);
  }
  cross_xfers_.resize(w);
  return eot;
}

}  // namespace stratagem::sim
