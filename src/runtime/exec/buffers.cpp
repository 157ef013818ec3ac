#include "src/runtime/exec/buffers.hpp"

#include <stdexcept>
#include <string>

#include "src/runtime/exec/shards.hpp"

namespace stratagem::exec {

namespace {
bool is_cp_work(const Op& op) {
  return op.category == MemCategory::buffers && op.block == Block::attention;
}
// Staged gradients are found by their segment: the layer's, or its experts' (Block::experts).
int staging_key(const Op& op) {
  return op.block == Block::experts ? expert_segment(op.layer) : op.layer;
}
}  // namespace

int Buffers::find(Block b, Phase ph, int layer, int mb) const {
  auto it = by_use.find({int(b), int(ph), layer, mb});
  return it == by_use.end() ? -1 : it->second;
}

int Buffers::of(Block b, Phase ph, int layer, int mb) const {
  const int id = find(b, ph, layer, mb);
  if (id < 0)
    throw std::logic_error("executor: no live buffer for " + std::string(to_string(b)) + " " +
                           to_string(ph) + " layer " + std::to_string(layer) + " mb " +
                           std::to_string(mb));
  return id;
}

void Buffers::allocated(const Op& op) {
  if (is_cp_work(op))
    cp_work[{int(op.phase), op.layer, op.microbatch}] = op.buffer;
  else if (op.category == MemCategory::grads)
    staging[staging_key(op)] = op.buffer;      // ZeRO-2/3: the segment's staged gradients
  else if (!received_pieces.count(op.buffer))  // a piece is found through its reduce-scatter
    by_use[{int(op.block), int(op.phase), op.layer, op.microbatch}] = op.buffer;
}

void Buffers::freed(const Op& op) {
  if (received_pieces.count(op.buffer)) return;  // a reduce-scatter's (the op names it)
  if (is_cp_work(op)) {
    cp_work.erase({int(op.phase), op.layer, op.microbatch});
    return;
  }
  if (op.category != MemCategory::grads)
    by_use.erase({int(op.block), int(op.phase), op.layer, op.microbatch});
  else if (auto s = staging.find(staging_key(op)); s != staging.end() && s->second == op.buffer)
    staging.erase(s);
}

}  // namespace stratagem::exec
