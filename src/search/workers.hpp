// A few threads that run independent tasks of one configuration at once (its stage DPs, the
// rows of DP answers the partition reads). Each task writes only its own result, so the answers
// are those of one thread, in any order. The workers live as long as the pool, so their DP
// tables stay in their threads' table pools from one configuration to the next.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace stratagem::search_detail {

class Workers {
 public:
  // `threads` in all, the calling thread included (1: run() runs every task itself).
  explicit Workers(int threads);
  ~Workers();
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // task(i) for i in [0, n), spread over the threads; returns when all are done, rethrowing
  // the first exception a task threw.
  void run(int n, const std::function<void(int)>& task);
  int threads() const { return int(pool_.size()) + 1; }

 private:
  void work();  // a worker's loop
  // Takes tasks of the current batch until none is left.
  void drain(const std::function<void(int)>* task, int n);

  std::vector<std::thread> pool_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int n_ = 0;
  std::atomic<int> next_{0};
  int busy_ = 0;        // workers inside the current batch
  uint64_t batch_ = 0;  // incremented per run()
  bool stop_ = false;
  std::exception_ptr failed_;
};

}  // namespace stratagem::search_detail
