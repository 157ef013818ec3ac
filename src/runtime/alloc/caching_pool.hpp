// CachingPool: the bookkeeping of a caching device allocator, kept free of CUDA so its
// accounting is unit-tested on every CI machine. The CUDA backend gives it cudaMalloc and
// cudaFree as the raw allocator; freed blocks stay cached for reuse by a later request of a
// similar size (cudaMalloc/cudaFree synchronize the device, so a training step must not call
// them once warm). Bytes are counted per memory category (the Program's MemCategory), as
// requested and as reserved from the device, with high-water marks, for the measured trace.
// Not thread-safe: one thread (the rank's executor) allocates.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>

#include "stratagem/program.hpp"

namespace stratagem::alloc {

class CachingPool {
 public:
  using RawAlloc = std::function<void*(size_t bytes)>;  // nullptr when out of memory
  using RawFree = std::function<void(void* p)>;

  CachingPool(RawAlloc raw_alloc, RawFree raw_free) : alloc_(raw_alloc), free_(raw_free) {}
  ~CachingPool();
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  // Sizes are rounded up to kSmallGranule (512 B) below kLargeThreshold (1 MiB) and to
  // kLargeGranule (2 MiB) above, so reuse finds blocks and fragmentation stays bounded.
  static constexpr size_t kSmallGranule = 512;
  static constexpr size_t kLargeThreshold = size_t{1} << 20;
  static constexpr size_t kLargeGranule = size_t{2} << 20;
  static size_t round_size(size_t bytes);

  // A block of at least `bytes`, counted under `category`. On a raw-allocation failure the
  // cache is released to the device and the request retried once; a second failure throws
  // std::bad_alloc.
  void* allocate(size_t bytes, MemCategory category);
  // Returns a block to the cache (throws std::logic_error for a pointer it does not own).
  void release(void* p);
  // Gives every cached (free) block back to the device.
  void empty_cache();

  struct Stats {
    std::array<int64_t, kNumMemCategories> requested_bytes{};  // live, as asked for
    std::array<int64_t, kNumMemCategories> requested_high_water{};
    int64_t requested_total = 0, requested_total_high_water = 0;
    int64_t reserved_bytes = 0;  // held from the device: live + cached
    int64_t reserved_high_water = 0;
    int64_t cached_bytes = 0;  // free blocks kept for reuse
    int64_t raw_allocs = 0, raw_frees = 0, cache_hits = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Live {
    size_t block_bytes, requested;
    MemCategory category;
  };
  RawAlloc alloc_;
  RawFree free_;
  std::multimap<size_t, void*> free_blocks_;  // by size: best fit is lower_bound
  std::unordered_map<void*, Live> live_;
  Stats stats_;
};

}  // namespace stratagem::alloc
