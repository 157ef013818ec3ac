// The communicators a rank of a stage belongs to, apart from what they cost: the estimator
// prices a stage's NCCL buffers once for the stages whose communicators and node placement are
// alike (plan_costs.cpp), instead of once per stage.
#pragma once
#include <array>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "stratagem/cost.hpp"

namespace stratagem::cost_detail {

// A set of a few values in place, in insertion order: a stage's distinct tp degrees (each
// divides the stage's ranks: at most log2 of them), cp and expert pairs, reshards.
template <typename T>
class SmallSet {
 public:
  void insert(const T& v) {
    for (int i = 0; i < n_; ++i)
      if (items_[i] == v) return;
    if (n_ == kCapacity) throw std::logic_error("process_memory: more distinct degrees than held");
    items_[n_++] = v;
  }
  const T* begin() const { return items_.data(); }
  const T* end() const { return items_.data() + n_; }
  bool operator==(const SmallSet& o) const {
    if (n_ != o.n_) return false;
    for (int i = 0; i < n_; ++i)
      if (!(items_[i] == o.items_[i])) return false;
    return true;
  }

 private:
  static constexpr int kCapacity = 24;
  std::array<T, kCapacity> items_{};
  int n_ = 0;
};

// The groups a rank of one stage is a member of, by their degrees: its layers' tp (each with
// its dp group), cp and expert groups, the reshard groups between layers held differently, and
// whether it is the first or last stage (the embedding, the head, one pipeline neighbour).
struct StageCommunicators {
  SmallSet<int> tps;
  SmallSet<std::tuple<int, int, CpKind>> cps;
  SmallSet<std::pair<int, int>> experts, reshards;  // (etp, ep); (smaller, larger tp)
  bool first = false, last = false;
  bool operator==(const StageCommunicators&) const = default;
  // The groups of a layer of strategy s, the one below it holding `before` (null: none, the
  // embedding). Layers of one tp degree share their tp, dp and cp groups (layout.hpp); a layer
  // held differently from the one before it (or the head from the last layer) meets it in a
  // reshard group of the smaller degree's stride.
  void hold(const LayerStrategy& s, const LayerStrategy* before);
};
// A stage's: its chunks' layers, and the embedding's where it holds the embedding (stage 0) or
// the LM head (the last stage).
StageCommunicators stage_communicators(const Plan& p, int stage);

// The ledger of a rank of `stage` holding `comms`. Stages holding equal communicators have equal
// ledgers where every stage starts on a node border (devices_per_stage a multiple of
// gpus_per_node): their groups then span the same nodes.
ProcessMemory process_memory(const ModelSpec& model, const ClusterSpec& c, const Plan& p,
                             const StageCommunicators& comms, int stage);

}  // namespace stratagem::cost_detail
