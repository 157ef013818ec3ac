// What the report takes from a trace, read rank by rank so that memory stays bounded: figures of
// every rank (first pass), then the timeline blocks and memory samples of the few ranks it draws
// (second pass).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/report.hpp"

namespace stratagem::report {

// Timeline colours: what an op does, not which stream it ran on.
enum class OpClass : uint8_t {
  forward,
  backward,
  recompute,
  tp_comm,
  dp_comm,
  pp_comm,
  offload,
  optimizer,
  other,
  cp_comm,  // context parallelism's transfers and collectives (the cp_comm stream)
  ep_comm,  // MoE all-to-alls and expert-tensor collectives (Stream::ep_comm)
  // A split backward's W (the zero-bubble schedules): apart from B (backward), which it follows.
  weight_grad,
};
inline constexpr int kNumOpClasses = 12;
const char* to_string(OpClass c);  // "forward", ..., also the CSS class suffix
OpClass classify(const trace::OpRecord& r);

// Consecutive ops of one row (rank, stream) of one class and micro-batch, closer than the
// merge gap, drawn as one block.
struct Block {
  int64_t start_ns = 0, end_ns = 0;
  OpClass cls = OpClass::other;
  int32_t microbatch = -1;
  int32_t ops = 0;
};

struct RankFigures {
  int rank = 0, stage = 0;
  int64_t end_ns = 0;           // last op of the first iteration
  int64_t busy_ns = 0;          // compute stream busy (all figures: the first iteration)
  int64_t exposed_comm_ns = 0;  // compute stream idle while a collective, send or copy runs
  int64_t bubble_ns = 0;        // compute stream idle otherwise (waiting in a recv included)
  int64_t peak_bytes = 0;
};

struct TimelineRow {
  int rank = 0, stage = 0;
  int stream = 0;  // Stream
  std::vector<Block> blocks;
};

struct TimelineView {
  std::string name;
  std::vector<int> ranks;  // one per drawn rank, in stage order
};

struct TraceData {
  std::string path, source, tool_version;
  int schema_version = 0;
  nlohmann::json model_json, cluster_json, plan_json;
  std::optional<ModelSpec> model;
  std::optional<ClusterSpec> cluster;
  std::optional<Plan> plan;
  int world = 0, pp = 1, devices_per_stage = 1, iterations = 1;
  int64_t t0_ns = 0, t1_ns = 0;  // the first iteration's window
  int64_t merge_gap_ns = 0;
  std::vector<RankFigures> ranks;  // every rank in the file, by rank
  TraceSummary summary;
  std::vector<TimelineView> views;
  std::vector<TimelineRow> rows;                         // of every rank of any view
  std::vector<int> memory_ranks;                         // most-loaded rank of each stage
  std::vector<std::vector<trace::MemorySample>> memory;  // of memory_ranks

  double iteration_s() const { return double(t1_ns - t0_ns) * 1e-9; }
  int stage_of(int rank) const { return rank / std::max(1, devices_per_stage); }
};

// Reads everything the page needs. `extra_ranks` adds a timeline view (--ranks).
TraceData read_trace(const std::string& path, const std::vector<int>& extra_ranks);

}  // namespace stratagem::report
