// The GPU process ledger: what a rank's CUDA process holds on the device beside its tensors,
// and the one formula from tensors to allocated, reserved and device bytes (cost.hpp). The
// figures are the cluster file's gpu.process (data/clusters/README.md, "The GPU process
// ledger", with the sources); the communicators are those the plan's Layout gives a rank of
// the stage (layout.hpp), counted here from the same rank geometry without building a Layout.
#include "src/cost/process_memory.hpp"

#include <algorithm>
#include <utility>

#include "stratagem/cost.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/rank_geometry.hpp"

namespace stratagem {

DeviceMemory device_memory(int64_t tensor_bytes, const ProcessMemory& p, double fragmentation) {
  DeviceMemory d;
  d.allocated_bytes = tensor_bytes + p.cublas_workspace_bytes;
  d.fragmentation_bytes = static_cast<int64_t>(fragmentation * double(d.allocated_bytes));
  d.reserved_bytes = d.allocated_bytes + d.fragmentation_bytes;
  d.device_bytes = d.reserved_bytes + p.cuda_context_bytes + p.nccl_buffers_bytes;
  return d;
}

void MemoryBreakdown::set_process(const ProcessMemory& p, double fragmentation) {
  const DeviceMemory d = device_memory(tensor_bytes(), p, fragmentation);
  cublas_workspace_bytes = p.cublas_workspace_bytes;
  fragmentation_bytes = d.fragmentation_bytes;
  cuda_context_bytes = p.cuda_context_bytes;
  nccl_buffers_bytes = p.nccl_buffers_bytes;
}

namespace {

// NCCL's most channels a communicator uses (MAXCHANNELS, src/include/device.h).
constexpr int kNcclMaxChannels = 32;

// NCCL's device buffers on one rank, summed over its communicators (NCCL 2.21: init.cc
// initTransportsRank connects every channel's ring and tree when a communicator is created;
// transport/p2p.cc allocates each connection's buffers; transport/nvls.cc the NVLS buffers).
class NcclLedger {
 public:
  NcclLedger(const GpuProcessSpec& g, int nics_per_node) : g_(g), nics_(nics_per_node) {}

  // A communicator of `ranks` ranks on `nodes` nodes used for collectives: each channel's ring
  // (a receive from the previous rank, a send to the next) and tree (a chain inside a node: its
  // parent and child; with two ranks the ring's peer), so two connections a channel beyond two
  // ranks. Inside a node every channel the GPU's NVLinks carry; across nodes two per NIC that
  // its ranks on a node reach. NVLink SHARP adds its buffers where a node holds more than two of
  // its ranks (nvls.cc: none for two GPUs), each of those ranks a head.
  void collective(int ranks, int nodes) {
    if (ranks < 2) return;
    const int local = (ranks + nodes - 1) / nodes;
    const int channels =
        nodes == 1 ? g_.nccl_channels_intra
                   : std::min(kNcclMaxChannels, g_.nccl_channels_per_nic * std::min(local, nics_));
    const int connections = ranks == 2 ? 1 : 2;
    bytes_ += int64_t(channels) * connections * g_.nccl_connection_bytes;
    if (g_.nccl_nvls_channels > 0 && local > 2)
      bytes_ += int64_t(g_.nccl_nvls_channels) * g_.nccl_nvls_channel_bytes * local;
  }
  // Point-to-point traffic to `peers` ranks on this rank's node and `remote` on others: each
  // peer's channels (its own connections, beside the collective ones).
  void p2p(int peers, int remote) {
    bytes_ += (int64_t(peers) * g_.nccl_p2p_channels_intra +
               int64_t(remote) * g_.nccl_p2p_channels_inter) *
              g_.nccl_connection_bytes;
  }
  // An all-to-all over a communicator: point-to-point to every other rank.
  void all_to_all(int ranks, int nodes) {
    const int local = (ranks + nodes - 1) / nodes;
    p2p(local - 1, ranks - local);
  }
  int64_t bytes() const { return bytes_; }

 private:
  const GpuProcessSpec& g_;
  const int nics_;
  int64_t bytes_ = 0;
};

}  // namespace

ProcessMemory process_memory(const ModelSpec& model, const ClusterSpec& c, const Plan& p,
                             int stage) {
  return cost_detail::process_memory(model, c, p, cost_detail::stage_communicators(p, stage),
                                     stage);
}

namespace cost_detail {

// The strategies the stage runs: its chunks' layers, and the embedding's where it holds the
// embedding (stage 0) or the LM head (the last stage). Layers of one tp degree share their tp,
// dp and cp groups (layout.hpp); a layer held differently from the one before it (or the head
// from the last layer) meets it in a reshard group of the smaller degree's stride.
void StageCommunicators::hold(const LayerStrategy& s, const LayerStrategy* before) {
  tps.insert(s.tp);
  if (s.cp > 1) cps.insert({s.tp, s.cp, s.cp_kind});
  if (s.ep * s.etp > 1) experts.insert({s.etp, s.ep});
  if (before && before->stream_tp() != s.stream_tp()) {
    const int a = std::min(before->stream_tp(), s.stream_tp());
    const int b = std::max(before->stream_tp(), s.stream_tp());
    if (b % a == 0) reshards.insert({a, b});
  }
}

StageCommunicators stage_communicators(const Plan& p, int stage) {
  StageCommunicators x;
  const int pp = p.pp;
  x.first = stage == 0;
  x.last = stage == pp - 1;
  if (x.first) x.hold(p.embedding, nullptr);
  for (size_t ch = size_t(stage); ch < p.chunks.size(); ch += size_t(pp)) {
    const LayerRange r = p.chunks[ch];
    for (int l = r.begin; l < r.end; ++l) {
      if (l > r.begin && p.layers[l] == p.layers[l - 1]) continue;  // adds nothing
      x.hold(p.layers[l], l == 0 ? &p.embedding : &p.layers[l - 1]);
    }
  }
  if (x.last) x.hold(p.embedding, &p.layers.back());
  return x;
}

ProcessMemory process_memory(const ModelSpec& model, const ClusterSpec& c, const Plan& p,
                             const StageCommunicators& comms, int stage) {
  const GpuProcessSpec& g = c.gpu.process;
  ProcessMemory out;
  out.cuda_context_bytes = g.cuda_context_bytes;
  // The framework's GEMMs run on one stream (autograd's backward on the forward's).
  out.cublas_workspace_bytes = g.cublas_workspace_bytes;
  const RankGeometry geo{std::max(1, c.node.gpus_per_node), p.devices_per_stage()};
  const int D = p.devices_per_stage(), pp = p.pp;
  NcclLedger nccl(g, c.node.nic_count);
  for (int tp : comms.tps) {
    nccl.collective(tp, geo.tp_nodes(stage, tp));
    nccl.collective(D / tp, geo.dp_nodes(stage, tp));  // the dp group, cp x dp ranks
  }
  for (const auto& [tp, cp, kind] : comms.cps) {
    const int nodes = geo.cp_nodes(stage, tp, cp);
    nccl.collective(cp, nodes);
    if (kind == CpKind::a2a) nccl.all_to_all(cp, nodes);
    // The ring passes K and V to the next rank and takes them from the previous one.
    if (kind == CpKind::ring)
      nodes == 1 ? nccl.p2p(std::min(cp - 1, 2), 0) : nccl.p2p(0, std::min(cp - 1, 2));
  }
  for (const auto& [a, b] : comms.reshards)
    nccl.collective(b / a, geo.strided_nodes(geo.rank_of(stage, 0), b / a, a));
  for (const auto& [etp, ep] : comms.experts) {
    const int nodes = geo.ep_nodes(stage, etp, ep);
    nccl.collective(ep, nodes);
    nccl.all_to_all(ep, nodes);
    nccl.collective(D / (etp * ep), geo.expert_dp_nodes(stage, etp, ep));
    nccl.collective(etp, geo.expert_tp_nodes(stage, etp));
  }
  if (pp > 1) {
    // The pipeline's communicator (its pp ranks of one local index) and its sends to the
    // neighbouring stages.
    nccl.collective(pp, geo.strided_nodes(geo.rank_of(0, 0), pp, D));
    for (int t : {stage - 1, stage + 1}) {
      if (t < 0 || t >= pp) continue;
      geo.same_node(stage, t) ? nccl.p2p(1, 0) : nccl.p2p(0, 1);
    }
    // The first and the last stage sum the tied embedding's gradients (layer_cost.cpp).
    if ((comms.first || comms.last) && model.tied_embeddings)
      nccl.collective(2, geo.same_node(0, pp - 1) ? 1 : 2);
  }
  out.nccl_buffers_bytes = nccl.bytes();
  return out;
}

}  // namespace cost_detail

}  // namespace stratagem
