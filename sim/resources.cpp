// The integer fluid model of shared links (see resources.hpp).
#include "sim/resources.hpp"

#include <algorithm>

namespace stratagem::sim {
namespace {

// Proportional share: every flow on a resource whose weights sum past kS slows by the same
// factor, so n flows that each fill the link take n times as long.
inline int64_t share_rate(int64_t share_sum) {
  return share_sum <= kS ? kS : std::max<int64_t>(1, (kS * kS) / share_sum);
}

}  // namespace

void Network::init(int world_size, int gpus_per_node, FlowOwners* owners) {
  owners_ = owners;
  world_ = world_size;
  gpus_per_node_ = gpus_per_node;
  links_.resize(size_t(3) * world_ + (world_ + gpus_per_node_ - 1) / gpus_per_node_);
}

void Network::join(int res, int64_t work, int64_t share, Time join, OwnerKind kind, int32_t owner,
                   int32_t slot, Time now) {
  const int fid = flows_.acquire();
  Flow& f = flows_[fid];
  f.remaining = work;
  f.share = share;
  f.join = join;
  f.fin = kNever;
  f.owner_kind = kind;
  f.owner = owner;
  f.slot = slot;
  add(res, fid, now);
}

void Network::add(int rid, int fid, Time now) {
  Link& link = links_[rid];
  Flow& f = flows_[fid];
  // Predictions are exact until a flow joins: flows predicted to be done by now are gone.
  if (link.active.size() + link.pending.size() == 1) {
    const int32_t old = link.active.empty() ? link.pending[0] : link.active[0];
    if (flows_[old].fin <= now) {
      flows_.release(old);
      link.active.clear();
      link.pending.clear();
    }
  }
  if (link.active.empty() && link.pending.empty()) {
    link.t = now;
    link.share_sum = 0;
    link.pending.push_back(fid);
    set_fin(fid, f.join + ceil_div(f.remaining, share_rate(f.share)));
    return;
  }
  advance(link, now);
  auto it = std::upper_bound(link.pending.begin(), link.pending.end(), f.join,
                             [&](Time j, int32_t other) { return j < flows_[other].join; });
  link.pending.insert(it, fid);
  predict(link);
}

// Moves the resource's state to T: the active flows progress at the shared rate, finished
// ones leave and pending ones whose join time has come become active.
void Network::advance(Link& link, Time T) {
  for (;;) {
    const int64_t rate = share_rate(link.share_sum);
    const Time nj = link.pending.empty() ? kNever : flows_[link.pending.front()].join;
    Time nf = kNever;
    for (int32_t a : link.active) nf = std::min(nf, link.t + ceil_div(flows_[a].remaining, rate));
    const Time tn = std::min(nj, nf);
    if (tn > T) {
      if (T > link.t)
        for (int32_t a : link.active) flows_[a].remaining -= rate * (T - link.t);
      link.t = std::max(link.t, T);
      return;
    }
    if (tn > link.t)
      for (int32_t a : link.active) flows_[a].remaining -= rate * (tn - link.t);
    link.t = tn;
    for (size_t i = 0; i < link.active.size();) {
      const int32_t a = link.active[i];
      if (flows_[a].remaining <= 0) {
        link.share_sum -= flows_[a].share;
        flows_.release(a);
        link.active[i] = link.active.back();
        link.active.pop_back();
      } else {
        ++i;
      }
    }
    size_t k = 0;
    while (k < link.pending.size() && flows_[link.pending[k]].join == tn) {
      link.share_sum += flows_[link.pending[k]].share;
      link.active.push_back(link.pending[k]);
      ++k;
    }
    link.pending.erase(link.pending.begin(), link.pending.begin() + k);
  }
}

// Runs the resource forward with the flows it knows, to predict when each will finish.
void Network::predict(Link& link) {
  if (link.active.size() + link.pending.size() == 1) {
    const bool act = !link.active.empty();
    const int32_t fid = act ? link.active[0] : link.pending[0];
    set_fin(fid, (act ? link.t : flows_[fid].join) +
                     ceil_div(flows_[fid].remaining, share_rate(flows_[fid].share)));
    return;
  }
  scratch_.clear();
  for (int32_t a : link.active) scratch_.push_back({a, flows_[a].remaining, flows_[a].share});
  size_t pi = 0;
  Time t = link.t;
  int64_t sum = link.share_sum;
  while (!scratch_.empty() || pi < link.pending.size()) {
    const int64_t rate = share_rate(sum);
    const Time nj = pi < link.pending.size() ? flows_[link.pending[pi]].join : kNever;
    Time nf = kNever;
    for (const Scratch& s : scratch_) nf = std::min(nf, t + ceil_div(s.remaining, rate));
    const Time tn = std::min(nj, nf);
    if (tn > t)
      for (Scratch& s : scratch_) s.remaining -= rate * (tn - t);
    t = tn;
    for (size_t i = 0; i < scratch_.size();) {
      if (scratch_[i].remaining <= 0) {
        set_fin(scratch_[i].id, t);
        sum -= scratch_[i].share;
        scratch_[i] = scratch_.back();
        scratch_.pop_back();
      } else {
        ++i;
      }
    }
    while (pi < link.pending.size() && flows_[link.pending[pi]].join == t) {
      const int32_t id = link.pending[pi++];
      scratch_.push_back({id, flows_[id].remaining, flows_[id].share});
      sum += flows_[id].share;
    }
  }
}

void Network::set_fin(int fid, Time fin) {
  Flow& f = flows_[fid];
  if (f.fin == fin) return;
  f.fin = fin;
  if (f.owner_kind != kOwnForeign) owners_->finish_changed(f.owner_kind, f.owner, f.slot, fin);
}

}  // namespace stratagem::sim
