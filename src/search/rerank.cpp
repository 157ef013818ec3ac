// The simulator re-rank of the top candidates, over processes and threads (the threads'
// scheduling in simulation_scheduler.hpp).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "src/search/searcher.hpp"

namespace stratagem::search_detail {
namespace {

// Every process's simulations, gathered into every process's set: (time, peak, stage peaks,
// fits) of each.
void gather_simulations(MPI_Comm comm, std::vector<SearchCandidate>& set,
                        const std::vector<size_t>& todo) {
  nlohmann::json mine = nlohmann::json::array();
  for (size_t i : todo)
    mine.push_back({i, set[i].sim_iteration_time_s, set[i].sim_tokens_per_s,
                    set[i].sim_peak_memory_bytes, set[i].sim_stage_peak_bytes, set[i].sim_fits});
  for (const auto& part : allgather_strings(comm, mine.dump()))
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

// Re-ranks the space's top K and, for the full space, both baselines' top K, so that the full
// search never does worse than a baseline search under the same scorer.
void Searcher::rerank(SearchResult& r) {
  std::vector<const TopK*> pools{&own_pool()};
  if (o_.space == SearchSpace::full) pools.insert(pools.end(), {&megatron_, &zero_, &megatron_ep_});
  std::vector<SearchCandidate> set = distinct_candidates(pools);
  const auto t0 = Clock::now();
  if (o_.rerank_with_simulator) {
    // Deal the simulations round-robin over the processes, and over threads inside each.
    const std::vector<size_t> todo = simulations_.take_early(set, rank_, procs_);
    const int threads = std::max(1, std::min<int>(rerank_threads(), int(todo.size())));
    simulations_.simulate(set, todo, threads, [&](size_t done, size_t total) {
      rerank_progress(done, total, threads);
    });
    gather_simulations(o_.comm, set, todo);
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
