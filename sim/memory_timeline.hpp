// Each rank's device memory over virtual time. Alloc/free ops are instantaneous events; a
// rank's tensors are its allocations + the stage's workspace (counted as buffers), and its
// device bytes follow from them by the cost model's device_memory with the stage's GPU process
// ledger (process_memory), the formula of the estimator's MemoryBreakdown, so the simulated peak
// of a schedule equals `stratagem estimate`'s.
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
  DeviceMemory device(int64_t alloc, int64_t ws, const ProcessMemory& process) const {
    return device_memory(alloc + ws, process, fragmentation_);
  }
  // A rank's peak before its first allocation: the workspace and the process ledger.
  void init_peak(SimRankResult& res, int64_t workspace, const ProcessMemory& process) const;
  // Applies op `op` (an alloc when sign is 1, a free when -1) of `rank` at t: updates the
  // rank's peak (res), the first OOM and, when `samples` is given, the trace.
  void apply(RankMemory& m, SimRankResult& res, MemCategory category, int64_t bytes, int rank,
             uint32_t op, int32_t iteration, int64_t workspace, const ProcessMemory& process,
             Time t, int sign, std::vector<trace::MemorySample>* samples);
  SimOom& first_oom() { return first_oom_; }

 private:
  // The rank's peak parts when its allocations are `m` (categories) and its device memory `d`.
  static void record_peak(SimRankResult& res, const std::array<int64_t, kNumMemCategories>& m,
                          int64_t workspace, const ProcessMemory& process, const DeviceMemory& d);
  int64_t hbm_bytes_ = 0;
  double fragmentation_ = 0;
  SimOom first_oom_;
};

}  // namespace stratagem::sim
