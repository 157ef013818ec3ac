#include "src/runtime/exec/memory.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace stratagem::exec {

void MemoryLedger::add(MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_[static_cast<int>(c)] += bytes;
  high_water_ = std::max(high_water_, total_locked());
}

std::array<int64_t, kNumMemCategories> MemoryLedger::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

int64_t MemoryLedger::total_locked() const {
  int64_t t = 0;
  for (int64_t b : in_use_) t += b;
  return t;
}

int64_t MemoryLedger::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_locked();
}

int64_t MemoryLedger::high_water() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_;
}

void BufferPool::alloc(int buffer, MemCategory category, int64_t bytes) {
  if (buffers_.count(buffer))
    throw std::logic_error("executor: buffer " + std::to_string(buffer) + " allocated twice");
  Arena& a = buffers_[buffer];
  a.category = category;
  a.bytes = bytes;
  a.storage = be_.allocate(Shape{(bytes + 3) / 4});
  ledger_->add(category, bytes);
}

void BufferPool::free(int buffer) {
  auto it = buffers_.find(buffer);
  if (it == buffers_.end())
    throw std::logic_error("executor: buffer " + std::to_string(buffer) + " freed but not live");
  ledger_->sub(it->second.category, it->second.bytes + it->second.overflow_bytes);
  buffers_.erase(it);
}

Tensor BufferPool::take(int buffer, Shape shape) {
  if (buffer < 0) return scratch(shape);
  auto it = buffers_.find(buffer);
  if (it == buffers_.end())
    throw std::logic_error("executor: tensor taken from buffer " + std::to_string(buffer) +
                           ", which is not live");
  Arena& a = it->second;
  const int64_t n = shape.numel();
  if (a.used_floats + n <= a.storage.numel()) {
    Tensor t{a.storage.data + a.used_floats, shape, nullptr};
    a.used_floats += n;
    return t;
  }
  Tensor t = be_.allocate(shape);
  a.overflow.push_back(t);
  a.overflow_bytes += n * 4;
  overflow_[static_cast<int>(a.category)] += n * 4;
  ledger_->add(a.category, n * 4);
  return Tensor{t.data, shape, nullptr};
}

Tensor BufferPool::scratch(Shape shape, MemCategory category) {
  Tensor t = be_.allocate(shape);
  const int64_t bytes = shape.numel() * 4;
  ledger_->add(category, bytes);
  std::shared_ptr<void> keep = t.storage;
  std::shared_ptr<MemoryLedger> ledger = ledger_;
  t.storage = std::shared_ptr<void>(nullptr, [keep, ledger, bytes, category](void*) mutable {
    ledger->sub(category, bytes);
    keep.reset();
  });
  return t;
}

}  // namespace stratagem::exec
