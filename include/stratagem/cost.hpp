// The cost model: what each Program op costs on a modeled cluster, in time and in bytes. The
// simulator (sim/) and the fast estimator (estimate.hpp) both take every figure from here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/program.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

// Which physical resource a transfer's bytes cross.
enum class LinkClass : uint8_t { intra_node, inter_node, pcie, none };
enum class CollectiveAlgo : uint8_t { ring, tree, hierarchical, direct };
const char* to_string(LinkClass l);
const char* to_string(CollectiveAlgo a);

// Time of a transfer split into a fixed latency part and a bandwidth part, so that the
// simulator can share the bandwidth part between concurrent transfers on one resource.
// Uncontended time = latency_s + link_bytes / (bandwidth_gbps * 1e9).
struct CommCost {
  double latency_s = 0;
  double link_bytes = 0;       // bytes each rank pushes through its busiest link
  double bandwidth_gbps = 0;   // achieved bandwidth of that link for this message size
  LinkClass link = LinkClass::none;
  CollectiveAlgo algo = CollectiveAlgo::direct;
  double time_s() const { return latency_s + (bandwidth_gbps > 0 ? link_bytes / (bandwidth_gbps * 1e9) : 0); }
};

class CostModel {
 public:
  CostModel(const ModelSpec& model, const ClusterSpec& cluster, const Plan& plan);

  // Compute ops (and host_compute): roofline with shape-dependent GEMM efficiency, attention
  // kernel efficiency, elementwise traffic at achieved HBM bandwidth, launch overheads.
  double compute_time_s(const Op& op) const;
  double gemm_time_s(const Gemm& g) const;
  double block_time_s(const BlockWork& w) const;

  // Collectives over explicit ranks (the Layout's group); the algorithm is chosen per call.
  CommCost collective_cost(Collective c, int64_t bytes, const std::vector<int>& ranks) const;
  // Collective over a group of `size` ranks spread over `nodes` nodes (same cost as above, for
  // callers without a Layout, such as the fast estimator).
  CommCost collective_cost(Collective c, int64_t bytes, int size, int nodes) const;
  CommCost p2p_cost(int64_t bytes, int src_rank, int dst_rank) const;
  CommCost copy_cost(int64_t bytes) const;  // host <-> device over PCIe
  // Any op of a rank's program (group/peer resolved through the layout).
  CommCost comm_cost(const Op& op, const Layout& layout, int rank) const;
  double op_time_s(const Op& op, const Layout& layout, int rank) const;

  const ModelSpec& model() const { return model_; }
  const ClusterSpec& cluster() const { return cluster_; }
  const Plan& plan() const { return plan_; }
  double peak_flops() const;  // of the plan's dtype

 private:
  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  const Plan& plan_;
};

struct MemoryBreakdown {
  int64_t weights_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t activations_bytes = 0;
  int64_t buffers_bytes = 0;        // communication, gathered ZeRO-3 weights, logits
  int64_t context_bytes = 0;        // CUDA context and library workspaces (stated per cluster)
  int64_t fragmentation_bytes = 0;  // caching-allocator loss (stated per cluster)
  int64_t total_bytes() const {
    return weights_bytes + grads_bytes + optimizer_bytes + activations_bytes + buffers_bytes +
           context_bytes + fragmentation_bytes;
  }
};

}  // namespace stratagem
