// Where the system layer meets the network: an op's bytes join a resource as a flow, and the
// network's changed predictions reach the flows' owners, which re-schedule their completion
// events once all changes of a step are in (flush_owners), so an owner pushes one event per
// step rather than one per change.
#include "sim/matcher.hpp"

namespace stratagem::sim {

void Matcher::join_flow(int res, int64_t work, int64_t share, Time join, OwnerKind kind, int owner,
                        int slot, Time now) {
  // Every process holding a GPU of a node keeps a replica of its NIC's fluid model.
  if (kind != kOwnForeign)
    for (int p : pdes_.partition().res_holders[res])
      if (p != pdes_.me()) {
        Msg m{};
        m.type = kMsgJoin;
        m.i0 = res;
        m.t0 = join;
        m.x = work;
        m.y = share;
        m.effect = join;
        pdes_.send(p, m);
      }
  network_.join(res, work, share, join, kind, owner, slot, now);
}

void Matcher::finish_changed(OwnerKind kind, int32_t owner, int32_t slot, Time fin) {
  if (kind == kOwnColl)
    collectives_[owner].members[slot].fin = fin;
  else
    transfers_[owner].fin = fin;
  mark_owner(kind, owner);
}

void Matcher::mark_owner(OwnerKind kind, int id) {
  bool& dirty = kind == kOwnColl ? collectives_[id].owner_dirty : transfers_[id].owner_dirty;
  if (!dirty) {
    dirty = true;
    owners_to_update_.push_back({kind, id});
  }
}

void Matcher::flush_owners() {
  for (size_t i = 0; i < owners_to_update_.size(); ++i) {
    const auto [k, id] = owners_to_update_[i];
    if (k == kOwnColl)
      coll_update(id);
    else
      xfer_update(id);
  }
  owners_to_update_.clear();
}

}  // namespace stratagem::sim
