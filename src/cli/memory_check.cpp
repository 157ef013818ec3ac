#include "src/cli/memory_check.hpp"

#include <algorithm>
#include <cstdio>

#include "src/cli/command.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::cli {

namespace {
std::string gib_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1LL << 30));
  return buf;
}
}  // namespace

void refuse_beyond_memory(const std::string& cmd, double need_bytes, const std::string& product,
                          const std::string& remedy) {
  std::string by;
  const double have = double(memory_limit_bytes(&by));
  if (need_bytes <= have) return;
  throw InputError(cmd + ": " + product + " needs about " + gib_text(need_bytes) +
                   " of memory, more than the " + gib_text(have) + " this process may use (" + by +
                   "); " + remedy);
}

void warn_near_memory_limit(const std::string& cmd, int64_t peak_bytes, const ClusterSpec& cluster,
                            const std::string& where) {
  if (world_rank() != 0 || !near_gpu_memory_limit(peak_bytes, cluster)) return;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(peak_bytes) / double(1LL << 30));
  std::string peak = buf;
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(cluster.gpu.hbm_bytes) / double(1LL << 30));
  std::fprintf(stderr,
               "%s: warning: the forecast peak of %s per GPU (%s) is within %.0f%% of the %s of "
               "the cluster's GPU; memory the forecast does not see could run it out\n",
               cmd.c_str(), peak.c_str(), where.c_str(), 100 * kMemoryWarnFraction, buf);
}

void check_train_memory(const ModelSpec& model, const ClusterSpec& cluster, const Plan& plan,
                        int ranks_on_node, const std::string& cmd) {
  // The cost model's peak is the Program's accounting, which the executor's ledger follows
  // within 10% (test/runtime/memory_forecast.sh).
  const CostModel cost(model, cluster, plan.dtype);
  int64_t peak = 0;
  for (const MemoryBreakdown& m : stage_memory(cost, plan)) peak = std::max(peak, m.total_bytes());
  refuse_beyond_memory(cmd, double(peak) * std::max(1, ranks_on_node),
                       "the training state (--layers " + std::to_string(model.layers) +
                           " x --hidden " + std::to_string(model.hidden) + ", --vocab " +
                           std::to_string(model.vocab) + ", micro-batch " +
                           std::to_string(plan.micro_batch) + " x --seq-len " +
                           std::to_string(model.seq_len) + ", " + std::to_string(ranks_on_node) +
                           " rank(s) on this node)",
                       "train a smaller model, a smaller micro-batch, or over more ranks");
}

namespace {
// The Program of `microbatches` micro-batches while the simulator runs it: per micro-batch
// about 14 ops per layer (compute, collectives, allocations and their dependencies) and 10 per
// stage (transfers, embedding, head), each held by the Program and indexed by the simulator.
// Measured: gpt2-124m, tp 2 x pp 4, 1,024 to 8,192 micro-batches grow RSS 16 KiB per
// micro-batch, 1.34 KiB per layer; this gives 1.5 KiB per layer and 1 KiB per stage.
double program_bytes(const ModelSpec& model, const Plan& plan, double microbatches) {
  return microbatches * (1536.0 * model.layers + 1024.0 * plan.pp);
}
}  // namespace

void check_program_memory(const ModelSpec& model, const Plan& plan, int processes_on_node,
                          const std::string& cmd) {
  const double bytes = program_bytes(model, plan, plan.num_microbatches());
  refuse_beyond_memory(cmd, bytes * std::max(1, processes_on_node),
                       "the Program of " + std::to_string(plan.num_microbatches()) +
                           " micro-batches (--global-batch " + std::to_string(plan.global_batch) +
                           " / (--micro-batch " + std::to_string(plan.micro_batch) + " x dp)) x " +
                           std::to_string(model.layers) + " layers",
                       "use a smaller --global-batch or a larger --micro-batch");
}

void check_layout_memory(const Plan& plan, const ClusterSpec& cluster, int processes_on_node,
                         const std::string& cmd) {
  // Each rank sits in a tensor and a data-parallel group per tp degree of the plan, and in its
  // stage's cp, reshard and expert groups: a group of one rank (tp 1) costs its Group record,
  // its vector's heap block and the rank. Measured: plan check of 10^7 ranks at dp 10^7 (tp 1)
  // grows RSS by 0.92 GB, 92 bytes a rank; this gives 256 bytes a rank per tp degree.
  std::vector<int> degrees;
  for (const LayerStrategy& l : plan.layers)
    if (std::find(degrees.begin(), degrees.end(), l.tp) == degrees.end()) degrees.push_back(l.tp);
  const double bytes =
      256.0 * double(cluster.world_size()) * double(std::max<size_t>(1, degrees.size()));
  refuse_beyond_memory(cmd, bytes * std::max(1, processes_on_node),
                       "the layout of " + std::to_string(cluster.world_size()) +
                           " ranks (--nodes " + std::to_string(cluster.nodes) +
                           " x --gpus-per-node " + std::to_string(cluster.node.gpus_per_node) + ")",
                       "lay out fewer --nodes or fewer --gpus-per-node");
}

void check_search_dp_memory(const ModelSpec& model, const ClusterSpec& cluster,
                            const SearchOptions& o, int threads, int processes_on_node,
                            const std::string& cmd) {
  // The searcher's buckets (Searcher's constructor): 64 MiB, or budget / 1024 when finer, over
  // 1.25 x the budget; at least 1,280 buckets whatever the GPU. Measured: --layers 1000 grows
  // RSS by 175 MB on 2 threads, this gives 61 MB a table.
  const double budget =
      double(o.memory_budget_bytes > 0 ? o.memory_budget_bytes : cluster.gpu.hbm_bytes);
  const double bucket = o.memory_resolution_bytes > 0
                            ? double(o.memory_resolution_bytes)
                            : std::clamp(budget / 1024, double(1 << 20), double(64 << 20));
  const double buckets = 1.25 * budget / bucket + 1;
  const double per_table = 8.0 * model.layers * std::max(1, o.max_tr_classes) *
                           (std::max(0, o.max_kept_levels) + 1) * buckets;
  refuse_beyond_memory(cmd, per_table * std::max(1, threads) * std::max(1, processes_on_node),
                       "the stage DP (--layers " + std::to_string(model.layers) + " x " +
                           std::to_string(int64_t(buckets)) + " memory buckets, " +
                           std::to_string(threads) + " thread(s))",
                       "search a model of fewer --layers, or with fewer --threads");
}

void check_search_memory(const ModelSpec& model, const ClusterSpec& cluster, int global_batch,
                         int threads, int processes_on_node, const std::string& cmd) {
  // The re-rank simulates `threads` candidates at once, each every rank of the cluster; the
  // worst candidate (dp 1, micro-batch 1) runs a Program of one micro-batch per sample.
  Plan worst;
  worst.pp = 1;
  const double per_simulation =
      double(simulation_footprint_bytes(Program{}, cluster.world_size(), SimOptions{})) +
      program_bytes(model, worst, double(global_batch));
  refuse_beyond_memory(
      cmd, per_simulation * std::max(1, threads) * std::max(1, processes_on_node),
      "the simulator re-rank (" + std::to_string(threads) + " thread(s), each simulating " +
          std::to_string(cluster.world_size()) + " ranks (--nodes " +
          std::to_string(cluster.nodes) + ") and up to " + std::to_string(global_batch) +
          " micro-batches (--global-batch))",
      "use --rerank estimator, fewer --nodes, a smaller --global-batch or fewer --threads");
}

}  // namespace stratagem::cli
