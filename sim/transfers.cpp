// The system layer's point-to-point transfers. Sends are eager: the bytes start moving when the
// send starts, the send completes when they are delivered, and the receiver's matching recv
// (in order per channel) completes at the later of its start and the arrival. Host copies are
// transfers on the GPU's PCIe link that deliver nowhere.
#include <stdexcept>
#include <string>

#include "sim/matcher.hpp"

namespace stratagem::sim {

// A transfer record with the cost split of its op; the caller fills in what its kind needs.
int Matcher::open_xfer(XKind kind, const RankState& r, int s, Time t, const CommSplit& cp) {
  const int id = transfers_.open();
  Xfer& x = transfers_[id];
  x.kind = kind;
  x.rank = r.rank;
  x.stream = uint8_t(s);
  x.start = t;
  x.head = cp.head;
  x.tail = cp.tail;
  x.work = cp.work;
  return id;
}

void Matcher::start_send(RankState& r, const StageData& sd, int s, const Step& step, Time t) {
  const uint32_t op = step.op;
  const int ch = r.channel_of_key[step.key];
  const int peer = r.channels[ch].peer;
  // A representative's cp ring may send to itself (symmetry.hpp); a pipeline peer never is.
  if (peer < 0 || (peer == r.rank && step.key < 2))
    throw std::runtime_error("simulate: rank " + std::to_string(r.rank) + " op " +
                             std::to_string(op) + " sends to no peer");
  const CommSplit& cp = comm_of(sd, r.rank_class, step);
  const int id = open_xfer(kXSend, r, s, t, cp);
  Xfer& x = transfers_[id];
  x.dst = peer;
  const RankState& q = ranks_[peer];
  // The receiver's key for messages from this rank: a cp send arrives from its previous cp rank.
  x.dst_ch = step.key >= 2 ? 3 : q.channels[0].peer == r.rank ? 0 : 1;
  x.seq = r.channels[ch].sent++;
  x.remote = !pdes_.local(peer);
  ops_.set_moving_since(r, s, t + cp.head, t);
  const int res = cp.work > 0 ? network_.resource_of(cp.link, r.rank, OpKind::send) : -1;
  if (res >= 0) {
    join_flow(res, cp.work * kS, flow_share(r, cp), t + cp.head, kOwnXfer, id, 0, t);
  } else {
    x.fin = t + cp.head;
    mark_owner(kOwnXfer, id);
  }
  if (x.remote) pdes_.lookahead().track_transfer(id, x.serial);
  flush_owners();
}

void Matcher::start_copy(RankState& r, const StageData& sd, int s, const Step& step, Time t) {
  const CommSplit& cp = comm_of(sd, r.rank_class, step);
  const int id = open_xfer(kXCopy, r, s, t, cp);
  Xfer& x = transfers_[id];
  x.remote = false;
  const int res = cp.work > 0 ? network_.resource_of(cp.link, r.rank, step.kind) : -1;
  if (res >= 0) {
    join_flow(res, cp.work * kS, cp.share, t + cp.head, kOwnXfer, id, 0, t);
  } else {
    x.fin = t + cp.head;
    mark_owner(kOwnXfer, id);
  }
  flush_owners();
}

// A local transfer completes at its data's finish plus tail; for a remote receiver the event
// comes at the finish, when the arrival time becomes known and is sent to its process.
void Matcher::xfer_update(int id) {
  Xfer& x = transfers_[id];
  x.owner_dirty = false;
  if (!x.live || x.sent || x.fin == kNever) return;
  const Time T = x.remote ? x.fin : x.fin + x.tail;
  if (T != x.event_time) {
    x.event_time = T;
    queue_.push(T, kEvXfer, uint32_t(id), ++x.ver);
  }
}

void Matcher::xfer_data_done(int id, Time t) {
  Xfer& x = transfers_[id];
  RankState& r = ranks_[x.rank];
  if (x.kind == kXCopy) {
    ops_.complete_op(r, x.stream, t, false, kMovedSinceStart);
    transfers_.close(id);
    return;
  }
  if (!x.remote) {
    ops_.set_moving_since(r, x.stream, kNever, t);
    deliver(x.dst, x.dst_ch, x.seq, t, t - x.start, t);
    ops_.complete_op(r, x.stream, t, false, kMovedSinceStart);
    transfers_.close(id);
    return;
  }
  // Remote receiver: the bytes are through; the arrival is known now.
  const Time a = t + x.tail;
  Msg m{};
  m.type = kMsgDeliver;
  m.i0 = x.dst;
  m.i1 = x.dst_ch;
  m.u = x.seq;
  m.t0 = a;
  m.t1 = a - x.start;
  m.effect = a;
  pdes_.send(pdes_.partition().owner[x.dst], m);
  x.sent = true;
  queue_.push(a, kEvXferDone, uint32_t(id), ++x.ver);
}

void Matcher::xfer_done(int id, Time t) {
  const Xfer& x = transfers_[id];
  RankState& r = ranks_[x.rank];
  ops_.set_moving_since(r, x.stream, kNever, t);
  ops_.complete_op(r, x.stream, t, false, kMovedSinceStart);
  transfers_.close(id);
}

// Returns whether the recv completed at once (its data had arrived).
bool Matcher::start_recv(RankState& r, int s, const Step& step, Time t) {
  Channel& c = r.channels[r.channel_of_key[step.key]];
  const uint64_t seq = c.recvd++;
  if (c.head < c.fifo.size()) {
    const Arrival a = c.fifo[c.head++];
    if (c.head == c.fifo.size()) {
      c.fifo.clear();
      c.head = 0;
    }
    if (a.seq != seq) throw std::logic_error("simulate: pipeline messages out of order");
    ops_.complete_op(r, s, t, true, a.xfer);
    return true;
  }
  r.running[s] = 1;
  c.waiting = true;
  c.wait_seq = seq;
  c.wait_stream = uint8_t(s);
  return false;
}

void Matcher::deliver(int dst, int ch, uint64_t seq, Time a, Time xfer, Time now) {
  RankState& r = ranks_[dst];
  Channel& c = r.channels[r.channel_of_key[ch]];
  if (c.waiting && c.wait_seq == seq) {
    c.waiting = false;
    ops_.complete_op(r, c.wait_stream, now, false, xfer);
    return;
  }
  c.fifo.push_back({seq, a, xfer});
}

}  // namespace stratagem::sim
