// The compute stream's running kernel and how communication slows it: while a comm op of the
// same rank moves data (its stream's window opens when the bytes start moving and closes when
// the op completes), the kernel progresses at `slow` units per ns instead of kS. Remaining
// work is integer (kS units per ns at full speed), so the predicted end is exact.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "sim/types.hpp"

namespace stratagem::sim {

struct ComputeKernel {
  bool running = false;
  int64_t remaining = 0;  // work left at `ref`, in kS units
  Time ref = 0, end = 0;
  uint32_t ver = 0;  // version of the kernel's completion event
};

// Data-movement windows of a rank's streams: when each one's comm op began moving bytes
// (kNever: none). The compute stream's own slot is unused.
using Windows = std::array<Time, kStreams>;

// When the kernel will finish if the windows stay as they are.
inline Time kernel_end(const ComputeKernel& k, const Windows& moving_since, int64_t slow) {
  int64_t left = k.remaining;
  Time t = k.ref;
  for (;;) {
    if (left <= 0) return t;
    bool active = false;
    Time next = kNever;
    for (int s = 1; s < kStreams; ++s) {
      const Time b = moving_since[s];
      if (b == kNever) continue;
      if (b <= t)
        active = true;
      else
        next = std::min(next, b);
    }
    if (active) return t + ceil_div(left, slow);
    // kS x (next - t) >= left, without the product: a window opening far ahead would overflow it.
    if (next == kNever || next - t >= ceil_div(left, kS)) return t + ceil_div(left, kS);
    left -= kS * (next - t);
    t = next;
  }
}

// Advances the kernel's remaining work to `now` under the current windows; done before a window
// changes, so each stretch of time is charged at the rate that held during it.
inline void kernel_consume(ComputeKernel& k, const Windows& moving_since, int64_t slow, Time now) {
  Time t = k.ref;
  int64_t left = k.remaining;
  while (t < now && left > 0) {
    bool active = false;
    Time next = kNever;
    for (int s = 1; s < kStreams; ++s) {
      const Time b = moving_since[s];
      if (b == kNever) continue;
      if (b <= t)
        active = true;
      else
        next = std::min(next, b);
    }
    const Time seg = active ? now : std::min(next, now);
    left -= (active ? slow : kS) * (seg - t);
    t = seg;
  }
  k.remaining = left;
  k.ref = now;
}

}  // namespace stratagem::sim
