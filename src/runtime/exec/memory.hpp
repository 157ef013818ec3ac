// The executor's memory: the Program's buffers as real arenas, plus transient scratch, all
// counted in one ledger per category. A tensor a block needs is carved from the buffer the
// Program allocated for it; when the Program's accounting is short, the rest is allocated
// beside the arena and counted in the same buffer, so the measured bytes never hide a model
// that is wrong.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "stratagem/backend.hpp"
#include "stratagem/program.hpp"

namespace stratagem::exec {

// Thread-safe: a copy stream's worker may drop the last view of a scratch tensor.
class MemoryLedger {
 public:
  void add(MemCategory c, int64_t bytes);
  void sub(MemCategory c, int64_t bytes) { add(c, -bytes); }
  std::array<int64_t, kNumMemCategories> in_use() const;
  int64_t total() const;
  int64_t high_water() const;

 private:
  int64_t total_locked() const;
  mutable std::mutex mu_;
  std::array<int64_t, kNumMemCategories> in_use_{};
  int64_t high_water_ = 0;
};

class BufferPool {
 public:
  BufferPool(Backend& be, std::shared_ptr<MemoryLedger> ledger) : be_(be), ledger_(ledger) {}
  // The Program's alloc op: an arena of `bytes`.
  void alloc(int buffer, MemCategory category, int64_t bytes);
  // The Program's free op: the arena and what overflowed it are released (views into them
  // must not be used afterwards).
  void free(int buffer);
  bool live(int buffer) const { return buffers_.count(buffer) > 0; }
  // A tensor of `shape` inside buffer `buffer` (non-owning view), or beside it when the arena
  // is full. buffer -1: transient scratch.
  Tensor take(int buffer, Shape shape);
  // Transient scratch, counted under `category` until the last view of it is dropped.
  Tensor scratch(Shape shape, MemCategory category = MemCategory::buffers);
  // Bytes taken beyond the Program's arenas so far (a model shortfall), per category.
  const std::array<int64_t, kNumMemCategories>& overflow_bytes() const { return overflow_; }

 private:
  struct Arena {
    MemCategory category = MemCategory::buffers;
    int64_t bytes = 0;
    Tensor storage;  // owning; floats = ceil(bytes / 4)
    int64_t used_floats = 0;
    std::vector<Tensor> overflow;
    int64_t overflow_bytes = 0;
  };
  Backend& be_;
  std::shared_ptr<MemoryLedger> ledger_;
  std::map<int, Arena> buffers_;
  std::array<int64_t, kNumMemCategories> overflow_{};
};

}  // namespace stratagem::exec
