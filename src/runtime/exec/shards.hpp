// ZeRO layer by layer (Galvatron-BMW's per-layer DP/SDP, H3T's per-layer ZeRO stage): each
// layer's parameters, and the embedding's and head's as one segment (the Program's layer -1),
// are partitioned over the data-parallel group on their own, so that each layer's ZeRO stage
// decides what of it a rank keeps: the whole segment or only its piece, of the weights
// (ZeRO-3), the gradients (ZeRO-2) and the optimizer state (ZeRO-1). The Program sizes its
// buffers and collectives segment by segment the same way.
#pragma once
#include <cstdint>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "stratagem/executor.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem::exec {

using FlatRange = std::pair<int64_t, int64_t>;  // [begin, end) of the flat parameter buffer

// An MoE layer whose experts are spread over ranks (ep x etp > 1) is two segments: the layer's
// other parameters over its dp group, and its routed experts, keyed expert_segment(layer),
// over the expert data-parallel group (the ranks holding the same experts).
inline int expert_segment(int layer) {
  return -2 - layer;
}
inline bool is_expert_segment(int key) {
  return key <= -2;
}
inline int layer_of_segment(int key) {
  return is_expert_segment(key) ? -2 - key : key;
}

// What a layer's strategy decides about its parameters (layer -1: the embedding and head's;
// an expert_segment: an MoE layer's routed experts, tp = etp x ep and dp = expert_dp, which
// place a rank in its expert data-parallel group as tp and dp do in the dense one).
struct SegmentPlacement {
  int layer = -1;
  int zero = 0, tp = 1, dp = 1;
  bool params_on_host = false, optimizer_on_host = false;
  bool experts_apart = false;  // a layer whose routed experts are a segment of their own
};

struct Segment {
  int layer = -1;  // -1: everything outside the layers (embedding, final norm, LM head)
  int zero = 0, dp = 1, dp_index = 0;
  bool params_on_host = false;     // its weights live in the host pool (ZeRO-Offload, H3T)
  bool optimizer_on_host = false;  // its optimizer state and update too
  std::vector<FlatRange> runs;     // the segment's flat runs, increasing
  std::vector<int64_t> starts;     // each run's start among the segment's elements
  std::vector<int64_t> bounds;     // dp + 1 even cuts of the segment's elements
  bool sharded_weights() const { return zero == 3 && dp > 1; }
  bool sharded_grads() const { return zero >= 2 && dp > 1; }
  bool sharded_state() const { return zero >= 1 && dp > 1; }
  // Elements of flat [a, b) (inside one run) that each data-parallel rank's piece holds.
  std::vector<int64_t> counts(int64_t a, int64_t b) const;
  // The flat index where rank d's piece starts inside [a, b) (when counts(a, b)[d] > 0).
  int64_t piece_begin(int64_t a, int64_t b, int d) const;
  std::vector<FlatRange> piece(int d) const;  // rank d's piece as flat runs
};

// Where the flat elements a rank holds sit in one of its state tensors: increasing runs at
// consecutive local offsets (a run of the flat buffer is contiguous in the tensor too).
class FlatMap {
 public:
  FlatMap() = default;
  // Any order; local offsets assigned here. merge: neighbours alike become one run (not for
  // the optimizer state, whose runs each stay inside one layer's weights).
  explicit FlatMap(std::vector<FlatRun> runs, bool merge = true);
  const std::vector<FlatRun>& runs() const { return runs_; }
  int64_t size() const { return size_; }
  // Local offset of flat element `flat`; throws std::logic_error when not held.
  int64_t local(int64_t flat) const;
  bool holds(int64_t flat) const;

 private:
  std::vector<FlatRun> runs_;
  int64_t size_ = 0;
};

struct Sharding {
  std::map<int, Segment> segments;  // by layer (-1: embedding and head)
  // model.params (weights on the device), host_params (offloaded weights), model.grads, the
  // optimizer's moments.
  // host_state: the optimizer state of layers that offload it (AdamW on the host).
  FlatMap weights, host_weights, grads, state, host_state;
  std::vector<FlatRun> all_weights;    // weights' runs, then host_weights' (on_host)
  std::vector<FlatRun> all_state;      // state's runs, then host_state's (on_host)
  std::vector<FlatRange> norm_runs;    // flat elements this rank counts in the gradient norm
  const Segment& of(int layer) const;  // layer < 0: the embedding and head's segment
  // The segment of tensor `name` of `layer`: its layer's, or its experts' when apart.
  const Segment& of_param(std::string_view name, int layer) const;
};

// `placements`: those of the layers the table holds (rank_plan.hpp); `local`: the rank's index
// in its stage, which places it in each layer's tp and dp groups (Layout).
Sharding make_sharding(const ParamTable& table, const std::vector<SegmentPlacement>& placements,
                       int local);

}  // namespace stratagem::exec
