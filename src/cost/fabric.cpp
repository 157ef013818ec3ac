// The fabric's prices (fabric.hpp): ring, tree and two-level all-reduce, all-to-all as direct
// sends, point-to-point and PCIe copies, on the node's NVSwitch/NVLink and its share of the NICs.
#include "stratagem/fabric.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace stratagem {

const char* to_string(LinkClass l) {
  switch (l) {
    case LinkClass::intra_node:
      return "intra_node";
    case LinkClass::inter_node:
      return "inter_node";
    case LinkClass::pcie:
      return "pcie";
    case LinkClass::none:
      return "none";
  }
  return "?";
}

const char* to_string(CollectiveAlgo a) {
  switch (a) {
    case CollectiveAlgo::ring:
      return "ring";
    case CollectiveAlgo::tree:
      return "tree";
    case CollectiveAlgo::hierarchical:
      return "hierarchical";
    case CollectiveAlgo::direct:
      return "direct";
  }
  return "?";
}

namespace {
// A fat-tree path between two nodes crosses leaf, spine and leaf switches; rail-optimised
// designs keep most traffic on one rail but the worst pair still takes the spine.
constexpr int kFatTreeHops = 3;
constexpr double kInf = std::numeric_limits<double>::infinity();

CommCost infeasible(CollectiveAlgo a) {
  CommCost c;
  c.latency_s = kInf;
  c.algo = a;
  return c;
}

// Busiest of two links (intra-node fabric, NIC) that one rank's bytes cross concurrently.
CommCost busiest(double intra_bytes, double intra_gbps, double inter_bytes, double inter_gbps) {
  CommCost c;
  const double ti = intra_bytes > 0 ? intra_bytes / (intra_gbps * 1e9) : 0;
  const double te = inter_bytes > 0 ? inter_bytes / (inter_gbps * 1e9) : 0;
  if (te >= ti && inter_bytes > 0) {
    c.link = LinkClass::inter_node, c.link_bytes = inter_bytes, c.bandwidth_gbps = inter_gbps;
  } else if (intra_bytes > 0) {
    c.link = LinkClass::intra_node, c.link_bytes = intra_bytes, c.bandwidth_gbps = intra_gbps;
  }
  return c;
}
}  // namespace

FabricModel::FabricModel(const ClusterSpec& cluster) : cluster_(cluster) {
  const NodeSpec& n = cluster.node;
  gpus_per_node_ = std::max(1, n.gpus_per_node);
  intra_gbps_ = n.intra.bandwidth_gbps * n.intra.bus_efficiency;
  inter_gbps_ = cluster.internode_gbps_per_gpu() * n.nic.bus_efficiency;
  intra_step_s_ = n.intra.latency_s;
  inter_step_s_ = n.nic.latency_s + kFatTreeHops * cluster.network.switch_latency_s;
  intra_half_bytes_ = double(n.intra.half_bandwidth_bytes);
  inter_half_bytes_ = double(n.nic.half_bandwidth_bytes);
}

// ---- communication ---------------------------------------------------------------------------

double FabricModel::intra_fraction(double bytes) const {
  return intra_half_bytes_ > 0 ? bytes / (bytes + intra_half_bytes_) : 1.0;
}
double FabricModel::inter_fraction(double bytes) const {
  return inter_half_bytes_ > 0 ? bytes / (bytes + inter_half_bytes_) : 1.0;
}

// Ring: p-1 steps (all-gather, reduce-scatter) or 2(p-1) (all-reduce). Ranks of a node are
// adjacent on the ring, so only 2(N-1) resp. N-1 steps cross the network (NCCL's latency
// model), and with one channel per NIC a node's k ranks spread the ring's inter-node traffic
// over k NICs.
CommCost FabricModel::ring(Collective c, double S, int p, int N, int k) const {
  const bool ar = c == Collective::all_reduce;
  const double factor = (ar ? 2.0 : 1.0) * (p - 1) / p;
  const int steps = (ar ? 2 : 1) * (p - 1);
  const int inter_steps = (ar ? 2 : 1) * (N - 1);
  const double per_rank = factor * S;
  CommCost cc;
  if (N <= 1) {
    cc = busiest(per_rank, intra_gbps_ * intra_fraction(S), 0, 1);
  } else {
    cc = busiest(per_rank * (k - 1) / k, intra_gbps_ * intra_fraction(S), per_rank / k,
                 inter_gbps_ * inter_fraction(S));
  }
  cc.latency_s = inter_steps * inter_step_s_ + (steps - inter_steps) * intra_step_s_;
  cc.algo = CollectiveAlgo::ring;
  return cc;
}

// NCCL's tree: a chain through the k ranks of each node and a double binary tree across
// nodes, so latency grows with log2(N). Every rank of a chain forwards the whole buffer up
// (reduce) and down (broadcast); a node's k NICs carry 2S in each direction.
CommCost FabricModel::tree(double S, int p, int N, int k) const {
  (void)p;
  int depth = 0;
  while ((1 << depth) < N) ++depth;
  CommCost cc = busiest(k > 1 ? 2.0 * S : 0, intra_gbps_ * intra_fraction(S),
                        N > 1 ? 2.0 * S / k : 0, inter_gbps_ * inter_fraction(S));
  cc.latency_s = 2.0 * ((k - 1) * intra_step_s_ + depth * inter_step_s_);
  cc.algo = CollectiveAlgo::tree;
  return cc;
}

// Two-level all-reduce: reduce-scatter inside each node over NVSwitch, k concurrent ring
// all-reduces of S/k across the N nodes (one per NIC), all-gather inside the node. The phases
// run one after another, so the CommCost carries the NIC bytes at the effective bandwidth of
// the whole sequence.
CommCost FabricModel::hierarchical(double S, int p, int N, int k) const {
  (void)p;
  if (N <= 1 || k <= 1) return infeasible(CollectiveAlgo::hierarchical);
  const double intra_bytes = 2.0 * S * (k - 1) / k;
  const double inter_bytes = 2.0 * (N - 1) / N * S / k;
  const double t = intra_bytes / (intra_gbps_ * intra_fraction(S) * 1e9) +
                   inter_bytes / (inter_gbps_ * inter_fraction(S / k) * 1e9);
  CommCost cc;
  cc.link = LinkClass::inter_node;
  cc.link_bytes = inter_bytes;
  cc.bandwidth_gbps = inter_bytes / t / 1e9;
  cc.latency_s = 2.0 * (k - 1) * intra_step_s_ + 2.0 * (N - 1) * inter_step_s_;
  cc.algo = CollectiveAlgo::hierarchical;
  return cc;
}

// All-to-all as concurrent sends to every peer: S/p to each, NVSwitch inside the node and the
// GPU's own NIC share outside it (no aggregation: every rank's data is distinct).
CommCost FabricModel::direct(double S, int p, int N, int k) const {
  CommCost cc = busiest(S * (k - 1) / p, intra_gbps_ * intra_fraction(S / p), S * (p - k) / p,
                        inter_gbps_ * inter_fraction(S / p));
  cc.latency_s = N > 1 ? inter_step_s_ : intra_step_s_;
  cc.algo = CollectiveAlgo::direct;
  return cc;
}

CommCost FabricModel::collective_cost(Collective c, int64_t bytes, int size, int nodes,
                                      CollectiveAlgo algo) const {
  if (size <= 1 || bytes <= 0 || c == Collective::none) {
    CommCost z;
    z.algo = algo;
    return z;
  }
  nodes = std::clamp(nodes, 1, size);
  const int k = (size + nodes - 1) / nodes;
  const double S = double(bytes);
  switch (algo) {
    case CollectiveAlgo::ring:
      return c == Collective::all_to_all ? infeasible(algo) : ring(c, S, size, nodes, k);
    case CollectiveAlgo::tree:
      return c == Collective::all_reduce ? tree(S, size, nodes, k) : infeasible(algo);
    case CollectiveAlgo::hierarchical:
      return c == Collective::all_reduce ? hierarchical(S, size, nodes, k) : infeasible(algo);
    case CollectiveAlgo::direct:
      return c == Collective::all_to_all ? direct(S, size, nodes, k) : infeasible(algo);
  }
  return infeasible(algo);
}

CommCost FabricModel::collective_cost(Collective c, int64_t bytes, int size, int nodes) const {
  if (c == Collective::all_to_all)
    return collective_cost(c, bytes, size, nodes, CollectiveAlgo::direct);
  CommCost best = collective_cost(c, bytes, size, nodes, CollectiveAlgo::ring);
  if (c == Collective::all_reduce) {
    // As NCCL's tuner: the fastest algorithm for this size and group.
    for (CollectiveAlgo a : {CollectiveAlgo::tree, CollectiveAlgo::hierarchical}) {
      CommCost x = collective_cost(c, bytes, size, nodes, a);
      if (x.time_s() < best.time_s()) best = x;
    }
  }
  return best;
}

int FabricModel::nodes_spanned(const std::vector<int>& ranks) const {
  const int p = int(ranks.size());
  // Distinct nodes of the group (the Layout's groups spread their ranks evenly over them).
  // Layout groups list ranks in ascending order: count node changes without allocating.
  int distinct = 1;
  bool sorted = true;
  for (int i = 1; i < p && sorted; ++i) {
    sorted = ranks[i] > ranks[i - 1];
    distinct += node_of(ranks[i]) != node_of(ranks[i - 1]);
  }
  if (!sorted) {
    std::vector<int> nodes;
    nodes.reserve(ranks.size());
    for (int r : ranks) nodes.push_back(node_of(r));
    std::sort(nodes.begin(), nodes.end());
    distinct = int(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
  }
  return distinct;
}

CommCost FabricModel::collective_cost(Collective c, int64_t bytes,
                                      const std::vector<int>& ranks) const {
  const int p = int(ranks.size());
  if (p <= 1) return collective_cost(c, bytes, p, 1);
  return collective_cost(c, bytes, p, nodes_spanned(ranks));
}

CommCost FabricModel::p2p_cost(int64_t bytes, bool same_node) const {
  CommCost cc;
  cc.algo = CollectiveAlgo::direct;
  if (bytes <= 0) return cc;
  const double S = double(bytes);
  cc.link_bytes = S;
  if (same_node) {
    cc.link = LinkClass::intra_node;
    cc.bandwidth_gbps = intra_gbps_ * intra_fraction(S);
    cc.latency_s = intra_step_s_;
  } else {
    cc.link = LinkClass::inter_node;
    cc.bandwidth_gbps = inter_gbps_ * inter_fraction(S);
    cc.latency_s = inter_step_s_;
  }
  return cc;
}

CommCost FabricModel::p2p_cost(int64_t bytes, int src_rank, int dst_rank) const {
  return p2p_cost(bytes, node_of(src_rank) == node_of(dst_rank));
}

CommCost FabricModel::copy_cost(int64_t bytes) const {
  CommCost cc;
  cc.algo = CollectiveAlgo::direct;
  if (bytes <= 0) return cc;
  cc.link = LinkClass::pcie;
  cc.link_bytes = double(bytes);
  // An achieved figure already; the GPUs behind one PCIe switch share its uplink.
  cc.bandwidth_gbps =
      cluster_.node.pcie.bandwidth_gbps / std::max(1, cluster_.node.gpus_per_pcie_switch);
  cc.latency_s = cluster_.node.pcie.latency_s;
  return cc;
}

}  // namespace stratagem
