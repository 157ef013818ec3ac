// Memory pre-checks: every command estimates what it will hold before it allocates, and
// refuses (InputError, exit 2) what does not fit, naming the product that makes it large; one
// place words the refusal.
#pragma once
#include <string>

#include "stratagem/cluster.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"

namespace stratagem::cli {

// Refuses when `need_bytes` (all processes of this node together) is above what this process
// may use (physical memory, ulimit -v, the cgroup's limit): "<cmd>: <product> needs about X
// GiB of memory, more than the Y GiB this process may use (<limit>); <remedy>".
void refuse_beyond_memory(const std::string& cmd, double need_bytes, const std::string& product,
                          const std::string& remedy);

// `train` on the CPU backend: its tensors (weights, gradients, optimizer states, activations:
// the cost model's peak per rank) times the ranks on this node.
void check_train_memory(const ModelSpec& model, const ClusterSpec& cluster, const Plan& plan,
                        int ranks_on_node, const std::string& cmd);

// `simulate` before it builds the Program: its ops (one per block, collective and transfer
// per micro-batch and stage) and the simulator's state per simulated rank.
void check_simulate_memory(const ModelSpec& model, const Plan& plan, int processes_on_node,
                           bool trace, int iterations, const std::string& cmd);

}  // namespace stratagem::cli
