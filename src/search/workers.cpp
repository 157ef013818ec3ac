#include "src/search/workers.hpp"

namespace stratagem::search_detail {

Workers::Workers(int threads) {
  for (int t = 1; t < threads; ++t) pool_.emplace_back([this] { work(); });
}

Workers::~Workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : pool_) t.join();
}

void Workers::drain(const std::function<void(int)>* task, int n) {
  if (!task) return;
  for (int i; (i = next_++) < n;) {
    try {
      (*task)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_) failed_ = std::current_exception();
      next_ = n;  // the other tasks are not started
    }
  }
}

void Workers::work() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task;
    int n;
    {
      // The batch is read under the lock: a worker that wakes after run() returned finds no
      // task (run() clears it under the same lock once no worker is busy).
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || batch_ != seen; });
      if (stop_) return;
      seen = batch_;
      task = task_, n = n_;
      ++busy_;
    }
    drain(task, n);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
    done_.notify_all();
  }
}

void Workers::run(int n, const std::function<void(int)>& task) {
  if (n <= 0) return;
  if (pool_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) task(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    n_ = n;
    next_ = 0;
    failed_ = nullptr;
    ++batch_;
  }
  wake_.notify_all();
  drain(&task, n);
  std::exception_ptr failed;
  {
    // Every task has been taken; wait for the workers still running one. A worker that wakes
    // only now finds no task left and leaves at once.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    failed = failed_;
    task_ = nullptr;
  }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace stratagem::search_detail
