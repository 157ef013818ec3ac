// The workload layer: each stage's Program as the simulator runs it. Ops are indexed by stream,
// collectives by the group they name, and every op's cost is resolved once per rank class (the
// ranks of a stage whose groups have the same geometry), never per event. Also the per-stream
// least durations that bound an op's start for the PDES lookahead. Read-only after setup.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "sim/types.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::sim {

// A collective's group as a stage's ops name it: its kind and the degrees resolve_group selects
// it by (the others 1, so that one group has one key); resolved per rank at setup.
struct GroupKey {
  GroupKind kind = GroupKind::none;
  int32_t tp = 1, etp = 1, ep = 1;
  int32_t reshard_from_tp = 1, reshard_to_tp = 1;
  static GroupKey of(const Op& op);
  Op collective() const;  // a collective op over this group, for resolve_group
  bool operator==(const GroupKey& o) const = default;
};

// An op as its stream runs it. Streams keep these in their order, so a stream walks memory
// sequentially and the hot path does not touch the (larger, scattered) Op records.
struct Step {
  uint32_t op = 0;         // index in the stage program
  uint32_t dep_begin = 0;  // into StageData::dep_at
  uint16_t dep_count = 0;
  OpKind kind = OpKind::compute;
  uint8_t busy_cat = 0;  // Cat its kernel time counts as (compute, recompute, optimizer)
  uint8_t cat = 0;       // Cat of the op (for the breakdown)
  // Collective: its group key; send/recv: 0 = pp_next, 1 = pp_prev; free: 1 when an alloc on
  // another stream precedes it since its stream's last op.
  uint8_t key = 0;
  MemCategory mem_category = MemCategory::buffers;  // alloc/free
  int32_t comm_index = -1;  // into StageData::comm_costs[class] (-1: not costed)
  uint32_t ordinal = 0;     // collective: ordinal among the stage's ops of its key
  // alloc/free carry their buffer here so that the hot path does not read the Op.
  union {
    Time compute_ns = 0;  // compute / host_compute duration
    int64_t mem_bytes;    // alloc/free: the buffer's bytes
  };
};

// A dependency as (position << kStreamBits | stream), the form the readiness check compares.
inline constexpr uint32_t kStreamBits = 4;
static_assert(kStreams <= (1 << kStreamBits), "a dependency's stream must fit its bits");
inline uint32_t dep_stream(uint32_t d) {
  return d & ((1u << kStreamBits) - 1);
}
inline uint32_t dep_pos(uint32_t d) {
  return d >> kStreamBits;
}

struct StageData {
  const StageProgram* program = nullptr;
  uint32_t op_count = 0;
  std::array<uint32_t, kStreams> stream_length{};
  std::array<std::vector<Step>, kStreams> steps;  // each stream's ops, in order
  std::vector<uint32_t> dep_at;                   // every op's dependencies, packed
  std::vector<uint32_t> position_of;              // [op]: its position in its stream
  std::vector<uint8_t> stream_of;                 // [op]: its stream
  std::vector<GroupKey> group_keys;
  std::vector<uint32_t> ops_per_group_key;
  std::vector<uint32_t> comm_op_index;  // [comm index]: an op of each distinct costed comm op
  std::vector<Op> comm_ops;  // [comm index]: that op (its cost's inputs outlive the Program)
  std::vector<std::vector<CommSplit>> comm_costs;  // [class][comm index]
  // For the PDES lookahead only (empty on one process):
  std::vector<std::vector<Time>> least_duration_ns;  // [class][op]: a lower bound
  // [class][stream][k]: the sum of the least durations of the stream's first k ops.
  std::vector<std::array<std::vector<Time>, kStreams>> least_duration_prefix_ns;
  // [op]: the latest position on each stream that the op transitively depends on (-1: none).
  std::vector<std::array<int32_t, kStreams>> anchors;
  std::vector<int> class_rep;  // representative rank of each class (filled by init_ranks)
  int64_t workspace_bytes = 0;
  ProcessMemory process;  // the stage's GPU process ledger (OpCosts::process_memory)
  // [op]: when the framework's host has issued it, from the start of the rank's iteration: the
  // host issue times (OpCosts::host_issue_time_s) of the ops up to it in program order. Empty
  // when no op has one (host_issue false): the host keeps ahead and nothing waits for it.
  std::vector<Time> issue_ns;
  bool host_issue = false;
};

inline const Step& step_of(const StageData& sd, uint32_t op) {
  return sd.steps[sd.stream_of[op]][sd.position_of[op]];
}
inline const CommSplit& comm_of(const StageData& sd, int cls, const Step& step) {
  return sd.comm_costs[cls][step.comm_index];
}

// Indexes every stage of `prog`, costs its compute ops (once per distinct op over all stages)
// and, with `lookahead`, finds each op's dependency anchors. Throws on a malformed Program.
// `release` (optional, the same Program as `prog`): each stage's ops and dependencies are freed
// as soon as the stage is indexed, so that the index replaces the Program in memory.
std::vector<StageData> build_stages(const Program& prog, const OpCosts& costs, bool lookahead,
                                    Program* release = nullptr);

// Costs the distinct communication ops of each rank class of `sd` with the class's
// representative rank and, with `lookahead`, the prefix sums of the ops' least durations per
// stream. Needs `sd.class_rep`.
void cost_rank_classes(StageData& sd, const Layout& layout, const ClusterSpec& cluster,
                       const OpCosts& costs, bool lookahead);

}  // namespace stratagem::sim
