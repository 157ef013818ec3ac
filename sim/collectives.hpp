// The system layer's records: collectives being matched and run, and point-to-point transfers
// (pipeline sends and host copies) in flight. How they move through the engine is in
// collectives.cpp and transfers.cpp.
//
// A collective is one instance per (group, ordinal): members arrive one by one (locally, or as
// messages from other processes), and it starts when the last one has arrived. Each member's
// bytes are a flow on the member's resource; the collective completes at the latest member's
// finish plus its tail latency.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/pool.hpp"
#include "sim/types.hpp"

namespace stratagem::sim {

// A local member of a collective, with its part of the cost.
struct Member {
  int32_t rank;
  uint8_t stream;
  uint32_t op;
  Time head, tail, work;
  int64_t share;
  LinkClass link;
  Time fin;  // predicted end of its data movement (kNever: unknown yet)
};

struct Coll {
  int32_t group = -1;
  uint64_t ordinal = 0;
  uint64_t serial = 0;  // tells this instance from a later one that reuses the slot
  int size = 0, arrived = 0;
  Time last_arrival = kMinTime, start = 0, event_time = kNever;
  // cross: members on other processes. The collective completes at the max over processes of
  // each one's latest member finish plus tail (`value`), once every process reported its own.
  Time value = kMinTime;
  int finish_pending = 0;
  bool cross = false, started = false, local_done = false, owner_dirty = false, live = false;
  uint32_t ver = 0;
  std::vector<Member> members;  // local members
};

// The open collective instance of each group; at most one per group is open at a time, since a
// group's members run its collectives in the same order.
class CollectiveTable {
 public:
  void init(const std::vector<int32_t>& group_sizes) {
    group_size_ = group_sizes;
    group_inst_.assign(group_sizes.size(), -1);
  }
  // The open instance of group g, created by the first arrival for `ordinal`; `procs` is the
  // number of processes that hold members of the group.
  int open(int g, uint64_t ordinal, int procs) {
    int id = group_inst_[g];
    if (id >= 0) {
      if (pool_[id].ordinal != ordinal)
        throw std::logic_error("simulate: collective " + std::to_string(ordinal) + " of group " +
                               std::to_string(g) + " arrived while collective " +
                               std::to_string(pool_[id].ordinal) + " is open");
      return id;
    }
    id = pool_.acquire();
    Coll& c = pool_[id];
    c.group = g;
    c.ordinal = ordinal;
    c.serial = ++serial_;
    c.size = group_size_[g];
    c.arrived = 0;
    c.last_arrival = kMinTime;
    c.event_time = kNever;
    c.value = kMinTime;
    c.cross = procs > 1;
    c.finish_pending = c.cross ? procs - 1 : 0;
    c.started = c.local_done = c.owner_dirty = false;
    c.live = true;
    c.members.clear();
    group_inst_[g] = id;
    return id;
  }
  int instance(int g) const { return group_inst_[g]; }
  // The collective completed: its slot is free; the version bump makes its events stale.
  void close(int id) {
    Coll& c = pool_[id];
    group_inst_[c.group] = -1;
    c.live = false;
    ++c.ver;
    pool_.release(id);
  }
  Coll& operator[](int id) { return pool_[id]; }
  const Coll& operator[](int id) const { return pool_[id]; }

 private:
  Pool<Coll> pool_;
  std::vector<int32_t> group_inst_;
  std::vector<int32_t> group_size_;
  uint64_t serial_ = 0;
};

enum XKind : uint8_t { kXSend, kXCopy };

// A pipeline send (to a local or a remote receiver) or a host copy.
struct Xfer {
  XKind kind = kXSend;
  // remote: the receiver is on another process; sent: its arrival was sent there.
  bool remote = false, owner_dirty = false, live = false, sent = false;
  int32_t rank = 0, dst = -1, dst_ch = 0;
  uint8_t stream = 0;
  uint64_t seq = 0, serial = 0;
  Time start = 0, head = 0, tail = 0, work = 0, fin = kNever, event_time = kNever;
  uint32_t ver = 0;
};

class TransferPool {
 public:
  int open() {
    const int id = pool_.acquire();
    Xfer& x = pool_[id];
    x.live = true;
    x.owner_dirty = false;
    x.sent = false;
    x.fin = x.event_time = kNever;
    x.serial = ++serial_;
    return id;
  }
  void close(int id) {
    pool_[id].live = false;
    pool_.release(id);
  }
  Xfer& operator[](int id) { return pool_[id]; }
  const Xfer& operator[](int id) const { return pool_[id]; }

 private:
  Pool<Xfer> pool_;
  uint64_t serial_ = 0;
};

// A pipeline message from another process, waiting in the queue for its arrival time.
struct Delivery {
  int32_t dst, ch;
  uint64_t seq;
  Time arrival, xfer;
};

}  // namespace stratagem::sim
