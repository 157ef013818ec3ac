// A pool of reusable records addressed by index. Events name their owner by this index, and
// reusing freed slots (last freed, first reused) keeps the event loop free of allocation.
#pragma once
#include <cstdint>
#include <vector>

namespace stratagem::sim {

template <class T>
class Pool {
 public:
  // A reused slot keeps its old contents (and version counter): the caller resets what it uses.
  // Growing may move every record, so no reference into the pool survives acquire().
  int acquire() {
    if (!free_.empty()) {
      const int id = free_.back();
      free_.pop_back();
      return id;
    }
    items_.emplace_back();
    return int(items_.size()) - 1;
  }
  void release(int id) { free_.push_back(int32_t(id)); }
  T& operator[](int id) { return items_[id]; }
  const T& operator[](int id) const { return items_[id]; }

 private:
  std::vector<T> items_;
  std::vector<int32_t> free_;
};

}  // namespace stratagem::sim
