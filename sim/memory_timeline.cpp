// The memory timeline of a rank (see memory_timeline.hpp).
#include "sim/memory_timeline.hpp"

namespace stratagem::sim {

void MemoryLedger::init(const ClusterSpec& cluster) {
  context_bytes_ = cluster.gpu.context_overhead_bytes;
  hbm_bytes_ = cluster.gpu.hbm_bytes;
  fragmentation_ = cluster.gpu.allocator_fragmentation;
}

void MemoryLedger::init_peak(SimRankResult& res, int64_t workspace) const {
  res.peak_memory_bytes = device_bytes(0, workspace);
  res.peak_by_category[int(MemCategory::buffers)] = workspace;
  res.peak_context_bytes = context_bytes_;
  res.peak_fragmentation_bytes = res.peak_memory_bytes - context_bytes_ - workspace;
}

void MemoryLedger::apply(RankMemory& m, SimRankResult& res, MemCategory category, int64_t bytes,
                         int rank, uint32_t op, int32_t iteration, int64_t workspace, Time t,
                         int sign, std::vector<trace::MemorySample>* samples) {
  const int c = int(category);
  m.bytes[c] += sign * bytes;
  m.allocated += sign * bytes;
  const int64_t dev = device_bytes(m.allocated, workspace);
  if (sign > 0 && dev > res.peak_memory_bytes) {
    res.peak_memory_bytes = dev;
    res.peak_allocated_bytes = m.allocated;
    for (int k = 0; k < kNumMemCategories; ++k) res.peak_by_category[k] = m.bytes[k];
    res.peak_by_category[int(MemCategory::buffers)] += workspace;
    res.peak_context_bytes = context_bytes_;
    res.peak_fragmentation_bytes = dev - context_bytes_ - m.allocated - workspace;
    res.peak_time_ns = t;
    res.peak_op = int32_t(op);
    res.peak_iteration = iteration;
  }
  if (sign > 0 && dev > hbm_bytes_ && !m.oom) {
    m.oom = true;
    SimOom& oom = first_oom_;
    if (oom_precedes(t, rank, oom)) {
      oom.oom = true;
      oom.rank = rank;
      oom.op = int32_t(op);
      oom.iteration = iteration;
      oom.time_ns = t;
      oom.bytes = dev;
      oom.hbm_bytes = hbm_bytes_;
    }
  }
  if (samples) {
    trace::MemorySample s;
    s.time_ns = t;
    for (int k = 0; k < kNumMemCategories; ++k) s.bytes[k] = m.bytes[k];
    s.bytes[int(MemCategory::buffers)] += workspace;
    s.total_bytes = dev;
    s.high_water_bytes = res.peak_memory_bytes;
    samples->push_back(s);
  }
}

}  // namespace stratagem::sim
