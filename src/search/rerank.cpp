// The simulator re-rank of the top candidates, over processes and threads.
#if __has_include(<malloc.h>)
#include <malloc.h>  // glibc: malloc_trim
#endif

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

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
  CostModel cost(m, c, p, fw);
  CostModelCosts costs(cost);
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

// Final order: fitting candidates by the scorer's time, then the rest; equal times (within
// ranks_before's tolerance) by peak memory, then key.
void final_sort(std::vector<SearchCandidate>& v) {
  std::stable_sort(v.begin(), v.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
    if (a.sim_fits != b.sim_fits) return a.sim_fits;
    return ranks_before(a.iteration_time_s(), a.peak_memory_bytes(), a.key, b.iteration_time_s(),
                        b.peak_memory_bytes(), b.key);
  });
}
}  // namespace

void Searcher::start_early_simulations() {
  if (!o_.rerank_with_simulator || o_.space != SearchSpace::full || !o_.baselines) return;
  if (rerank_threads() < 2 || procs_ > 1) return;  // under MPI the baselines merge later
  std::set<std::string> keys;
  for (const TopK* t : {&megatron_, &zero_, &megatron_ep_})
    for (const auto& c : t->items())
      if (simulation_bytes(m_, c.plan) <= kEarlyBytes && keys.insert(c.key).second)
        early_.push_back(c);
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
// (finish_early_simulations) from the smallest up, which fit beside the large one running. Those
// running at once hold at most kRerankBytes of estimated memory (kEarlyBytes bounds each).
void Searcher::early_work(bool smallest_first) {
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
      simulate_candidate(m_, c_, o_.framework, budget_, early_[i]);
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

void Searcher::finish_early_simulations(bool help) {
  if (!early_thread_.joinable()) return;
  if (help) early_work(/*smallest_first=*/true);
  early_thread_.join();
  stats_.rerank_overlapped_s = early_s_;
  stats_.plans_simulated_overlapped = int64_t(early_.size());
}

int Searcher::rerank_threads() const {
  if (o_.threads > 0) return o_.threads;
  // This node's cores shared by the search processes on it. Collective over o_.comm: every
  // process re-ranks, so every process gets here.
  int local = 1;
  if (o_.comm != MPI_COMM_NULL) {
    MPI_Comm node;
    MPI_Comm_split_type(o_.comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
  }
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local));
}

// The set to re-rank: the space's top K and, for the full space, both baselines' top K, so
// that the full search never does worse than a baseline search under the same scorer.
std::vector<SearchCandidate> Searcher::rerank_set() const {
  std::vector<SearchCandidate> set;
  std::set<std::string> keys;
  auto add = [&](const TopK& t) {
    for (const auto& c : t.items())
      if (keys.insert(c.key).second) set.push_back(c);
  };
  add(own_pool());
  if (o_.space == SearchSpace::full) add(megatron_), add(zero_), add(megatron_ep_);
  return set;
}

// This process's share of the set (round-robin over the processes) that the early
// simulations have not already done: those are taken as they are.
std::vector<size_t> Searcher::left_to_simulate(std::vector<SearchCandidate>& set) const {
  if (early_failed_) std::rethrow_exception(early_failed_);
  std::map<std::string, const SearchCandidate*> early;
  for (const auto& x : early_)
    if (x.simulated) early[x.key] = &x;
  std::vector<size_t> todo;
  for (size_t i = rank_; i < set.size(); i += procs_) {
    auto it = early.find(set[i].key);
    if (it == early.end()) {
      todo.push_back(i);
      continue;
    }
    set[i] = *it->second;
  }
  return todo;
}

// Simulates set[i] for every i of todo over this process's threads. Each candidate is
// simulated on its own, so the results do not depend on the number of threads.
void Searcher::simulate_on_threads(std::vector<SearchCandidate>& set,
                                   const std::vector<size_t>& todo) {
  const int threads = std::max(1, std::min<int>(rerank_threads(), int(todo.size())));
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
        simulate_candidate(m_, c_, o_.framework, budget_, set[i]);
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
      if (main) rerank_progress(done.load(), todo.size(), threads);
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

void Searcher::rerank_progress(size_t done, size_t total, int threads) {
  if (rank_ != 0 || !o_.progress ||
      std::chrono::duration<double>(Clock::now() - last_progress_).count() < o_.progress_interval_s)
    return;
  last_progress_ = Clock::now();
  char buf[180];
  std::snprintf(buf, sizeof buf,
                "search: simulating the top candidates, %zu/%zu on this process "
                "(%d threads), %.1f s",
                done, total, threads, seconds_since(t0_));
  o_.progress(buf);
}

// Every process's simulations, gathered into every process's set: (time, peak, stage peaks,
// fits) of each.
void Searcher::gather_simulations(std::vector<SearchCandidate>& set,
                                  const std::vector<size_t>& todo) const {
  nlohmann::json mine = nlohmann::json::array();
  for (size_t i : todo)
    mine.push_back({i, set[i].sim_iteration_time_s, set[i].sim_tokens_per_s,
                    set[i].sim_peak_memory_bytes, set[i].sim_stage_peak_bytes, set[i].sim_fits});
  for (const auto& part : allgather_strings(o_.comm, mine.dump()))
    for (const auto& e : nlohmann::json::parse(part)) {
      SearchCandidate& x = set[e[0].get<size_t>()];
      x.simulated = true;
      x.sim_iteration_time_s = e[1].get<double>();
      x.sim_tokens_per_s = e[2].get<double>();
      x.sim_peak_memory_bytes = e[3].get<int64_t>();
      x.sim_stage_peak_bytes = e[4].get<std::vector<int64_t>>();
      x.sim_fits = e[5].get<bool>();
    }
}

void Searcher::rerank(SearchResult& r) {
  std::vector<SearchCandidate> set = rerank_set();
  const auto t0 = Clock::now();
  if (o_.rerank_with_simulator) {
    // Deal the simulations round-robin over the processes, and over threads inside each.
    const std::vector<size_t> todo = left_to_simulate(set);
    simulate_on_threads(set, todo);
    gather_simulations(set, todo);
    stats_.plans_simulated = int64_t(set.size());
    r.scorer = "simulator";
  } else {
    r.scorer = "estimator";
    r.scorer_note = "the simulator re-rank is disabled (--rerank estimator)";
  }
  stats_.rerank_phase_s = seconds_since(t0);
  final_sort(set);
  bool any_fits = false;
  for (const auto& x : set) any_fits |= x.sim_fits;
  if (!any_fits) {
    // Every re-ranked plan overflows under the simulator: fall back to the estimator's order.
    for (auto& x : set) x.simulated = false, x.sim_fits = true;
    final_sort(set);
    r.scorer = "estimator";
    r.scorer_note =
        "the simulator found every re-ranked plan over the memory budget; ranked by the estimator";
  }
  rank_result(set, r);
}

// The ranked answer of the re-ranked set: the space's plans, its best, and the best of each
// baseline under the same scorer.
void Searcher::rank_result(const std::vector<SearchCandidate>& set, SearchResult& r) const {
  auto best_of = [&](const TopK& t) -> std::optional<SearchCandidate> {
    std::set<std::string> ks;
    for (const auto& c : t.items()) ks.insert(c.key);
    for (const auto& x : set)
      if (ks.count(x.key)) return x;
    return std::nullopt;
  };
  std::vector<SearchCandidate> ranked;
  std::set<std::string> own_keys;
  for (const auto& c : own_pool().items()) own_keys.insert(c.key);
  if (o_.space == SearchSpace::full) {
    ranked = set;  // baselines belong to the full space
  } else {
    for (const auto& x : set)
      if (own_keys.count(x.key)) ranked.push_back(x);
  }
  if (int(ranked.size()) > o_.top_k) ranked.resize(o_.top_k);
  r.best = ranked.front();
  r.ranked = ranked;
  if (o_.space == SearchSpace::full) {
    if (o_.baselines) {
      r.megatron = best_of(megatron_);
      r.zero = best_of(zero_);
      if (!r.megatron) r.megatron_note = "no uniform Megatron-style plan fits the budget";
      if (!r.zero)
        r.zero_note = m_.moe.enabled()
                          ? "DeepSpeed does not run ZeRO-3 with MoE layers (deepspeed/runtime/"
                            "engine.py: \"MoE not supported with Stage 3\")"
                          : "no ZeRO-3 plan (pp 1, tp 1) fits the budget or divides the batch";
    } else {
      r.megatron_note = r.zero_note = "baselines not searched";
    }
  } else if (o_.space == SearchSpace::megatron) {
    r.megatron = r.best;
    r.zero_note = "not searched (--space megatron)";
  } else {
    r.zero = r.best;
    r.megatron_note = "not searched (--space zero)";
  }
}

}  // namespace stratagem::search_detail
