// The prices of an MoE layer's ops: its compute parts at their real per-expert GEMM shapes,
// paced by the busiest expert rank, and its all-to-alls on the node and network fabric.
#include <algorithm>
#include <cmath>

#include "stratagem/cost.hpp"
#include "stratagem/workload_moe.hpp"

namespace stratagem {

double CostModel::moe_compute_time_s(const Op& op) const {
  const Phase ph = op.phase == Phase::backward ? Phase::backward : Phase::forward;
  return moe_part_time_s(layer_strategy(op), op.block, ph, op.samples, op.strategy.expert_load);
}

double CostModel::moe_part_time_s(const LayerStrategy& s, Block part, Phase ph, int samples,
                                  double busiest_load) const {
  Op op;
  op.block = part, op.phase = ph, op.samples = samples;
  // The busiest rank's experts take expert_load_factor times the mean rows; the router and
  // the combine work on the rank's own tokens, balanced whatever the routing.
  const double load = op.block == Block::experts ? busiest_load : 1.0;
  const bool bwd = op.phase == Phase::backward;
  const MoeWork w = bwd ? moe_backward_work(model_, s, op.samples, load)
                        : moe_forward_work(model_, s, op.samples, load);
  double t = block_time_s(w.part(op.block));
  if (bwd && !framework_.wgrad_accumulation_fused) {
    // The add of each micro-batch's weight gradients into the accumulation buffer (as
    // backward_block_time_s for the dense blocks): the experts' and the router's.
    int64_t params = 0;
    if (op.block == Block::experts) params = moe_expert_parameters_per_rank(model_, s);
    if (op.block == Block::router) params = moe_dense_parameters_per_rank(model_, s);
    t += elementwise_time_s(double(params) *
                            (elem_bytes_ + 2.0 * framework_.grad_accumulation_bytes));
  }
  return t;
}

CommCost CostModel::moe_comm_cost(Collective c, int64_t bytes, int p, int N, double load,
                                  int node_limit) const {
  const double S = double(bytes) * load;
  if (p <= 1 || bytes <= 0) return fabric_.collective_cost(c, 0, 1, 1);
  N = std::clamp(N, 1, p);
  if (c != Collective::all_to_all)
    return fabric_.collective_cost(c, int64_t(std::llround(S)), p, N);
  const int k = (p + N - 1) / N;  // ranks of the group per node
  // Each copy goes to a rank of the group chosen by its expert: (k - 1) / p of them stay on
  // the node (NVLink), (p - k) / p cross the network (FabricModel::direct).
  double intra = S * (k - 1) / p, inter = S * (p - k) / p;
  const int top_k = std::max(1, model_.moe.top_k);
  const int limit = node_limit;
  if (limit > 0 && N > 1) {
    // Node-limited routing (DeepSeek-V3 §3.2.2): a token's experts lie on at most `limit`
    // nodes, and one copy per node crosses the network, which NVLink forwards to the GPUs
    // of that node holding its experts.
    const double per_token = S / top_k;
    const double limited = per_token * std::min(limit, top_k) * (N - 1) / N;
    if (limited < inter) {
      intra += inter;  // the forwarded copies, on the receiving node
      inter = limited;
    }
  }
  const double msg = S / p;
  CommCost cc;
  const double ig = fabric_.intra_gbps() * fabric_.intra_fraction(msg);
  const double eg = fabric_.inter_gbps_per_gpu() * fabric_.inter_fraction(msg);
  const double ti = intra > 0 ? intra / (ig * 1e9) : 0, te = inter > 0 ? inter / (eg * 1e9) : 0;
  if (te >= ti && inter > 0) {
    cc.link = LinkClass::inter_node, cc.link_bytes = inter, cc.bandwidth_gbps = eg;
  } else if (intra > 0) {
    cc.link = LinkClass::intra_node, cc.link_bytes = intra, cc.bandwidth_gbps = ig;
  }
  cc.latency_s = N > 1 ? fabric_.inter_step_s() : fabric_.intra_step_s();
  cc.algo = CollectiveAlgo::direct;
  return cc;
}

}  // namespace stratagem
