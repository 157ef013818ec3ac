// Memory pre-checks: every command estimates what it will hold before it allocates, and
// refuses (InputError, exit 2) what does not fit, naming the product that makes it large; one
// place words the refusal.
#pragma once
#include <string>

#include "stratagem/cluster.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/search.hpp"

namespace stratagem::cli {

// Refuses when `need_bytes` (all processes of this node together) is above what this process
// may use (physical memory, ulimit -v, the cgroup's limit): "<cmd>: <product> needs about X
// GiB of memory, more than the Y GiB this process may use (<limit>); <remedy>".
void refuse_beyond_memory(const std::string& cmd, double need_bytes, const std::string& product,
                          const std::string& remedy);

// One line on stderr (rank 0) where a forecast peak that fits lies within 5% of the GPU's
// memory (near_gpu_memory_limit): "<cmd>: warning: the forecast peak of X GiB per GPU (<where>)
// is within 5% of the Y GiB of the cluster's GPU; ...".
void warn_near_memory_limit(const std::string& cmd, int64_t peak_bytes, const ClusterSpec& cluster,
                            const std::string& where);

// `train` on the CPU backend: its tensors (weights, gradients, optimizer states, activations:
// the cost model's peak per rank) times the ranks on this node.
void check_train_memory(const ModelSpec& model, const ClusterSpec& cluster, const Plan& plan,
                        int ranks_on_node, const std::string& cmd);

// `simulate`, `program dump` and `train`, before they build the Program, which alone grows with
// the micro-batch count (the simulator's state per rank is checked once the Program exists:
// simulation_footprint_bytes).
void check_program_memory(const ModelSpec& model, const Plan& plan, int processes_on_node,
                          const std::string& cmd);

// Every command that lays the plan out on the cluster (`plan check`, `program dump`, ...)
// before it builds the Layout, which holds each rank in its groups.
void check_layout_memory(const Plan& plan, const ClusterSpec& cluster, int processes_on_node,
                         const std::string& cmd);

// `search`'s stage DP: per thread one table of the largest stage (pp 1: every --layers layer)
// x transient classes x cover levels x memory buckets of 8 bytes (src/search/stage_dp.hpp).
void check_search_dp_memory(const ModelSpec& model, const ClusterSpec& cluster,
                            const SearchOptions& o, int threads, int processes_on_node,
                            const std::string& cmd);

// `search` with the simulator re-rank: `threads` simulations at once, each of the whole
// cluster, the worst candidate's Program one micro-batch per sample of `global_batch`.
void check_search_memory(const ModelSpec& model, const ClusterSpec& cluster, int global_batch,
                         int threads, int processes_on_node, const std::string& cmd);

}  // namespace stratagem::cli
