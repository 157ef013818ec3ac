// A split backward's second pass (the zero-bubble schedules, schedule.hpp): W of a chunk's
// layers, after their B, wherever the schedule places it.
#include <utility>

#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

void Passes::weight(int chunk, int mb) {
  ops_.set_chunk(chunk);
  const LayerRange r = stage_.plan.chunks[chunk];
  for (int l = r.end - 1; l >= r.begin; --l) {
    const StageContext::LayerWork& w = stage_.work(l);
    WeightInputs& in = weight_inputs_[key(l, mb)];
    int last = -1;
    for (int i : {1, 0}) {  // in B's order: the mlp's first
      last = ops_.compute(i == 1 ? Block::mlp : Block::attention, Phase::weight_grad, l, mb,
                          stage_.samples(l), w.weight_grad[i].flops, w.weight_grad[i].bytes);
      for (int* buf : {&in.kept[i], &in.stash[i], &in.rebuilt[i]})
        ops_.release(std::exchange(*buf, -1), Stream::compute);
    }
    reduce_layer(chunk, l, mb, last);
  }
  grads_.flush_staging_free();
}

void Passes::reduce_layer(int chunk, int l, int mb, int ready) {
  if (mb == stage_.last_backward_mb[chunk] || stage_.per_microbatch(l))
    ready = grads_.moe_router_grads_reduce(l, grads_.sp_replicated_reduce(l, ready));
  grads_.reduce_grads(l, mb, ready);
}

}  // namespace stratagem::program_detail
