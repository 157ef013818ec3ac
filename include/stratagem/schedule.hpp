// The order in which a pipeline stage runs forward and backward passes of its model chunks.
// This is the only place that knows it: the Program walks stage_schedule(), and the estimator
// (src/cost/) and the search (src/search/) ask ScheduleShape how many passes are in flight and
// which chunk a pass runs on, so that the three cannot disagree.
#pragma once
#include <vector>

#include "stratagem/plan.hpp"

namespace stratagem {

struct PassStep {
  bool forward;
  int chunk;  // global chunk index (v * pp + stage)
  int microbatch;
};

// One schedule of (pp stages, vpp chunks per stage, micro-batches). A stage runs
// chunk_passes() forward passes and as many backward passes; the k-th of either kind is on
// local chunk forward_chunk(k) / backward_chunk(k) (0 .. vpp-1) and micro-batch
// forward_microbatch(k) / backward_microbatch(k). Every formula is O(1): nothing to cache.
//
// gpipe: all forwards, then all backwards (latest micro-batch first); 1f1b: warm-up, steady
// one-forward-one-backward, cool-down; interleaved: Megatron's virtual-stage schedule
// (Narayanan et al. 2021), micro-batches advance in groups of pp through the stage's vpp
// chunks, backward walks the chunks in reverse.
struct ScheduleShape {
  int pp = 1;
  int vpp = 1;  // chunks per stage (1 unless interleaved)
  Schedule schedule = Schedule::one_f_one_b;
  int microbatches = 1;

  static ScheduleShape of(const Plan& plan, int microbatches) {
    return {plan.pp, plan.schedule == Schedule::interleaved ? plan.vpp : 1, plan.schedule,
            microbatches};
  }
  int chunk_passes() const { return microbatches * vpp; }
  // Forward passes after which the chunk order repeats.
  int period() const { return pp * vpp; }
  // Forward passes stage s runs before its first backward.
  int warmup_forwards(int stage) const;
  // Forward passes whose activations stage s holds at once at most: the warm-up's and the
  // first steady forward's (a backward frees one only after it).
  int passes_in_flight(int stage) const;
  int forward_chunk(int k) const { return (k % period()) / pp; }
  int backward_chunk(int k) const { return vpp - 1 - forward_chunk(k); }
  int forward_microbatch(int k) const { return (k / period()) * pp + k % pp; }
  int backward_microbatch(int k) const {
    return schedule == Schedule::gpipe ? microbatches - 1 - k : forward_microbatch(k);
  }
  // Of the stage's first n forward passes, how many run on local chunk c.
  int forwards_on_chunk(int n, int c) const;
};

std::vector<PassStep> stage_schedule(const ScheduleShape& shape, int stage);
inline std::vector<PassStep> stage_schedule(const Plan& plan, int stage, int num_microbatches) {
  return stage_schedule(ScheduleShape::of(plan, num_microbatches), stage);
}

}  // namespace stratagem
