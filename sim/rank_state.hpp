// What the simulator keeps per simulated rank. The Program itself is shared per stage
// (StageData); a rank holds only its progress through it: a cursor per stream, the running
// kernel, the data-movement windows of its comm streams, the time accounting of its compute
// stream, its memory counters and its two pipeline channels.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "sim/interference.hpp"
#include "sim/memory_timeline.hpp"
#include "sim/stage_data.hpp"
#include "sim/types.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::sim {

// A pipeline message that arrived before its recv started.
struct Arrival {
  uint64_t seq;
  Time arrival;
  Time xfer;  // arrival - send start
};

// One direction of a rank's pipeline link (to pp_next or pp_prev). Sends and recvs between a
// pair of ranks match in order, by sequence number.
struct Channel {
  int peer = -1;
  uint64_t sent = 0, recvd = 0;
  bool waiting = false;
  uint8_t wait_stream = 0;
  uint64_t wait_seq = 0;
  std::vector<Arrival> fifo;
  size_t head = 0;
};

struct RankState {
  int rank = 0, stage = 0, rank_class = 0, node = 0;
  int local_index = -1;  // among this process's ranks
  // Each stream's cursor: the iteration it is in and the position of its next op.
  std::array<uint32_t, kStreams> iteration{}, position{};
  std::array<uint8_t, kStreams> running{};
  std::array<Time, kStreams> op_start{};
  Windows moving_since{};  // data movement of the stream's comm op began (kNever: none)
  // The last op completed on each stream: when, its Cat, and how long it moved data (not
  // counting the wait for peers); what an idle compute stream is charged to.
  std::array<Time, kStreams> last_done{};
  std::array<uint8_t, kStreams> last_done_cat{};
  std::array<Time, kStreams> last_done_moving_ns{};
  bool dirty = false;
  ComputeKernel kernel;
  RankMemory memory;
  // Pipeline (0: pp_next, 1: pp_prev) and cp ring channels (2: the next cp rank, which cp
  // sends go to, 3: the previous one, which cp receives come from).
  Channel channels[4];
  // send/recv key -> channel (one channel when both peers of a pair coincide).
  uint8_t channel_of_key[4] = {0, 1, 2, 3};
  int group_row = 0;     // this rank's row of resolved groups
  int64_t nic_mult = 1;  // ranks of this node whose NIC flows this rank's stand for
  Time last_compute_end = 0;
  std::array<int64_t, 11> busy_and_waits{};  // compute-stream time by Cat (kCompute .. kHost)
  // The framework's host (StageData::host_issue): when it began issuing the iteration the rank
  // is in (when the rank finished the one before, which it waited for), and the time of the
  // wake-up event pending for an op it has not issued yet.
  Time host_origin = 0;
  uint32_t host_iteration = 0;
  Time host_wake = -1;
  Time end_time = 0;
  uint64_t ops_done = 0;
  SimRankResult result;
};

// Resolves every rank's groups (into `rank_groups`, a row of `keys` entries per rank) and
// pipeline peers, and sorts the ranks of each stage into classes (same group sizes and node
// spans, same pipeline peers on the same/another node); the first rank of a class is its
// representative (StageData::class_rep).
void init_ranks(std::vector<RankState>& ranks, std::vector<StageData>& stages,
                std::vector<int32_t>& rank_groups, const Layout& layout, int gpus_per_node);

}  // namespace stratagem::sim
