// The event queue: plain structs in a 4-ary min-heap ordered by (time, sequence), so that ties
// in time go in push order and a run is deterministic; no allocation or std::function per event.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "sim/types.hpp"

namespace stratagem::sim {

enum EvType : uint8_t {
  kEvCompute,
  kEvOpEnd,
  kEvColl,
  kEvCollDone,
  kEvXfer,
  kEvXferDone,
  kEvDeliver,
  kEvHost  // the host issues a rank's op that was waiting for it
};

// Owners of an event re-schedule by bumping a version rather than deleting from the heap;
// `ver` lets the handler skip a stale event.
struct Ev {
  Time t;
  uint64_t st;  // sequence number << 8 | EvType
  uint32_t id, ver;
  EvType type() const { return EvType(st & 0xff); }
  // (t, st) as one 128-bit number: the heap compares it without branches (t >= 0).
  unsigned __int128 order() const { return (unsigned __int128)uint64_t(t) << 64 | st; }
};

// A 4-ary heap: half the depth of a binary heap, and its four children share a cache line.
class EventQueue {
 public:
  bool empty() const { return v_.empty(); }
  const Ev& top() const { return v_[0]; }
  void push(Time t, EvType type, uint32_t id, uint32_t ver) {
    push({t, (seq_++ << 8) | uint64_t(type), id, ver});
  }
  void pop() {
    const Ev e = v_.back();
    v_.pop_back();
    const size_t n = v_.size();
    if (n == 0) return;
    size_t i = 0;
    for (;;) {
      const size_t c = 4 * i + 1;
      if (c >= n) break;
      size_t best = c;
      const size_t end = std::min(c + 4, n);
      for (size_t k = c + 1; k < end; ++k)
        if (less(v_[k], v_[best])) best = k;
      if (!less(v_[best], e)) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = e;
  }

 private:
  void push(const Ev& e) {
    size_t i = v_.size();
    v_.push_back(e);
    while (i > 0) {
      const size_t p = (i - 1) / 4;
      if (!less(e, v_[p])) break;
      v_[i] = v_[p];
      i = p;
    }
    v_[i] = e;
  }
  static bool less(const Ev& a, const Ev& b) { return a.order() < b.order(); }

  std::vector<Ev> v_;
  uint64_t seq_ = 0;
};

}  // namespace stratagem::sim
