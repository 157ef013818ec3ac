// The memory timeline of a rank (see memory_timeline.hpp).
#include "sim/memory_timeline.hpp"

namespace stratagem::sim {

void MemoryLedger::init(const ClusterSpec& cluster) {
  hbm_bytes_ = cluster.gpu.hbm_bytes;
  fragmentation_ = cluster.gpu.allocator_fragmentation;
}

void MemoryLedger::record_peak(SimRankResult& res, const std::array<int64_t, kNumMemCategories>& m,
                               int64_t workspace, const ProcessMemory& process,
                               const DeviceMemory& d) {
  res.peak_memory_bytes = d.device_bytes;
  res.peak_reserved_bytes = d.reserved_bytes;
  res.peak_allocated_bytes = d.allocated_bytes;
  res.peak_by_category = m;
  res.peak_by_category[int(MemCategory::buffers)] += workspace;
  res.peak_cublas_workspace_bytes = process.cublas_workspace_bytes;
  res.peak_fragmentation_bytes = d.fragmentation_bytes;
  res.peak_cuda_context_bytes = process.cuda_context_bytes;
  res.peak_nccl_buffers_bytes = process.nccl_buffers_bytes;
}

void MemoryLedger::init_peak(SimRankResult& res, int64_t workspace,
                             const ProcessMemory& process) const {
  record_peak(res, {}, workspace, process, device(0, workspace, process));
}

void MemoryLedger::apply(RankMemory& m, SimRankResult& res, MemCategory category, int64_t bytes,
                         int rank, uint32_t op, int32_t iteration, int64_t workspace,
                         const ProcessMemory& process, Time t, int sign,
                         std::vector<trace::MemorySample>* samples) {
  const int c = int(category);
  m.bytes[c] += sign * bytes;
  m.allocated += sign * bytes;
  const DeviceMemory d = device(m.allocated, workspace, process);
  const int64_t dev = d.device_bytes;
  if (sign > 0 && dev > res.peak_memory_bytes) {
    record_peak(res, m.bytes, workspace, process, d);
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
