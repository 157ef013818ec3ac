// Maps a rank's model state (a stage's layers, a tensor-parallel share, a ZeRO shard of the
// optimizer state) to boxes of the model's logical tensors, for checkpoints that any layout
// can read.
#include <algorithm>

#include "stratagem/trainer.hpp"

namespace stratagem {

namespace {
// Boxes of entry e covering its local flat elements [a, b) (absolute flat indices), with the
// memory of flat element `base_flat` at `base`.
void add_boxes(std::vector<CheckpointPiece>& out, const std::string& dataset, const ParamInfo& e,
               int64_t a, int64_t b, float* base, int64_t base_flat) {
  a = std::max(a, e.offset);
  b = std::min(b, e.offset + e.numel());
  if (a >= b) return;
  const bool two_d = e.shape.ndim() == 2;
  const int64_t cols = two_d ? e.shape[1] : 1;
  auto emit = [&](int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    if (nr <= 0 || nc <= 0) return;
    std::vector<ShardSegment> segs = e.segments;
    if (segs.empty()) segs.push_back({0, two_d ? e.shape[0] : e.shape[0], 0, 0});
    for (const ShardSegment& s : segs) {
      const int64_t lo = std::max(r0, s.local_row), hi = std::min(r0 + nr, s.local_row + s.rows);
      if (lo >= hi) continue;
      CheckpointPiece p;
      p.dataset = dataset;
      p.row = s.logical_row + (lo - s.local_row);
      p.rows = hi - lo;
      p.col = two_d ? s.logical_col + c0 : 0;
      p.cols = two_d ? nc : 1;
      p.ld = cols;
      p.data = base + (e.offset + lo * cols + c0 - base_flat);
      out.push_back(p);
    }
  };
  const int64_t i0 = a - e.offset, i1 = b - e.offset;  // local element range
  const int64_t r0 = i0 / cols, c0 = i0 % cols, r1 = (i1 - 1) / cols, c1 = (i1 - 1) % cols + 1;
  if (r0 == r1) {
    emit(r0, 1, c0, c1 - c0);
    return;
  }
  int64_t full_begin = r0, full_end = r1 + 1;
  if (c0 > 0) emit(r0, 1, c0, cols - c0), full_begin = r0 + 1;
  if (c1 < cols) full_end = r1;
  emit(full_begin, full_end - full_begin, 0, cols);
  if (c1 < cols) emit(r1, 1, 0, c1);
}
}  // namespace

std::vector<CheckpointPiece> checkpoint_pieces(Executor& ex, bool writing) {
  Model& m = ex.model();
  std::vector<CheckpointPiece> out;
  for (const ParamInfo& e : m.table.entries()) {
    // One writer per logical element: the first data-parallel replica where the values are
    // replicated (or the ZeRO piece's owner), the first tp rank of replicated tensors, and not
    // the tied head copy. Each layer's ZeRO stage decides which (Executor::param_runs).
    const bool tp_owner = !e.replicated || e.tp_rank == 0;
    const bool owner = tp_owner && !e.tied_copy;
    auto writes = [&](const FlatRun& r) {
      return !writing || (owner && (!r.dp_replicated || r.dp_first));
    };
    for (const FlatRun& r : ex.param_runs())
      if (writes(r))
        add_boxes(out, "params/" + e.name, e, r.flat_begin, r.flat_end,
                  (r.on_host ? ex.host_params() : m.params).data + r.local, r.flat_begin);
    for (const FlatRun& r : ex.optimizer_runs()) {
      if (!writes(r)) continue;
      AdamW& state = r.on_host ? *ex.host_optimizer() : ex.optimizer();
      add_boxes(out, "optimizer/m/" + e.name, e, r.flat_begin, r.flat_end, state.m().data + r.local,
                r.flat_begin);
      add_boxes(out, "optimizer/v/" + e.name, e, r.flat_begin, r.flat_end, state.v().data + r.local,
                r.flat_begin);
    }
  }
  return out;
}

}  // namespace stratagem
