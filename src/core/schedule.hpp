// The order in which a pipeline stage runs forward and backward passes of its model chunks.
#pragma once
#include <vector>

#include "stratagem/plan.hpp"

namespace stratagem {

struct PassStep {
  bool forward;
  int chunk;  // global chunk index (v * pp + stage)
  int microbatch;
};

// gpipe: all forwards, then all backwards; 1f1b: warm-up, steady one-forward-one-backward,
// cool-down; interleaved: Megatron's virtual-stage schedule over vpp chunks per stage.
std::vector<PassStep> stage_schedule(const Plan& plan, int stage, int num_microbatches);

}  // namespace stratagem
