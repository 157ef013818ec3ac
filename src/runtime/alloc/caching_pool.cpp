#include "src/runtime/alloc/caching_pool.hpp"

#include <algorithm>
#include <new>
#include <stdexcept>

namespace stratagem::alloc {

CachingPool::~CachingPool() {
  // Tensors hold the pool (shared_ptr in their deleters), so no block is live here.
  empty_cache();
}

size_t CachingPool::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t g = bytes < kLargeThreshold ? kSmallGranule : kLargeGranule;
  return (bytes + g - 1) / g * g;
}

void* CachingPool::allocate(size_t bytes, MemCategory category) {
  const size_t size = round_size(bytes);
  void* p = nullptr;
  size_t block = size;
  // Best fit among cached blocks; a large request does not take a block more than twice its
  // size (it would strand the rest), a small one only its own size class.
  auto it = free_blocks_.lower_bound(size);
  const size_t limit = size < kLargeThreshold ? size : 2 * size;
  if (it != free_blocks_.end() && it->first <= limit) {
    p = it->second;
    block = it->first;
    free_blocks_.erase(it);
    stats_.cached_bytes -= static_cast<int64_t>(block);
    ++stats_.cache_hits;
  } else {
    p = alloc_(size);
    if (!p && !free_blocks_.empty()) {
      empty_cache();
      p = alloc_(size);
    }
    if (!p) throw std::bad_alloc();
    ++stats_.raw_allocs;
    stats_.reserved_bytes += static_cast<int64_t>(size);
    stats_.reserved_high_water = std::max(stats_.reserved_high_water, stats_.reserved_bytes);
  }
  live_[p] = Live{block, bytes, category};
  const int c = static_cast<int>(category);
  stats_.requested_bytes[c] += static_cast<int64_t>(bytes);
  stats_.requested_high_water[c] =
      std::max(stats_.requested_high_water[c], stats_.requested_bytes[c]);
  stats_.requested_total += static_cast<int64_t>(bytes);
  stats_.requested_total_high_water =
      std::max(stats_.requested_total_high_water, stats_.requested_total);
  return p;
}

void CachingPool::release(void* p) {
  auto it = live_.find(p);
  if (it == live_.end())
    throw std::logic_error("caching pool: release of a pointer it does not own");
  const Live l = it->second;
  live_.erase(it);
  const int c = static_cast<int>(l.category);
  stats_.requested_bytes[c] -= static_cast<int64_t>(l.requested);
  stats_.requested_total -= static_cast<int64_t>(l.requested);
  free_blocks_.emplace(l.block_bytes, p);
  stats_.cached_bytes += static_cast<int64_t>(l.block_bytes);
}

void CachingPool::empty_cache() {
  for (auto& [size, p] : free_blocks_) {
    free_(p);
    ++stats_.raw_frees;
    stats_.reserved_bytes -= static_cast<int64_t>(size);
  }
  free_blocks_.clear();
  stats_.cached_bytes = 0;
}

}  // namespace stratagem::alloc
