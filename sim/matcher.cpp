// What reaches the system layer from outside its own calls: the events of its collectives,
// transfers and deliveries, and the messages of other processes (see matcher.hpp).
#include "sim/matcher.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace stratagem::sim {

void Matcher::handle(const Ev& e) {
  switch (e.type()) {
    case kEvColl:
    case kEvCollDone: {
      const Coll& c = collectives_[int(e.id)];
      if (!c.live || e.ver != c.ver) return;
      if (e.type() == kEvColl)
        coll_data_done(int(e.id), e.t);
      else
        coll_finish(int(e.id), e.t);
      return;
    }
    case kEvXfer:
    case kEvXferDone: {
      const Xfer& x = transfers_[int(e.id)];
      if (!x.live || e.ver != x.ver) return;
      if (e.type() == kEvXfer)
        xfer_data_done(int(e.id), e.t);
      else
        xfer_done(int(e.id), e.t);
      return;
    }
    case kEvDeliver: {
      const Delivery d = deliveries_[int(e.id)];
      deliveries_.release(int(e.id));
      deliver(d.dst, d.ch, d.seq, d.arrival, d.xfer, e.t);
      return;
    }
    default:
      throw std::logic_error("simulate: the system layer got an event of the rank streams");
  }
}

void Matcher::apply(const Msg& m, Time now) {
  // The lookahead guarantees that nothing received takes effect before the current horizon.
  if (m.effect < now)
    throw std::logic_error("simulate: a cross-process event for t=" + std::to_string(m.effect) +
                           " arrived at t=" + std::to_string(now) + " (lookahead violated)");
  switch (m.type) {
    case kMsgArrive: {
      const int id = collectives_.open(m.i0, m.u, int(pdes_.partition().group_procs[m.i0].size()));
      Coll& c = collectives_[id];
      ++c.arrived;
      c.last_arrival = std::max(c.last_arrival, m.t0);
      if (c.arrived == c.size) coll_start(id, now);
      return;
    }
    case kMsgFinish: {
      const int id = collectives_.instance(m.i0);
      if (id < 0 || collectives_[id].ordinal != m.u)
        throw std::logic_error("simulate: finish of an unknown collective");
      Coll& c = collectives_[id];
      --c.finish_pending;
      c.value = std::max(c.value, m.t0);
      if (c.local_done && c.finish_pending == 0)
        queue_.push(c.value, kEvCollDone, uint32_t(id), c.ver);
      return;
    }
    case kMsgJoin:
      join_flow(m.i0, m.x, m.y, m.t0, kOwnForeign, -1, 0, now);
      return;
    case kMsgDeliver: {
      const int id = deliveries_.acquire();
      deliveries_[id] = {m.i0, m.i1, m.u, m.t0, m.t1};
      queue_.push(m.t0, kEvDeliver, uint32_t(id), 0);
      return;
    }
  }
}

}  // namespace stratagem::sim
