// The re-rank's simulations on threads, early beside the DP search and in the re-rank (see
// simulation_scheduler.hpp).
#include "src/search/simulation_scheduler.hpp"

#if __has_include(<malloc.h>)
#include <malloc.h>  // glibc: malloc_trim
#endif

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <string>

#include "src/search/searcher.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/program.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::search_detail {
namespace {

void simulate_candidate(const ModelSpec& m, const ClusterSpec& c, const FrameworkSpec& fw,
                        int64_t budget, SearchCandidate& x) {
  const Plan& p = x.plan;
  Layout layout(p, c);
  Program prog = build_program(m, p, fw);
  CostModel cost(m, c, p.dtype, fw);
  CostModelCosts costs(cost, p);
  SimOptions opt;
  SimResult r = simulate_consuming(std::move(prog), layout, c, costs, opt);
  x.simulated = true;
  const double it = double(r.makespan_ns) * 1e-9 / std::max(1, r.iterations);
  x.sim_iteration_time_s = it;
  x.sim_tokens_per_s = it > 0 ? double(p.global_batch) * m.seq_len / it : 0;
  x.sim_stage_peak_bytes.assign(p.pp, 0);
  x.sim_peak_memory_bytes = 0;
  for (const auto& rr : r.ranks) {
    x.sim_peak_memory_bytes = std::max(x.sim_peak_memory_bytes, rr.peak_memory_bytes);
    if (rr.stage >= 0 && rr.stage < p.pp)
      x.sim_stage_peak_bytes[rr.stage] =
          std::max(x.sim_stage_peak_bytes[rr.stage], rr.peak_memory_bytes);
  }
  x.sim_fits = !r.deadlock.deadlocked && x.sim_peak_memory_bytes <= budget;
}

// What simulating a plan holds at its peak, mostly its Program (every op of every stage), which
// simulate_consuming() frees stage by stage as its own per-op index replaces it: about 24 ops per
// (micro-batch, layer) and 64 bytes per op (GPT-3 175B, pp 16, 1536 micro-batches: 3.3 M ops,
// 210-225 MB resident).
int64_t simulation_bytes(const ModelSpec& m, const Plan& p) {
  return int64_t(p.num_microbatches()) * (m.layers + 2) * 24 * 64;
}
// Simulations run at once only while their estimates sum to at most this (one larger than it
// runs alone), so that the re-rank's memory does not grow with the thread count.
constexpr int64_t kRerankBytes = int64_t(320) << 20;
constexpr int64_t kSmallSimulationBytes = int64_t(16) << 20;
// Simulations beside the DP search only up to this estimate, so that the DP's tables and one
// such simulation stay within what the search may hold (500 MB). Since simulate_consuming() the
// GPT-3 175B pp 16 baselines (estimate 231 MB) fit (the search's peak: 374 MB), which leaves the
// re-rank after the DP little to simulate.
constexpr int64_t kEarlyBytes = int64_t(256) << 20;

}  // namespace

void SimulationScheduler::start_early(std::vector<SearchCandidate> candidates) {
  for (auto& c : candidates)
    if (simulation_bytes(m_, c.plan) <= kEarlyBytes) early_.push_back(std::move(c));
  if (early_.empty()) return;
  // The largest first: what is left when the DP search ends (and this thread helps) is small.
  std::stable_sort(early_.begin(), early_.end(),
                   [&](const SearchCandidate& a, const SearchCandidate& b) {
                     return simulation_bytes(m_, a.plan) > simulation_bytes(m_, b.plan);
                   });
  early_t0_ = Clock::now();
  early_mem_free_ = kRerankBytes;
  early_end_ = early_.size();
  early_thread_ = std::thread([this] {
    early_work(/*smallest_first=*/false);
#if defined(M_TRIM_THRESHOLD)
    malloc_trim(0);  // what the simulations held goes back to the system
#endif
  });
}

// Takes the next early simulation while any is left: one thread beside the DP search from the
// largest down, and this process's main thread too once the DP search is over
// (finish_early) from the smallest up, which fit beside the large one running. Those running at
// once hold at most kRerankBytes of estimated memory (kEarlyBytes bounds each).
void SimulationScheduler::early_work(bool smallest_first) {
  while (true) {
    size_t i = 0;
    int64_t need = 0;
    {
      std::unique_lock<std::mutex> lock(early_mutex_);
      if (early_next_ >= early_end_ || early_failed_) return;
      i = smallest_first ? --early_end_ : early_next_++;
      need = std::min(kRerankBytes, simulation_bytes(m_, early_[i].plan));
      early_cv_.wait(lock, [&] { return early_mem_free_ >= need; });
      early_mem_free_ -= need;
    }
    std::exception_ptr failed;
    try {
      simulate_candidate(m_, c_, fw_, budget_, early_[i]);
    } catch (...) {
      failed = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(early_mutex_);
      early_mem_free_ += need;
      if (failed && !early_failed_) early_failed_ = failed;
      early_s_ = std::max(early_s_, seconds_since(early_t0_));
    }
    early_cv_.notify_all();
  }
}

bool SimulationScheduler::finish_early(bool help) {
  if (!early_thread_.joinable()) return false;
  if (help) early_work(/*smallest_first=*/true);
  early_thread_.join();
  return true;
}

std::vector<size_t> SimulationScheduler::take_early(std::vector<SearchCandidate>& set, int rank,
                                                    int procs) const {
  if (early_failed_) std::rethrow_exception(early_failed_);
  std::map<std::string, const SearchCandidate*> early;
  for (const auto& x : early_)
    if (x.simulated) early[x.key] = &x;
  std::vector<size_t> todo;
  for (size_t i = size_t(rank); i < set.size(); i += size_t(procs)) {
    auto it = early.find(set[i].key);
    if (it == early.end()) {
      todo.push_back(i);
      continue;
    }
    set[i] = *it->second;
  }
  return todo;
}

void SimulationScheduler::simulate(std::vector<SearchCandidate>& set,
                                   const std::vector<size_t>& todo, int threads,
                                   const std::function<void(size_t, size_t)>& progress) {
  // Simulations of more than kSmallSimulationBytes run one after another on this thread;
  // the small ones on any thread. Memory a simulation frees stays in its thread's malloc
  // arena for the next one (Searcher::run() keeps freed pages in the heap), so its pages are
  // not faulted in again, and since the large ones share one arena, resident memory stays
  // about what the largest of them needs.
  std::vector<size_t> large, small;
  for (size_t i : todo)
    (simulation_bytes(m_, set[i].plan) > kSmallSimulationBytes ? large : small).push_back(i);
  std::atomic<size_t> next_large{0}, next_small{0}, done{0};
  std::mutex failed_mutex;
  std::exception_ptr failed;
  std::mutex mem_mutex;
  std::condition_variable mem_cv;
  int64_t mem_free = kRerankBytes;
  auto take = [&](bool main, size_t* i) {
    size_t k;
    if (main && (k = next_large++) < large.size()) return *i = large[k], true;
    if ((k = next_small++) < small.size()) return *i = small[k], true;
    return false;
  };
  auto work = [&](bool main) {
    for (size_t i; take(main, &i);) {
      const int64_t need = std::min(kRerankBytes, simulation_bytes(m_, set[i].plan));
      {
        std::unique_lock<std::mutex> lock(mem_mutex);
        mem_cv.wait(lock, [&] { return mem_free >= need; });
        mem_free -= need;
      }
      try {
        simulate_candidate(m_, c_, fw_, budget_, set[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failed_mutex);
        if (!failed) failed = std::current_exception();
        next_large = large.size();
        next_small = small.size();
      }
      {
        std::lock_guard<std::mutex> lock(mem_mutex);
        mem_free += need;
      }
      mem_cv.notify_all();
      ++done;
      if (main) progress(done.load(), todo.size());
    }
  };
  {
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, false);
    work(true);
    for (auto& t : pool) t.join();
  }
#if defined(M_TRIM_THRESHOLD)
  malloc_trim(0);  // what the simulations held goes back to the system
#endif
  if (failed) std::rethrow_exception(failed);
}

}  // namespace stratagem::search_detail
