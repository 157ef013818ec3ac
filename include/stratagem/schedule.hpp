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
  // A split backward's second pass, W (the weight gradients): forward is false. A split
  // backward's first pass, B, is a backward step like an unsplit one.
  bool weight = false;
};

// One schedule of (pp stages, vpp chunks per stage, micro-batches). A stage runs
// chunk_passes() forward passes and as many backward passes; the k-th of either kind is on
// local chunk forward_chunk(k) / backward_chunk(k) (0 .. vpp-1) and micro-batch
// forward_microbatch(k) / backward_microbatch(k). Every formula is O(1): nothing to cache.
//
// gpipe: all forwards, then all backwards (latest micro-batch first); 1f1b: warm-up, steady
// one-forward-one-backward, cool-down; interleaved: Megatron-Core's virtual-stage schedule
// (Narayanan et al. 2021; schedules.py's get_schedule_table), micro-batches advance in groups
// of `group` (microbatch_group_size_per_vp_stage, pp by default) through the stage's vpp
// chunks, the last group holding what is left; backward walks the chunks in reverse.
// zb-h1, zb-h2: the zero-bubble paper's handcrafted schedules (its Fig. 3 and the authors'
// get_hand_schedule, sail-sg/zero-bubble-pipeline-parallelism, efficiency.py): 1F1B's order
// with each backward split into B and W; stage s runs w (pp - s - 1) warm-up forwards (w = 1
// for h1, 2 for h2), runs each W right after its B except the first w s, which wait to the
// end (in micro-batch order), so the W fill the cool-down's bubbles.
struct ScheduleShape {
  int pp = 1;
  int vpp = 1;  // chunks per stage (1 unless interleaved)
  Schedule schedule = Schedule::one_f_one_b;
  int microbatches = 1;
  int group = 0;  // interleaved: micro-batches a chunk runs in a row; 0: pp

  static ScheduleShape of(const Plan& plan, int microbatches) {
    const bool il = plan.schedule == Schedule::interleaved;
    return {plan.pp, il ? plan.vpp : 1, plan.schedule, microbatches,
            il ? plan.microbatch_group_size(microbatches) : 0};
  }
  int chunk_passes() const { return microbatches * vpp; }
  int group_size() const { return group > 0 ? group : pp; }
  // Forward passes after which the chunk order repeats (until the last group, when the
  // micro-batches are not whole groups).
  int period() const { return group_size() * vpp; }
  bool whole_groups() const { return microbatches % group_size() == 0; }
  bool split() const { return splits_backward(schedule); }
  // zb: the warm-up forwards and deferred W per stage behind the last one (1 for h1, 2 for h2).
  int weight_lag() const { return schedule == Schedule::zb_h2 ? 2 : 1; }
  // Forward passes stage s runs before its first backward.
  int warmup_forwards(int stage) const;
  // zb: the W passes stage s holds back at most, each keeping what it reads from its forward
  // and B (0 for the unsplit schedules).
  int deferred_weights(int stage) const;
  // Forward passes whose activations stage s holds at once at most: the warm-up's and the
  // first steady forward's (a backward frees one only after it).
  int passes_in_flight(int stage) const;
  int forward_chunk(int k) const;
  int backward_chunk(int k) const { return vpp - 1 - forward_chunk(k); }
  int forward_microbatch(int k) const;
  int backward_microbatch(int k) const {
    return schedule == Schedule::gpipe ? microbatches - 1 - k : forward_microbatch(k);
  }
  // Of the stage's first n forward passes, how many run on local chunk c.
  int forwards_on_chunk(int n, int c) const;
};

std::vector<PassStep> stage_schedule(const ScheduleShape& shape, int stage);

// The smallest group of micro-batches per chunk that Megatron-Core's interleaved schedule
// accepts for `microbatches` >= pp micro-batches (schedules.py: a group of at least pp, and a
// last group of none or at least pp, which would otherwise leave dependency bubbles): pp where
// they are a multiple of pp.
int interleaved_group(int pp, int microbatches);
inline std::vector<PassStep> stage_schedule(const Plan& plan, int stage, int num_microbatches) {
  return stage_schedule(ScheduleShape::of(plan, num_microbatches), stage);
}

}  // namespace stratagem
