#include "src/runtime/comm/mpi_progress.hpp"

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "stratagem/comm.hpp"

namespace stratagem {
namespace {

// How often the thread enters MPI while requests are in flight. Each entry costs a wake-up on a
// host whose cores the ranks share; 100 us lands a ring's round within a fraction of a typical
// op, at ~1% of a core per rank. STRATAGEM_MPI_PROGRESS_US overrides it; 0 turns it off.
constexpr int kProgressIntervalUs = 100;

class ProgressThread {
 public:
  static ProgressThread& get() {
    static ProgressThread engine;
    return engine;
  }
  void start(int interval_us) {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ || interval_us <= 0) return;
    interval_us_ = interval_us;
    MPI_Comm_dup(MPI_COMM_SELF, &self_);  // local: not collective over the job
    running_ = true;
    stop_ = false;
    in_flight_ = 0;
    ++generation_;
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!running_) return;
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    MPI_Comm_free(&self_);
    running_ = false;
  }
  uint64_t begin() {
    uint64_t ticket = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!running_) return 0;
      ++in_flight_;
      ticket = generation_;
    }
    wake_.notify_one();
    return ticket;
  }
  void end(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_ && ticket == generation_) --in_flight_;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      wake_.wait(lock, [this] { return stop_ || in_flight_ > 0; });
      if (stop_) return;
      lock.unlock();
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, self_, &flag, MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(std::chrono::microseconds(interval_us_));
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable wake_;
  std::thread thread_;
  MPI_Comm self_ = MPI_COMM_NULL;
  int in_flight_ = 0;
  uint64_t generation_ = 0;  // one per start: tickets of an earlier thread are not counted
  int interval_us_ = kProgressIntervalUs;
  bool running_ = false, stop_ = false;
};

}  // namespace

void start_mpi_progress() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) return;
  int interval_us = kProgressIntervalUs;
  if (const char* v = std::getenv("STRATAGEM_MPI_PROGRESS_US")) interval_us = std::atoi(v);
  ProgressThread::get().start(interval_us);
}

void stop_mpi_progress() {
  ProgressThread::get().stop();
}

namespace comm_detail {
uint64_t progress_begin() {
  return ProgressThread::get().begin();
}
void progress_end(uint64_t ticket) {
  if (ticket != 0) ProgressThread::get().end(ticket);
}
}  // namespace comm_detail

}  // namespace stratagem
