// Vocabulary shared by every layer of the simulator. Time is integer nanoseconds and rates are
// fixed point, so that every process of a parallel run computes bit-identical times.
#pragma once
#include <cstdint>
#include <limits>
#include <string>

#include "sim/tunables.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/program.hpp"

namespace stratagem::sim {

using Time = int64_t;
inline constexpr Time kNever = std::numeric_limits<Time>::max();
inline constexpr Time kMinTime = std::numeric_limits<Time>::min();
inline constexpr int64_t kS = kRateScale;  // progress units per ns at full speed
inline constexpr int kStreams = kNumStreams;

// The simulator's range, refused past (InputError, exit 2) rather than wrapped or saturated:
// - one op's duration: its work in progress units (ns x kS), plus the kS - 1 of a ceil_div's
//   rounding, must fit int64: (2^63 - 1 - kS) / kS = 2^47 - 2 ns (39 hours);
// - the clock: 2^61 ns (73 years), so that the clock plus one op's duration at the slowest
//   rate (a kernel slowed 10x by communication: kS / 10 units per ns, 2^51 ns) stays below
//   2^63.
inline constexpr Time kMaxOpNs = (std::numeric_limits<Time>::max() - kRateScale) / kRateScale;
inline constexpr Time kMaxClockNs = int64_t(1) << 61;
// InputError "<what> passes the simulator's range, 2^61 ns (...), at <t_s> s; ...".
[[noreturn]] void refuse_beyond_clock(const std::string& what, double t_s);

inline int64_t ceil_div(int64_t a, int64_t b) {
  return a <= 0 ? 0 : (a + b - 1) / b;
}

// Breakdown categories of compute-stream time. kRecv marks a recv as the op a kernel waited
// for: it is charged as pipeline communication, but takes precedence over the other kinds.
enum Cat : uint8_t {
  kCompute,
  kRecompute,
  kOptimizer,
  kTp,
  kDp,
  kPp,
  kBubble,
  kOffload,
  kEp,    // MoE all-to-alls and their expert-tensor collectives
  kCp,    // context parallelism's transfers and collectives (the cp_comm stream)
  kHost,  // the framework's host had not issued the kernel yet
  kNone,
  kRecv
};

// Cost of a communication op on one rank, split for the fluid model: `head` latency before the
// bytes move, `work` ns of data movement at full speed on the link, `tail` latency after.
struct CommSplit {
  Time head = 0, tail = 0, work = 0;
  int64_t share = kS;  // share of the resource a full-speed flow takes, in kS units
  LinkClass link = LinkClass::none;
  Time total() const { return head + work + tail; }
};

}  // namespace stratagem::sim
