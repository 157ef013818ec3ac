// The system layer's collectives: members arrive (locally or from other processes), the
// collective starts when the last one arrives, every member's bytes become a flow on its
// resource, and the collective completes at the latest member's finish plus its tail.
#include <algorithm>

#include "sim/matcher.hpp"

namespace stratagem::sim {

void Matcher::arrive(RankState& r, const StageData& sd, int s, const Step& step, Time t) {
  const uint32_t op = step.op;
  const int g = rank_groups_[r.group_row + step.key];
  if (g < 0) {  // no group (e.g. tied embedding with pp == 1): nothing to do
    queue_.push(t, kEvOpEnd, uint32_t(r.rank), uint32_t(s));
    return;
  }
  // A group's members run its collectives in the same order, so (iteration, ordinal among the
  // stage's ops on that group) names the instance on every member.
  const uint64_t ordinal = uint64_t(r.iteration[s]) * sd.ops_per_group_key[step.key] + step.ordinal;
  const int id = collectives_.open(g, ordinal, int(pdes_.partition().group_procs[g].size()));
  Coll& c = collectives_[id];
  const CommSplit& cp = comm_of(sd, r.rank_class, step);
  c.members.push_back(
      {r.rank, uint8_t(s), op, cp.head, cp.tail, cp.work, flow_share(r, cp), cp.link, kNever});
  ++c.arrived;
  c.last_arrival = std::max(c.last_arrival, t);
  if (c.cross)
    for (int p : pdes_.partition().group_procs[g])
      if (p != pdes_.me()) {
        Msg m{};
        m.type = kMsgArrive;
        m.i0 = g;
        m.i1 = r.rank;
        m.u = ordinal;
        m.t0 = t;
        m.effect = t + cp.head;
        pdes_.send(p, m);
      }
  if (c.arrived == c.size) coll_start(id, t);
}

void Matcher::coll_start(int id, Time now) {
  Coll& c = collectives_[id];
  c.started = true;
  c.start = c.last_arrival;
  for (size_t i = 0; i < c.members.size(); ++i) {
    Member& m = c.members[i];
    const Time join = c.start + m.head;
    const int res = m.work > 0 ? network_.resource_of(m.link, m.rank, OpKind::collective) : -1;
    ops_.set_moving_since(ranks_[m.rank], m.stream, join, now);
    if (res >= 0) {
      join_flow(res, m.work * kS, m.share, join, kOwnColl, id, int(i), now);
    } else {
      m.fin = join;
    }
  }
  mark_owner(kOwnColl, id);
  if (c.cross) pdes_.lookahead().track_collective(id, c.serial);
  flush_owners();
}

// Schedules the end of the local members' data movement once every finish is predicted. A
// collective with members elsewhere ends there (kEvColl; the tails follow when all processes
// have reported); a local one completes at the latest finish plus tail.
void Matcher::coll_update(int id) {
  Coll& c = collectives_[id];
  c.owner_dirty = false;
  if (!c.live || !c.started || c.local_done) return;
  Time T = kMinTime;
  for (const Member& m : c.members) {
    if (m.fin == kNever) return;
    T = std::max(T, c.cross ? m.fin : m.fin + m.tail);
  }
  if (T != c.event_time) {
    c.event_time = T;
    queue_.push(T, kEvColl, uint32_t(id), ++c.ver);
  }
}

void Matcher::coll_data_done(int id, Time t) {
  Coll& c = collectives_[id];
  if (!c.cross) {
    coll_finish(id, t);
    return;
  }
  Time v = kMinTime;
  for (const Member& m : c.members) v = std::max(v, m.fin + m.tail);
  c.local_done = true;
  c.value = std::max(c.value, v);
  for (int p : pdes_.partition().group_procs[c.group])
    if (p != pdes_.me()) {
      Msg m{};
      m.type = kMsgFinish;
      m.i0 = c.group;
      m.u = c.ordinal;
      m.t0 = v;
      m.effect = v;
      pdes_.send(p, m);
    }
  if (c.finish_pending == 0) queue_.push(c.value, kEvCollDone, uint32_t(id), c.ver);
}

void Matcher::coll_finish(int id, Time t) {
  const Coll& c = collectives_[id];
  for (const Member& m : c.members) {
    RankState& r = ranks_[m.rank];
    ops_.set_moving_since(r, m.stream, kNever, t);
    ops_.complete_op(r, m.stream, t, false, t - c.start);
  }
  collectives_.close(id);
}

}  // namespace stratagem::sim
