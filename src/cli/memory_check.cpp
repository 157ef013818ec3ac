#include "src/cli/memory_check.hpp"

#include <algorithm>
#include <cstdio>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
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

void check_train_memory(const ModelSpec& model, const ClusterSpec& cluster, const Plan& plan,
                        int ranks_on_node, const std::string& cmd) {
  // The cost model's peak is the Program's accounting, which the executor's ledger follows
  // within 10% (test/runtime/memory_forecast.sh).
  const CostModel cost(model, cluster, plan);
  int64_t peak = 0;
  for (const MemoryBreakdown& m : stage_memory(cost)) peak = std::max(peak, m.total_bytes());
  refuse_beyond_memory(cmd, double(peak) * std::max(1, ranks_on_node),
                       "the training state (--layers " + std::to_string(model.layers) +
                           " x --hidden " + std::to_string(model.hidden) + ", --vocab " +
                           std::to_string(model.vocab) + ", micro-batch " +
                           std::to_string(plan.micro_batch) + " x --seq-len " +
                           std::to_string(model.seq_len) + ", " + std::to_string(ranks_on_node) +
                           " rank(s) on this node)",
                       "train a smaller model, a smaller micro-batch, or over more ranks");
}

void check_simulate_memory(const ModelSpec& model, const Plan& plan, int processes_on_node,
                           bool trace, int iterations, const std::string& cmd) {
  // The Program holds, per stage and micro-batch, a few dozen ops per layer (compute,
  // collectives, transfers, allocations and their dependencies); the simulator indexes each op
  // again. Measured on gpt2-124m plans: at most kOpsPerLayer x layers + kOpsPerStage x pp ops
  // per micro-batch, ~kBytesPerOp bytes each while the simulation runs (--trace adds a span).
  constexpr double kOpsPerLayer = 40, kOpsPerStage = 40, kBytesPerOp = 160, kSpanBytes = 120;
  const double ops = double(plan.num_microbatches()) *
                     (kOpsPerLayer * model.layers * std::max(1, plan.vpp) / std::max(1, plan.vpp) +
                      kOpsPerStage * plan.pp * std::max(1, plan.vpp));
  double bytes = ops * kBytesPerOp;
  if (trace) bytes += ops * double(plan.world_size()) / plan.pp * iterations * kSpanBytes;
  refuse_beyond_memory(cmd, bytes * std::max(1, processes_on_node),
                       "the Program of " + std::to_string(plan.num_microbatches()) +
                           " micro-batches (--global-batch " + std::to_string(plan.global_batch) +
                           " / (--micro-batch " + std::to_string(plan.micro_batch) + " x dp)) x " +
                           std::to_string(model.layers) + " layers",
                       "simulate a smaller --global-batch or a larger --micro-batch");
}

}  // namespace stratagem::cli
