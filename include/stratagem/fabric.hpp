// The cluster's fabric as the cost model prices it: what a collective, a send or a PCIe copy
// costs between ranks placed on nodes of gpus_per_node GPUs (NCCL-like alpha-beta models on the
// node and NIC topology). The cost model (cost.hpp) prices every op's transfer here; the
// estimator and the search price group collectives here directly.
#pragma once
#include <cstdint>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/program.hpp"

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
  double link_bytes = 0;      // bytes each rank pushes through its busiest link
  double bandwidth_gbps = 0;  // achieved bandwidth of that link for this message size
  LinkClass link = LinkClass::none;
  CollectiveAlgo algo = CollectiveAlgo::direct;
  double time_s() const {
    return latency_s + (bandwidth_gbps > 0 ? link_bytes / (bandwidth_gbps * 1e9) : 0);
  }
};

class FabricModel {
 public:
  // Keeps a reference: the cluster must outlive the FabricModel.
  explicit FabricModel(const ClusterSpec& cluster);

  // Collectives over explicit ranks (the Layout's group); the algorithm is chosen per call.
  // `bytes` is the whole buffer: the input of all-reduce and reduce-scatter, the output of
  // all-gather, and everything one rank sends in an all-to-all.
  CommCost collective_cost(Collective c, int64_t bytes, const std::vector<int>& ranks) const;
  // Collective over a group of `size` ranks spread over `nodes` nodes (same cost as above, for
  // callers without a Layout, such as the fast estimator).
  CommCost collective_cost(Collective c, int64_t bytes, int size, int nodes) const;
  // One algorithm, without the choice (tree and hierarchical apply to all-reduce only; an
  // algorithm that does not apply costs infinity).
  CommCost collective_cost(Collective c, int64_t bytes, int size, int nodes,
                           CollectiveAlgo algo) const;
  CommCost p2p_cost(int64_t bytes, int src_rank, int dst_rank) const;
  CommCost p2p_cost(int64_t bytes, bool same_node) const;
  CommCost copy_cost(int64_t bytes) const;  // host <-> device over PCIe
  int node_of(int rank) const { return rank / gpus_per_node_; }
  // Distinct nodes holding `ranks`.
  int nodes_spanned(const std::vector<int>& ranks) const;

  // Achieved large-message bandwidth per GPU, GB/s per direction, of the NVSwitch/NVLink fabric
  // and of the GPU's share of its node's NICs (after oversubscription).
  double intra_gbps() const { return intra_gbps_; }
  double inter_gbps_per_gpu() const { return inter_gbps_; }
  // Latency of one step of a collective inside a node and across nodes (NIC + switch hops).
  double intra_step_s() const { return intra_step_s_; }
  double inter_step_s() const { return inter_step_s_; }
  // S / (S + half): the message-size ramp of the achieved bandwidth inside a node and across.
  double intra_fraction(double bytes) const;
  double inter_fraction(double bytes) const;

 private:
  CommCost ring(Collective c, double bytes, int size, int nodes, int per_node) const;
  CommCost tree(double bytes, int size, int nodes, int per_node) const;
  CommCost hierarchical(double bytes, int size, int nodes, int per_node) const;
  CommCost direct(double bytes, int size, int nodes, int per_node) const;

  const ClusterSpec& cluster_;
  int gpus_per_node_ = 1;
  double intra_gbps_ = 0, inter_gbps_ = 0;
  double intra_step_s_ = 0, inter_step_s_ = 0;
  double intra_half_bytes_ = 0, inter_half_bytes_ = 0;
};

}  // namespace stratagem
