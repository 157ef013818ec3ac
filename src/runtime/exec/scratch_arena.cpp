#include "src/runtime/exec/scratch_arena.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace stratagem::exec {

ScratchArena::ScratchArena(Tensor region, Backend& be, std::shared_ptr<MemoryLedger> ledger)
    : state_(std::make_shared<State>()) {
  state_->region = region;
  state_->be = &be;
  state_->ledger = std::move(ledger);
  if (region.numel() > 0) state_->free_floats[0] = region.numel();
}

int64_t ScratchArena::capacity_bytes() const {
  return state_ ? state_->region.numel() * 4 : 0;
}

int64_t ScratchArena::overflow_bytes() const {
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->beside_high_bytes;
}

int64_t ScratchArena::peak_bytes() const {
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->live_high_bytes;
}

void ScratchArena::State::took(int64_t bytes) {
  live_bytes += bytes;
  live_high_bytes = std::max(live_high_bytes, live_bytes);
}

void ScratchArena::State::release(int64_t offset, int64_t floats) {
  std::lock_guard<std::mutex> lock(mu);
  live_bytes -= floats * 4;
  auto [it, inserted] = free_floats.emplace(offset, floats);
  (void)inserted;
  auto next = std::next(it);
  if (next != free_floats.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_floats.erase(next);
  }
  if (it != free_floats.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_floats.erase(it);
    }
  }
}

Tensor ScratchArena::take(Shape shape, ArenaEnd end) {
  const int64_t n = shape.numel();
  if (!state_) throw std::logic_error("ScratchArena: take from an arena never sized");
  std::shared_ptr<State> st = state_;
  const Tensor& region = st->region;
  std::lock_guard<std::mutex> lock(st->mu);
  if (n == 0) return Tensor{region.data, shape, nullptr, region.dtype, region.device};
  // First fit from the chosen end: the lowest free block that holds it, or the highest.
  auto fits = [n](const auto& block) { return block.second >= n; };
  auto& blocks = st->free_floats;
  auto it = blocks.end();
  if (end == ArenaEnd::low) {
    it = std::find_if(blocks.begin(), blocks.end(), fits);
  } else {
    auto r = std::find_if(blocks.rbegin(), blocks.rend(), fits);
    if (r != blocks.rend()) it = std::prev(r.base());
  }
  if (it != blocks.end()) {
    const auto [start, floats] = *it;
    blocks.erase(it);
    const int64_t at = end == ArenaEnd::low ? start : start + floats - n;
    if (floats > n) blocks[end == ArenaEnd::low ? start + n : start] = floats - n;
    st->took(n * 4);
    Tensor t{region.data + at, shape, nullptr, region.dtype, region.device};
    t.storage = std::shared_ptr<void>(nullptr, [st, at, n](void*) { st->release(at, n); });
    return t;
  }
  // Beside the region: the forecast's size was short (or the region is fragmented).
  Tensor t = st->be->allocate(shape);
  st->took(n * 4);
  st->beside_bytes += n * 4;
  if (st->beside_bytes > st->beside_high_bytes) {
    st->ledger->add(MemCategory::buffers, st->beside_bytes - st->beside_high_bytes);
    st->beside_high_bytes = st->beside_bytes;
  }
  std::shared_ptr<void> keep = t.storage;
  t.storage = std::shared_ptr<void>(nullptr, [st, keep, n](void*) mutable {
    keep.reset();
    std::lock_guard<std::mutex> l(st->mu);
    st->beside_bytes -= n * 4;
    st->live_bytes -= n * 4;
  });
  return t;
}

}  // namespace stratagem::exec
