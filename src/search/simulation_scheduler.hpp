// The simulations of the re-rank (rerank.cpp), run on threads. Each candidate is simulated on
// its own, so the results do not depend on the number of threads; what the simulations running
// at once are estimated to hold stays within one cap, so that the re-rank's memory does not grow
// with the thread count.
//
// Early simulations: on one process with a spare core the baselines' top candidates are known
// before the DP search starts, so a thread simulates them beside it (start_early); once the DP
// search is over the main thread helps with those left (finish_early), and the re-rank takes
// their results (take_early) rather than simulating them again.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "stratagem/search.hpp"

namespace stratagem::search_detail {

class SimulationScheduler {
 public:
  SimulationScheduler(const ModelSpec& m, const ClusterSpec& c, const FrameworkSpec& fw,
                      int64_t budget)
      : m_(m), c_(c), fw_(fw), budget_(budget) {}
  ~SimulationScheduler() { finish_early(); }
  SimulationScheduler(const SimulationScheduler&) = delete;
  SimulationScheduler& operator=(const SimulationScheduler&) = delete;

  // Starts a thread that simulates those of `candidates` small enough to run beside the DP
  // search (distinct keys), the largest first.
  void start_early(std::vector<SearchCandidate> candidates);
  // Joins the early thread; help: this thread takes the simulations still waiting beside it
  // (after the DP search, whose tables are gone). Returns whether there was one.
  bool finish_early(bool help = false);
  // The wall time of the early simulations and how many there were (once finished).
  double early_seconds() const { return early_s_; }
  int64_t early_count() const { return int64_t(early_.size()); }
  // This process's share of `set` (round-robin over `procs` processes, this being `rank`) that
  // the early simulations have not done: those are copied into `set` as they are. Rethrows
  // what an early simulation threw.
  std::vector<size_t> take_early(std::vector<SearchCandidate>& set, int rank, int procs) const;

  // Simulates set[i] for every i of todo on `threads` threads, this one included; progress(done,
  // total) after each on this thread.
  void simulate(std::vector<SearchCandidate>& set, const std::vector<size_t>& todo, int threads,
                const std::function<void(size_t, size_t)>& progress);

 private:
  void early_work(bool smallest_first);

  const ModelSpec& m_;
  const ClusterSpec& c_;
  const FrameworkSpec& fw_;
  int64_t budget_;
  std::thread early_thread_;
  std::vector<SearchCandidate> early_;  // simulated by early_work() (valid once joined)
  std::exception_ptr early_failed_;
  double early_s_ = 0;  // wall time of the early simulations
  std::chrono::steady_clock::time_point early_t0_;
  std::mutex early_mutex_;  // guards what follows, early_failed_ and early_s_
  std::condition_variable early_cv_;
  size_t early_next_ = 0;  // early_[early_next_, early_end_) are left to simulate
  size_t early_end_ = 0;
  int64_t early_mem_free_ = 0;  // estimated bytes the simulations running may still take
};

}  // namespace stratagem::search_detail
