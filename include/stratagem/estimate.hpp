// The fast analytical estimator: iteration time, throughput and per-stage peak memory of a
// whole plan in closed form from the cost model's op costs, with no event simulation. The
// search calls it millions of times.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "stratagem/cost.hpp"

namespace stratagem {

struct TimeBreakdown {
  double compute_s = 0;  // forward + backward kernels on the critical path
  double recompute_s = 0;
  double tp_comm_s = 0;  // exposed tensor-parallel communication
  double cp_comm_s = 0;  // exposed context-parallel communication (JSON only under cp)
  double dp_comm_s = 0;  // exposed data-parallel / ZeRO communication
  double pp_comm_s = 0;  // exposed pipeline send/recv
  double bubble_s = 0;   // pipeline fill and drain
  double offload_s = 0;  // exposed PCIe copies and host optimizer
  double optimizer_s = 0;
  double ep_comm_s = 0;  // exposed MoE all-to-alls (written for MoE models only)
  // GPU idle while the framework's host issues the work (written only for a framework that
  // states its host time, FrameworkSpec::host_ops_per_layer_forward).
  double host_s = 0;
};

struct StageEstimate {
  double time_per_microbatch_s = 0;  // forward + backward of one micro-batch on this stage
  int64_t peak_memory_bytes = 0;
  MemoryBreakdown memory;
};

struct Estimate {
  double iteration_time_s = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;  // model FLOPs (Megatron count, no recompute) per GPU
  double mfu = 0;
  int64_t peak_memory_bytes = 0;  // max over ranks: the device's (what must fit in the GPU)
  // Max over ranks of the caching allocator's figures (MemoryBreakdown::allocated_bytes and
  // reserved_bytes: torch.cuda.max_memory_allocated and max_memory_reserved).
  int64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;
  int peak_stage = 0;
  MemoryBreakdown memory;  // of the most-loaded rank
  TimeBreakdown time;
  std::vector<StageEstimate> stages;
  bool moe = false;            // an MoE model: the JSON carries ep_comm
  bool host_modelled = false;  // the framework states its host time: the JSON carries host
};

Estimate estimate(const CostModel& cost, const Plan& plan);

// Whether the forecast's peak fits in one GPU's memory: the one rule behind every `fits` and
// every "does not fit" warning.
inline bool fits_gpu_memory(const Estimate& e, const ClusterSpec& c) {
  return e.peak_memory_bytes <= c.gpu.hbm_bytes;
}
// How close below a GPU's memory a forecast peak that fits is close enough to warn: what the
// forecast does not see (another library's allocations, a fragmentation above the cluster's
// figure) could take the rest.
inline constexpr double kMemoryWarnFraction = 0.05;
// Whether a peak that fits lies within kMemoryWarnFraction of the GPU's memory: the one rule
// behind `estimate`'s and `simulate`'s warning.
inline bool near_gpu_memory_limit(int64_t peak_bytes, const ClusterSpec& c) {
  return peak_bytes <= c.gpu.hbm_bytes &&
         double(peak_bytes) > (1.0 - kMemoryWarnFraction) * double(c.gpu.hbm_bytes);
}
// `memory_breakdown_bytes` of `estimate --json` and `simulate --json`: one key per part.
nlohmann::json memory_json(const MemoryBreakdown& m);
// JSON with the keys promised by `stratagem estimate --json`.
// `context_parallel`: the plan splits the sequence (adds time_breakdown_s.cp_comm).
nlohmann::json to_json(const Estimate& e, bool context_parallel = false);

}  // namespace stratagem
