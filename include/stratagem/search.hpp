// Automatic strategy search: the fastest hybrid-parallel plan of a model on a cluster under a
// per-GPU memory budget (Galvatron-style).
//
// Space. Global: pipeline degree pp (devices split evenly: D = world / pp per stage), stage
// partition, schedule (gpipe, 1f1b, interleaved with v chunks per stage), micro-batch size and
// count, dtype fixed by the caller. Per layer: tp (a power of two up to the GPUs of a node),
// sequence parallelism, dp = D / tp, ZeRO 0-3, recompute (none, selective, full) and offload of
// optimizer states, parameters and activations. The embedding and LM head get their own
// strategy (Plan::embedding).
//
// Algorithm (details in src/search/search.cpp and src/search/stage_dp.hpp):
//  1. Outer loop over (pp, samples per micro-batch, schedule, v). Each configuration gets a
//     valid lower bound of the estimator's iteration time (LP relaxation of every stage's layer
//     choice under its memory budget, with the chunk-end transfers and the stage's forward peak
//     inside it; pipeline transfers, the slowest stage and the bubble over the best partition)
//     and they are visited in that order; one whose bound exceeds the K-th best plan found so
//     far is skipped: it could not enter the top K, so the answer is the same
//     (SearchStats::configs_pruned counts them).
//  2. Per (pp, micro-batch) every layer strategy is costed once per stage placement (identical
//     layers cost alike) and pruned (Galvatron's takeaways: PP outermost, devices split evenly,
//     tp within a node, ZeRO only with dp > 1, and a strategy that another of the same (tp, sp)
//     matches or beats in every time and memory term is dropped).
//  3. Per stage a dynamic program over layers x memory buckets x strategies (64 MiB buckets, or
//     budget/1024 when finer) gives the cheapest layer sequence for every layer count and
//     budget: reshard collectives between layers of different (tp, dp), the pass-end transfers
//     of the first and last layer, the reshard from the embedding, and a transient peak that
//     the activations of later layers cover (the DP state includes a cover level).
//  4. The stage partition balances time and memory across stages (Galvatron-BMW): each stage's
//     cost curve comes from its own memory budget (stages that keep more micro-batches in flight
//     afford fewer or more memory-frugal layers); the smallest maximum stage cost is found by
//     bisection and the pipeline bubble decides among larger ones. The even partition is tried
//     too. A stage the estimator finds under or over its budget has its DP budget widened or
//     narrowed and the plan rebuilt.
//  5. Every plan is scored by the fast estimator; the top K are re-ranked by the discrete-event
//     simulator (on one process with a spare core, the baselines' top K are simulated on a
//     second thread while the DP search runs). The best uniform Megatron-style plan and the best
//     ZeRO-3 plan are searched with the same scorer and belong to the full space (their top K are
//     re-ranked too), so the full search never returns worse.
// Under MPI the configurations (and the simulations) are dealt round-robin over the processes,
// which share their K-th best while searching; ties are broken by the canonical plan key (its
// JSON), so any process count gives the same answer.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem {

enum class SearchSpace {
  full,      // everything above
  megatron,  // uniform plans: tp/pp/dp/micro-batch/1f1b or interleaved/recompute/sp, ZeRO <= 1
  zero,      // pp 1, tp 1, ZeRO-3 with DeepSpeed's recompute and offload choices
};
const char* to_string(SearchSpace s);
SearchSpace search_space_from_string(const std::string& s, const std::string& where);

struct SearchOptions {
  int global_batch = 0;
  SearchSpace space = SearchSpace::full;
  int64_t memory_budget_bytes = 0;  // per GPU; 0: the GPU's HBM
  int top_k = 8;                    // candidates re-ranked by the simulator and listed
  Dtype dtype = Dtype::bf16;
  bool flash_attention = false;
  bool overlap_grad_reduce = true;
  bool rerank_with_simulator = true;  // false: the estimator ranks alone
  FrameworkSpec framework;            // the training software every plan is priced under
  // Threads per process that build a configuration's stage DPs and simulate re-rank
  // candidates at once (answers do not depend on it); 0: this node's cores divided by the
  // search processes on it.
  int threads = 0;
  // DP memory bucket; 0: 64 MiB, or budget / 1024 when that is finer.
  int64_t memory_resolution_bytes = 0;
  // Narrowing of the space (tests and experiments); the defaults are the whole space.
  std::vector<int> pp_degrees;  // empty: every divisor of the world size up to the layers
  std::vector<int> tp_degrees;  // empty: powers of two up to the GPUs of a node
  // Context-parallel degrees beside 1 (search_detail::cp_degrees_for): empty: those leaving a
  // rank at least 8,192 tokens of a sequence; {1}: none.
  std::vector<int> cp_degrees;
  std::vector<int> zero_stages{0, 1, 2, 3};
  std::vector<Recompute> recompute{Recompute::none, Recompute::selective, Recompute::full};
  bool sequence_parallel_off = true;  // layers with tp > 1 and no sequence parallelism
  bool sequence_parallel_on = true;   // layers with tp > 1 and sequence parallelism
  bool offload = true;
  // The zero-bubble ones (zb-h1, zb-h2) enter as variants of the best 1F1B plans found.
  std::vector<Schedule> schedules{Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved,
                                  Schedule::zb_h1, Schedule::zb_h2};
  std::vector<int> vpp_degrees{2, 3, 4, 6, 8};
  std::vector<int> micro_batches;  // samples per micro-batch through a stage; empty: divisors
  int max_samples_per_rank = 64;   // per layer and micro-batch
  int max_tr_classes = 3;          // transient-memory classes of the DP (see stage_dp.hpp)
  int max_kept_levels = 1;         // activation-cover levels of the DP above 0
  bool exact_dp = false;           // every memory class (slower; tests)
  bool baselines = true;           // also search the megatron and zero spaces (space full)
  // Tensor-parallel degrees beyond the GPUs of a node (priced at the cross-node cost); the
  // megatron baseline keeps tp inside a node, as Megatron's practice does.
  bool allow_cross_node_tp = false;
  // Skip the configurations whose lower bound shows they cannot enter the top K (exact: the
  // answer is the same; false searches every configuration, for tests).
  bool prune_configurations = true;
  MPI_Comm comm = MPI_COMM_NULL;  // spread the search over these processes
  // Called on process 0 with a one-line status about every progress_interval_s seconds.
  std::function<void(const std::string&)> progress;
  double progress_interval_s = 2.0;
};

struct SearchCandidate {
  Plan plan;
  std::string key;     // canonical plan key: to_json(plan).dump()
  std::string origin;  // "dp" (per-layer search), "megatron" or "zero"
  // The fast estimator's forecast.
  double est_iteration_time_s = 0, est_tokens_per_s = 0;
  int64_t est_peak_memory_bytes = 0;
  std::vector<int64_t> est_stage_peak_bytes;
  // The simulator's, when re-ranked.
  bool simulated = false;
  double sim_iteration_time_s = 0, sim_tokens_per_s = 0;
  int64_t sim_peak_memory_bytes = 0;
  std::vector<int64_t> sim_stage_peak_bytes;
  bool sim_fits = true;  // simulated peak within the budget, no deadlock
  // The final scorer's figures (simulator when simulated, else estimator).
  double tokens_per_s() const { return simulated ? sim_tokens_per_s : est_tokens_per_s; }
  double iteration_time_s() const {
    return simulated ? sim_iteration_time_s : est_iteration_time_s;
  }
  int64_t peak_memory_bytes() const {
    return simulated ? sim_peak_memory_bytes : est_peak_memory_bytes;
  }
  const std::vector<int64_t>& stage_peak_bytes() const {
    return simulated ? sim_stage_peak_bytes : est_stage_peak_bytes;
  }
};

// A plan the search scored, as the search front of `stratagem report` plots it (estimator's
// figures). The search keeps a bounded record (src/search/evaluated.hpp): a uniform sample of at
// most kEvaluatedSampleCap plans plus the Pareto front of throughput against peak memory.
inline constexpr int kEvaluatedSampleCap = 2000;
struct EvaluatedPlan {
  double tokens_per_s = 0, iteration_time_s = 0;
  int64_t peak_memory_bytes = 0;
  std::string origin;       // "dp", "megatron" or "zero"
  std::string description;  // Plan::describe()
  bool pareto = false;      // on the front of every plan scored
  uint64_t hash = 0;        // of the figures: the sample's key
};

struct SearchStats {
  int64_t candidates_evaluated = 0;  // complete plans scored by the estimator (all processes)
  int64_t plans_simulated = 0;
  int64_t configs = 0;           // outer (pp, micro-batch, schedule, v) configurations
  int64_t configs_searched = 0;  // not skipped by the lower bound
  // Skipped: their lower bound exceeds the K-th best plan found (they cannot enter the top K),
  // or no plan of theirs can fit (infinite bound). configs = searched + pruned + unfit.
  int64_t configs_pruned = 0;
  int64_t configs_unfit = 0;
  int64_t layer_strategies_costed = 0;
  int64_t layer_strategies_kept = 0;  // after dominance pruning
  int64_t dp_cells = 0;
  int64_t bound_violations = 0;  // a plan that fits, below its bound (should stay 0)
  int processes = 1;
  double search_time_s = 0;     // everything, wall time on process 0
  double estimate_phase_s = 0;  // DP + estimator
  double rerank_phase_s = 0;    // simulator re-rank (after the DP search)
  // Simulations of the baselines' top candidates that ran on a second thread beside the DP
  // search (one process with a spare core); rerank_phase_s does not include them.
  double rerank_overlapped_s = 0;
  int64_t plans_simulated_overlapped = 0;
};

struct SearchResult {
  SearchSpace space = SearchSpace::full;
  std::string scorer;       // "simulator" or "estimator"
  std::string scorer_note;  // why the estimator ranks alone, if it does
  int64_t memory_budget_bytes = 0;
  SearchCandidate best;
  std::vector<SearchCandidate> ranked;            // the re-ranked candidates, best first
  std::optional<SearchCandidate> megatron, zero;  // best of each baseline space
  std::string megatron_note, zero_note;           // why a baseline is missing
  std::vector<EvaluatedPlan> evaluated;           // sample and front of every plan scored
  SearchStats stats;
};

// No plan of the space fits the memory budget. `smallest` is the plan with the smallest
// forecast peak memory that the search reached (if any plan was valid at all).
class NoFeasiblePlan : public std::runtime_error {
 public:
  NoFeasiblePlan(const std::string& what, int64_t budget, std::optional<SearchCandidate> smallest)
      : std::runtime_error(what), budget_bytes(budget), smallest(std::move(smallest)) {}
  int64_t budget_bytes;
  std::optional<SearchCandidate> smallest;
};

// Runs the search. Collective over options.comm (every process passes the same inputs and gets
// the same result). Throws InputError on contradictory options, NoFeasiblePlan when nothing fits.
SearchResult search(const ModelSpec& model, const ClusterSpec& cluster,
                    const SearchOptions& options);

// JSON of a result: best {plan, tokens_per_s, peak_memory_bytes, ...}, baselines {megatron,
// zero}, candidates, candidates_evaluated, search_time_s, scorer, memory_budget_bytes, stats,
// and evaluated_candidates {evaluated, recorded, sample_cap, sample, plans: [{tokens_per_s,
// iteration_time_s, peak_memory_bytes, origin, pareto, description}]}.
nlohmann::json to_json(const SearchResult& r);
nlohmann::json to_json(const SearchCandidate& c);

// Every plan of the space, unpruned, in a deterministic order (exhaustive checks on small
// cases): all configurations, stage partitions, embedding and per-layer strategies.
void for_each_plan(const ModelSpec& model, const ClusterSpec& cluster, const SearchOptions& options,
                   const std::function<void(const Plan&)>& visit);

}  // namespace stratagem
