// The search driver: the run over the configurations and the exhaustive enumeration (see
// searcher.hpp).
#include "src/search/searcher.hpp"

#if __has_include(<malloc.h>)
#include <malloc.h>  // glibc: malloc_trim
#endif

#include <cstdio>

#include "src/search/bound_exchange.hpp"
#include "stratagem/estimate.hpp"

namespace stratagem::search_detail {

void Searcher::consider(const Plan& p, const char* origin, TopK* space_pool) {
  Scored s = score(m_, c_, p, o_.framework);
  ++local_scored_;
  evaluated_.record(p, s.time, s.tokens, s.peak, origin);
  min_memory_.offer(p, s, origin);
  if (!fits(s)) return;
  const bool want_full = o_.space == SearchSpace::full && full_.wants(s.time);
  const bool want_space = space_pool && space_pool->wants(s.time);
  if (!want_full && !want_space) return;
  SearchCandidate c = make_candidate(p, s, origin);
  if (want_space) space_pool->offer(c);
  if (want_full) full_.offer(std::move(c));
}

void Searcher::tick(const char* what) {
  ++progress_done_;
  if (rank_ != 0 || !o_.progress) return;
  if (std::chrono::duration<double>(Clock::now() - last_progress_).count() < o_.progress_interval_s)
    return;
  last_progress_ = Clock::now();
  const TopK& pool = own_pool();
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "search: %s %lld/%lld on this process, %lld plans scored, best %.0f tokens/s, %.1f s", what,
      (long long)progress_done_, (long long)progress_total_, (long long)local_scored_,
      pool.empty() ? 0.0 : pool.items().front().est_tokens_per_s, seconds_since(t0_));
  o_.progress(buf);
}

SearchResult Searcher::run() {
#if defined(M_MMAP_MAX)
  // The search allocates and frees large blocks over and over: DP tables, configuration after
  // configuration, and each simulation's Program and index. glibc serves blocks over its mmap
  // threshold with their own mmap and unmaps them on free, and trims the heap's free top, so
  // each was faulted in afresh (the DP alone on one thread: 1.1 s of 5.4 s in the kernel, and a
  // fifth of a large simulation's time). For the search they come from the heap, which keeps
  // its free pages for the next one (at the cost of some fragmentation); malloc_trim returns
  // them after the DP search and after the re-rank, and glibc's defaults come back at the end.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, int(1) << 30);
  struct RestoreMalloc {
    ~RestoreMalloc() {
      malloc_trim(0);
      mallopt(M_MMAP_MAX, 65536);  // glibc's defaults
      mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    }
  } restore_malloc;
#endif
  SearchResult r;
  r.space = o_.space;
  r.memory_budget_bytes = budget_;
  stats_.processes = procs_;
  std::vector<Config> cfs;
  if (o_.space == SearchSpace::full) cfs = configs();
  stats_.configs = int64_t(cfs.size());
  // Baselines first: they seed the K-th best time that lets the bound skip configurations.
  baselines();
  // One process with a spare core: the baselines' top candidates are known before the DP search
  // starts, so a second thread simulates them while it runs (rerank() reuses them). (Under MPI
  // the baselines merge later.)
  if (o_.rerank_with_simulator && o_.space == SearchSpace::full && o_.baselines &&
      rerank_threads() >= 2 && procs_ == 1)
    simulations_.start_early(distinct_candidates({&megatron_, &zero_, &megatron_ep_}));
  if (!cfs.empty()) {
    workers_ = std::make_unique<Workers>(rerank_threads());
    bound_configs(cfs);
    search_configs(cfs);
    workers_.reset();  // and their threads' DP tables
  }
  stats_.estimate_phase_s = seconds_since(t0_);
  merge(allgather_strings(o_.comm, pack()));
  // (After the merge: every process holds the same pool and adds the same variants.)
  if (o_.space == SearchSpace::full) split_backward_variants();
  if (o_.prune_configurations)
    stats_.configs_pruned = stats_.configs - stats_.configs_searched - stats_.configs_unfit;
  if (own_pool().empty()) throw_no_plan_fits(cfs);
  // The cost tables and DP tables are not needed any more: the re-rank's simulations get their
  // memory.
  pairs_.clear();
#if defined(M_TRIM_THRESHOLD)
  // Tables the DP workers freed sit in their threads' malloc arenas: back to the system.
  malloc_trim(0);
#endif
  if (simulations_.finish_early(/*help=*/true)) {
    stats_.rerank_overlapped_s = simulations_.early_seconds();
    stats_.plans_simulated_overlapped = simulations_.early_count();
  }
  rerank(r);
  r.evaluated = evaluated_.plans();
  stats_.search_time_s = seconds_since(t0_);
  r.stats = stats_;
  return r;
}

// Every configuration's lower bound, a (pp, Bm) pair per task (each builds its pair's cost
// tables).
void Searcher::bound_configs(std::vector<Config>& cfs) {
  std::map<std::tuple<int, int, int>, std::vector<Config*>> by_pair;
  for (auto& cf : cfs) by_pair[{cf.pp, cf.Bm, cf.cpg}].push_back(&cf);
  std::vector<const std::vector<Config*>*> tasks;
  for (const auto& [key, list] : by_pair) {
    pairs_[key];  // the slot, filled by its task
    tasks.push_back(&list);
  }
  workers_->run(int(tasks.size()), [&](int i) {
    for (Config* cf : *tasks[size_t(i)]) cf->lb = lower_bound(*cf);
  });
  for (const auto& [key, pd] : pairs_) {
    if (!pd) continue;
    stats_.layer_strategies_costed += pd->raw_layers;
    stats_.layer_strategies_kept += pd->kept_layers;
  }
}

// This process's configurations (round-robin) in increasing bound, until the bound exceeds the
// K-th best plan found. Sorts cfs.
void Searcher::search_configs(std::vector<Config>& cfs) {
  std::sort(cfs.begin(), cfs.end(), [](const Config& a, const Config& b) {
    if (a.lb != b.lb) return a.lb < b.lb;
    return a.order < b.order;
  });
  progress_done_ = 0;
  progress_total_ = int64_t((cfs.size() + procs_ - 1) / procs_);
  // Under MPI the processes share their K-th best time while they search (a chain of
  // non-blocking all-reduces, MIN, that also tells whether anyone is still searching): any
  // bound at or above the final K-th best is valid, so sharing it changes no answer, only how
  // many configurations are skipped.
  BoundExchange bound(o_.comm, std::max(1, o_.top_k));
  for (const Config& cf : cfs) stats_.configs_unfit += cf.lb == kInf;
  for (size_t i = rank_; i < cfs.size(); i += procs_) {
    const Config& cf = cfs[i];
    if (o_.prune_configurations) {
      if (cf.lb == kInf) break;  // sorted: the rest cannot fit either
      // (Ranks: a plan of equal rank may still enter, by lower memory or key.)
      if (time_rank(cf.lb) > time_rank(std::min(full_.kth_time(), bound.shared()))) break;
    }
    ++local_searched_;
    search_config(cf);
    bound.poll(full_);
    tick("configurations");
  }
  bound.finish(full_);
}

// Nothing fits: finds the least memory any plan of the space needs and says so.
void Searcher::throw_no_plan_fits(const std::vector<Config>& cfs) {
  if (o_.space == SearchSpace::full) {
    for (size_t i = rank_; i < cfs.size(); i += procs_) min_memory_config(cfs[i]);
    merge(allgather_strings(o_.comm, pack()));
  }
  std::string msg = "no plan of the " + std::string(to_string(o_.space)) +
                    " space fits the memory budget of " + fmt_gib(budget_) + " per GPU";
  if (min_memory_.best) {
    msg += "; the smallest peak memory reachable is " +
           fmt_gib(min_memory_.best->est_peak_memory_bytes) +
           " per GPU, with: " + min_memory_.best->plan.describe();
    // What is over: that plan's peak by category (the estimator's, at its peak stage).
    const Plan& p = min_memory_.best->plan;
    const MemoryBreakdown mb = estimate(CostModel(m_, c_, p.dtype, o_.framework), p).memory;
    msg += "; at its peak " + fmt_gib(mb.total_bytes()) + " = weights " +
           fmt_gib(mb.weights_bytes) + " + grads " + fmt_gib(mb.grads_bytes) + " + optimizer " +
           fmt_gib(mb.optimizer_bytes) + " + activations " + fmt_gib(mb.activations_bytes) +
           " + buffers " + fmt_gib(mb.buffers_bytes) +
           " + CUDA context, NCCL, cuBLAS and fragmentation " +
           fmt_gib(mb.total_bytes() - mb.tensor_bytes()) + ", " +
           fmt_gib(mb.total_bytes() - budget_) + " over";
  } else {
    msg += " (no valid plan at all for this model, cluster and global batch)";
  }
  throw NoFeasiblePlan(msg, budget_, min_memory_.best);
}

// ---- exhaustive enumeration -------------------------------------------------------------------

void Searcher::enumerate(const std::function<void(const Plan&)>& visit) {
  const int L = m_.layers;
  for (const Config& cf : configs()) {
    const int pp = cf.pp, v = cf.v, D = c_.world_size() / pp;
    const auto raw = layer_candidates(m_, c_, D, cf.Bm, filter_for(cf.cpg));
    const auto embs = embedding_candidates(m_, c_, D, cf.Bm, filter_for(cf.cpg));
    if (raw.empty() || embs.empty()) continue;
    // Stage totals: every composition of L into pp parts of at least v layers.
    std::vector<int> totals(pp, v);
    std::function<void(int, int)> compose = [&](int s, int left) {
      if (s == pp - 1) {
        if (left < v) return;
        totals[s] = left;
        std::vector<int> idx(L, 0);
        for (const auto& e : embs) {
          std::fill(idx.begin(), idx.end(), 0);
          while (true) {
            std::vector<std::vector<LayerStrategy>> seqs(pp);
            int at = 0;
            for (int st = 0; st < pp; ++st)
              for (int k = 0; k < totals[st]; ++k) seqs[st].push_back(raw[idx[at++]]);
            visit(assemble(m_, o_, pp, cf.sched, v, cf.Bm, totals, seqs, e));
            int l = L - 1;
            while (l >= 0 && ++idx[l] == int(raw.size())) idx[l--] = 0;
            if (l < 0) break;
          }
        }
        return;
      }
      for (int n = v; n <= left - v * (pp - 1 - s); ++n) {
        totals[s] = n;
        compose(s + 1, left - n);
      }
    };
    compose(0, L);
  }
}

}  // namespace stratagem::search_detail
