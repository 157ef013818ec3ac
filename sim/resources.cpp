// The integer fluid model of shared links (see resources.hpp).
#include "sim/resources.hpp"

#include <algorithm>

namespace stratagem::sim {
namespace {

// Proportional share: every flow on a resource whose weights sum past kS slows by the same
// factor, so n flows that each fill the link take n times as long.
inline int64_t share_rate(int64_t sum_w) {
  return sum_w <= kS ? kS : std::max<int64_t>(1, (kS * kS) / sum_w);
}

}  // namespace

void Network::init(int world_size, int gpus_per_node, FlowOwners* owners) {
  owners_ = owners;
  world_ = world_size;
  gpus_per_node_ = gpus_per_node;
  res_.resize(size_t(3) * world_ + (world_ + gpus_per_node_ - 1) / gpus_per_node_);
}

void Network::join(int res, int64_t work, int64_t w, Time join, OwnerKind kind, int32_t owner,
                   int32_t slot, Time now) {
  const int fid = flows_.acquire();
  Flow& f = flows_[fid];
  f.R = work;
  f.w = w;
  f.join = join;
  f.fin = kNever;
  f.owner_kind = kind;
  f.owner = owner;
  f.slot = slot;
  add(res, fid, now);
}

void Network::add(int rid, int fid, Time now) {
  Res& R = res_[rid];
  Flow& f = flows_[fid];
  // Predictions are exact until a flow joins: flows predicted to be done by now are gone.
  if (R.active.size() + R.pending.size() == 1) {
    const int32_t old = R.active.empty() ? R.pending[0] : R.active[0];
    if (flows_[old].fin <= now) {
      flows_.release(old);
      R.active.clear();
      R.pending.clear();
    }
  }
  if (R.active.empty() && R.pending.empty()) {
    R.t = now;
    R.sum_w = 0;
    R.pending.push_back(fid);
    set_fin(fid, f.join + ceil_div(f.R, share_rate(f.w)));
    return;
  }
  advance(R, now);
  auto it = std::upper_bound(R.pending.begin(), R.pending.end(), f.join,
                             [&](Time j, int32_t other) { return j < flows_[other].join; });
  R.pending.insert(it, fid);
  predict(R);
}

// Moves the resource's state to T: the active flows progress at the shared rate, finished
// ones leave and pending ones whose join time has come become active.
void Network::advance(Res& R, Time T) {
  for (;;) {
    const int64_t rate = share_rate(R.sum_w);
    const Time nj = R.pending.empty() ? kNever : flows_[R.pending.front()].join;
    Time nf = kNever;
    for (int32_t a : R.active) nf = std::min(nf, R.t + ceil_div(flows_[a].R, rate));
    const Time tn = std::min(nj, nf);
    if (tn > T) {
      if (T > R.t)
        for (int32_t a : R.active) flows_[a].R -= rate * (T - R.t);
      R.t = std::max(R.t, T);
      return;
    }
    if (tn > R.t)
      for (int32_t a : R.active) flows_[a].R -= rate * (tn - R.t);
    R.t = tn;
    for (size_t i = 0; i < R.active.size();) {
      const int32_t a = R.active[i];
      if (flows_[a].R <= 0) {
        R.sum_w -= flows_[a].w;
        flows_.release(a);
        R.active[i] = R.active.back();
        R.active.pop_back();
      } else {
        ++i;
      }
    }
    size_t k = 0;
    while (k < R.pending.size() && flows_[R.pending[k]].join == tn) {
      R.sum_w += flows_[R.pending[k]].w;
      R.active.push_back(R.pending[k]);
      ++k;
    }
    R.pending.erase(R.pending.begin(), R.pending.begin() + k);
  }
}

// Runs the resource forward with the flows it knows, to predict when each will finish.
void Network::predict(Res& R) {
  if (R.active.size() + R.pending.size() == 1) {
    const bool act = !R.active.empty();
    const int32_t fid = act ? R.active[0] : R.pending[0];
    set_fin(fid,
            (act ? R.t : flows_[fid].join) + ceil_div(flows_[fid].R, share_rate(flows_[fid].w)));
    return;
  }
  scratch_.clear();
  for (int32_t a : R.active) scratch_.push_back({a, flows_[a].R, flows_[a].w});
  size_t pi = 0;
  Time t = R.t;
  int64_t sum = R.sum_w;
  while (!scratch_.empty() || pi < R.pending.size()) {
    const int64_t rate = share_rate(sum);
    const Time nj = pi < R.pending.size() ? flows_[R.pending[pi]].join : kNever;
    Time nf = kNever;
    for (const Scratch& s : scratch_) nf = std::min(nf, t + ceil_div(s.R, rate));
    const Time tn = std::min(nj, nf);
    if (tn > t)
      for (Scratch& s : scratch_) s.R -= rate * (tn - t);
    t = tn;
    for (size_t i = 0; i < scratch_.size();) {
      if (scratch_[i].R <= 0) {
        set_fin(scratch_[i].id, t);
        sum -= scratch_[i].w;
        scratch_[i] = scratch_.back();
        scratch_.pop_back();
      } else {
        ++i;
      }
    }
    while (pi < R.pending.size() && flows_[R.pending[pi]].join == t) {
      const int32_t id = R.pending[pi++];
      scratch_.push_back({id, flows_[id].R, flows_[id].w});
      sum += flows_[id].w;
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
