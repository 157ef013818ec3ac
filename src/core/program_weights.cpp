// Weights that are not resident, fetched before use: ZeRO-3 gathers over dp and host-offloaded
// shards copied in (the experts' are in program_moe.cpp).
#include "src/core/stage_builder.hpp"

namespace stratagem::program_detail {

// `params` parameters of strategy s (layer -1: embedding or LM head): returns their buffer,
// or -1 when resident. `experts`: an MoE layer's routed experts (s its expert_strategy), whose
// buffer and gather are Block::experts over the expert data-parallel group, which the layer's
// etp and ep select (program_moe.cpp's contract).
int WeightFetches::fetch(const LayerStrategy& s, int64_t params, int layer, Phase ph, int mb,
                         int after, int* wait_out, bool experts) {
  const WeightFetch f = weight_fetch(s, params, stage_.plan.dtype);
  const Block blk = experts ? Block::experts : Block::none;
  auto wait_for = [&](int op) {
    if (wait_out)
      *wait_out = op;
    else
      ops_.compute_waits_for(op);
  };
  if (f.bytes == 0) return -1;
  // ZeRO-Infinity: the rank's shard lives in host memory; it crosses PCIe into its place in
  // the gather buffer before the (in-place) all-gather can start.
  const int buf = ops_.alloc(s.offload_params ? Stream::h2d : Stream::dp_comm, MemCategory::buffers,
                             f.bytes, layer, mb, ph, blk, {after});
  if (f.h2d_bytes > 0) {
    Op op = OpEmitter::make(OpKind::copy_h2d, Stream::h2d, blk, ph, layer, mb);
    op.category = MemCategory::weights;
    op.bytes = f.h2d_bytes;
    after = ops_.emit(op, {after});
  }
  if (!f.gathers) {
    wait_for(after);
  } else if (experts) {
    wait_for(ops_.collective(Stream::dp_comm, Collective::all_gather, GroupKind::expert_dp,
                             Purpose::weight_fetch, f.bytes, blk, ph, layer, mb, {after}));
  } else {
    wait_for(ops_.collective(Stream::dp_comm, Collective::all_gather, GroupKind::dp,
                             Purpose::weight_fetch, f.bytes, blk, ph, layer, mb, {after}));
  }
  return buf;
}

// The head's weights, fetched after `after` (the last layer's attention, as a layer
// prefetches its successor's).
int WeightFetches::fetch_head(int mb, int after) {
  const auto& s = stage_.plan.embedding;
  return fetch(s, head_compute_parameters_per_rank(stage_.model, s.tp), -1, Phase::forward, mb,
               after);
}

}  // namespace stratagem::program_detail
