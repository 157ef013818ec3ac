// Each rank's device memory over virtual time. Alloc/free ops are instantaneous events; device
// bytes are allocations + the stage's workspace (counted as buffers) + the context +
// fragmentation of both, the formula of the cost model's MemoryBreakdown, so the simulated
// peak of a schedule equals `stratagem estimate`'s.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "sim/types.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::sim {

// A rank's allocations now.
struct RankMemory {
  std::array<int64_t, kNumMemCategories> bytes{};
  int64_t allocated = 0;
  bool oom = false;  // already went beyond the GPU's memory (reported once per rank)
};

// Whether an OOM at (t, rank) comes before `first`: the run reports the earliest one, the
// lowest rank on ties, whichever process saw it.
inline bool oom_precedes(Time t, int rank, const SimOom& first) {
  return !first.oom || t < first.time_ns || (t == first.time_ns && rank < first.rank);
}

// The memory ledger: device bytes by the cost model's formula, each rank's peak, and the run's
// first OOM among the ranks of this process.
class MemoryLedger {
 public:
  void init(const ClusterSpec& cluster);
  int64_t hbm_bytes() const { return hbm_bytes_; }
  int64_t device_bytes(int64_t alloc, int64_t ws) const {
    const int64_t a = alloc + ws;
    return a + context_bytes_ + static_cast<int64_t>(fragmentation_ * double(a));
  }
  // A rank's peak before its first allocation: the workspace with context and fragmentation.
  void init_peak(SimRankResult& res, int64_t workspace) const;
  // Applies op `op` (an alloc when sign is 1, a free when -1) of `rank` at t: updates the
  // rank's peak (res), the first OOM and, when `samples` is given, the trace.
  void apply(RankMemory& m, SimRankResult& res, MemCategory category, int64_t bytes, int rank,
             uint32_t op, int32_t iteration, int64_t workspace, Time t, int sign,
             std::vector<trace::MemorySample>* samples);
  SimOom& first_oom() { return first_oom_; }

 private:
  int64_t context_bytes_ = 0, hbm_bytes_ = 0;
  double fragmentation_ = 0;
  SimOom first_oom_;
};

}  // namespace stratagem::sim
