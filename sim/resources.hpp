// The network layer: the links that concurrent transfers share, as an integer fluid model.
// Per GPU its NVSwitch port (egress) and its PCIe link in each direction; per node its NICs
// (the fat-tree's per-node uplink). While the shares of a resource's flows sum past kS, every
// flow on it progresses at kS/sum of its full speed (proportional share).
//
// The layers above see only this interface: a flow joins a resource with its work and share,
// and the network reports whose predicted finish changed. A resource advances to the present
// and runs its flows forward to predict every finish only when a flow joins; until then the
// predictions are exact, so an owner schedules one completion event and re-schedules it only
// when a prediction changes.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/pool.hpp"
#include "sim/types.hpp"

namespace stratagem::sim {

// Who waits for a flow: a collective's member (owner = collective, slot = member), a send or
// copy (owner = transfer), or nobody on this process (a flow of another process on a NIC whose
// fluid model this process replicates).
enum OwnerKind : uint8_t { kOwnColl, kOwnXfer, kOwnForeign };

// The layer above: told whenever the predicted finish of a flow it owns changes.
class FlowOwners {
 public:
  virtual void finish_changed(OwnerKind kind, int32_t owner, int32_t slot, Time fin) = 0;

 protected:
  ~FlowOwners() = default;
};

class Network {
 public:
  void init(int world_size, int gpus_per_node, FlowOwners* owners);
  int size() const { return int(links_.size()); }
  // The resource a transfer of `rank` over `link` loads (-1: none).
  int resource_of(LinkClass link, int rank, OpKind kind) const {
    switch (link) {
      case LinkClass::intra_node:
        return 3 * rank;
      case LinkClass::inter_node:
        return nic_of_node(rank / gpus_per_node_);
      case LinkClass::pcie:
        return 3 * rank + (kind == OpKind::copy_h2d ? 1 : 2);
      default:
        return -1;
    }
  }
  int nic_of_node(int node) const { return 3 * world_ + node; }

  // Adds a flow of `work` units (kS per ns at full speed) taking `share` from `join` on,
  // `now` being the present, and tells the owners of the resource's flows (this one included)
  // whose predicted finish changed.
  void join(int res, int64_t work, int64_t share, Time join, OwnerKind kind, int32_t owner,
            int32_t slot, Time now);

 private:
  struct Flow {
    int64_t remaining = 0, share = 0;  // work left (kS units), share of the resource
    Time join = 0, fin = kNever;
    OwnerKind owner_kind = kOwnForeign;
    int32_t owner = -1, slot = 0;
  };
  struct Link {
    Time t = 0;  // the flows' remaining work is as of t
    int64_t share_sum = 0;
    std::vector<int32_t> active, pending;  // pending sorted by join
  };
  struct Scratch {
    int32_t id;
    int64_t remaining, share;
  };

  void add(int rid, int fid, Time now);
  void advance(Link& link, Time T);
  void predict(Link& link);
  void set_fin(int fid, Time fin);

  int world_ = 0, gpus_per_node_ = 1;
  std::vector<Link> links_;
  Pool<Flow> flows_;
  std::vector<Scratch> scratch_;
  FlowOwners* owners_ = nullptr;
};

}  // namespace stratagem::sim
