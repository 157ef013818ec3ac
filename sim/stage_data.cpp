// Building the simulator's view of the workload (see stage_data.hpp).
#include "sim/stage_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "stratagem/error.hpp"

namespace stratagem::sim {

void refuse_beyond_clock(const std::string& what, double t_s) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s passes the simulator's range, 2^61 ns (%.3g s), at %.4g s; simulate "
                "fewer micro-batches (--global-batch) or a faster cluster",
                what.c_str(), double(kMaxClockNs) * 1e-9, t_s);
  throw InputError(buf);
}

GroupKey GroupKey::of(const Op& op) {
  GroupKey k;
  k.kind = op.group;
  switch (op.group) {
    case GroupKind::tp:
    case GroupKind::dp:
    case GroupKind::cp:
      k.tp = op.strategy.tp;
      break;
    case GroupKind::reshard:
      k.reshard_from_tp = op.reshard_from_tp, k.reshard_to_tp = op.reshard_to_tp;
      break;
    case GroupKind::ep:
    case GroupKind::expert_dp:
    case GroupKind::expert_tp:
      k.etp = op.strategy.etp, k.ep = op.strategy.ep;
      break;
    default:
      break;
  }
  return k;
}

Op GroupKey::collective() const {
  Op op;
  op.kind = OpKind::collective;
  op.group = kind;
  op.strategy.tp = tp, op.strategy.etp = etp, op.strategy.ep = ep;
  op.reshard_from_tp = reshard_from_tp, op.reshard_to_tp = reshard_to_tp;
  return op;
}

namespace {

Time to_ns(double s, const char* what, const Op& op) {
  if (!std::isfinite(s) || s < 0)
    throw std::runtime_error(std::string("simulate: the cost of op '") + op_name(op) + "' (" +
                             what + ") is not a finite non-negative time");
  // Checked before the conversion: llround of a number beyond int64 is undefined, and a
  // duration past kMaxOpNs would wrap once scaled to progress units (a 1e16-FLOP kernel took
  // 0 s).
  if (s * 1e9 > double(kMaxOpNs)) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "op '%s' (%s) takes %.3g s, beyond the simulator's range of one op, "
                  "2^47 ns (%.0f s); simulate a smaller micro-batch or a faster cluster",
                  op_name(op).c_str(), what, s, double(kMaxOpNs) * 1e-9);
    throw InputError(buf);
  }
  return static_cast<Time>(std::llround(s * 1e9));
}

// Fields of an op that its cost depends on (not the micro-batch, buffer or dependencies): a
// Program repeats the same few ops many times, so costs are memoized on these.
struct OpKey {
  OpKind kind;
  Stream stream;
  Block block;
  Phase phase;
  Collective collective;
  GroupKind group;
  int32_t tp, ep;  // with the layer, the degrees of its group
  int16_t chunk;
  int32_t layer, samples;
  int64_t bytes;
  double flops;
  bool operator==(const OpKey& o) const {
    return kind == o.kind && stream == o.stream && block == o.block && phase == o.phase &&
           collective == o.collective && group == o.group && tp == o.tp && ep == o.ep &&
           chunk == o.chunk && layer == o.layer && samples == o.samples && bytes == o.bytes &&
           flops == o.flops;
  }
};
struct OpKeyHash {
  size_t operator()(const OpKey& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(uint64_t(k.kind) | uint64_t(k.stream) << 8 | uint64_t(k.block) << 16 |
        uint64_t(k.phase) << 24 | uint64_t(k.collective) << 32 | uint64_t(k.group) << 40 |
        uint64_t(k.tp & 0xff) << 48 | uint64_t(k.ep & 0xff) << 56);
    if (k.tp > 0xff || k.ep > 0xff) mix(uint64_t(uint32_t(k.tp)) << 32 | uint32_t(k.ep));
    mix(uint64_t(uint16_t(k.chunk)) | uint64_t(uint32_t(k.layer)) << 16);
    mix(uint64_t(uint32_t(k.samples)));
    mix(uint64_t(k.bytes));
    uint64_t f;
    std::memcpy(&f, &k.flops, sizeof f);
    mix(f);
    return size_t(h);
  }
};
// An open-addressing map from OpKey (a pp 16 Program looks up millions of ops, nearly all of
// them repeats): one probe sequence over a flat slot array, no node per entry.
template <class V>
class OpKeyMap {
 public:
  // The value of `k`, inserting make() when absent.
  template <class Make>
  V& get(const OpKey& k, Make make) {
    if (2 * (entries_.size() + 1) > slots_.size()) grow();
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      const int32_t e = slots_[i];
      if (e < 0) {
        slots_[i] = int32_t(entries_.size());
        entries_.push_back({k, make()});
        return entries_.back().second;
      }
      if (entries_[e].first == k) return entries_[e].second;
    }
  }

 private:
  static size_t hash(const OpKey& k) {
    const uint64_t h = OpKeyHash{}(k);
    return size_t(h ^ (h >> 29));
  }
  void grow() {
    slots_.assign(std::max<size_t>(64, 2 * slots_.size()), -1);
    const size_t mask = slots_.size() - 1;
    for (size_t e = 0; e < entries_.size(); ++e) {
      size_t i = hash(entries_[e].first) & mask;
      while (slots_[i] >= 0) i = (i + 1) & mask;
      slots_[i] = int32_t(e);
    }
  }
  std::vector<int32_t> slots_;  // entry index, -1 when empty; size a power of two
  std::vector<std::pair<OpKey, V>> entries_;
};

OpKey key_of(const Op& op) {
  return {op.kind,        op.stream, op.block, op.phase,   op.collective, op.group, op.strategy.tp,
          op.strategy.ep, op.chunk,  op.layer, op.samples, op.bytes,      op.flops};
}

Cat category_of(const Op& op) {
  if (op.group == GroupKind::cp) return kCp;
  switch (op.kind) {
    case OpKind::collective:
      if (op.stream == Stream::ep_comm) return kEp;
      return op.group == GroupKind::dp || op.group == GroupKind::tied_embedding ||
                     op.group == GroupKind::expert_dp
                 ? kDp
                 : kTp;
    case OpKind::send:
      return kPp;
    case OpKind::recv:
      return kRecv;
    case OpKind::copy_d2h:
    case OpKind::copy_h2d:
    case OpKind::host_compute:
      return kOffload;
    default:
      return kNone;
  }
}

// Splits a CommCost for the fluid model; the parts sum to the cost model's time, so a transfer
// alone takes exactly that long.
CommSplit split_comm_cost(const CommCost& cc, const Op& op, const ClusterSpec& C) {
  CommSplit p;
  const Time lat = to_ns(cc.latency_s, "latency", op);
  const Time total = to_ns(cc.time_s(), "time", op);
  p.work = std::max<Time>(0, total - lat);
  p.tail = lat / 3;
  p.head = lat - p.tail;
  p.link = p.work > 0 ? cc.link : LinkClass::none;
  double cap = 0;
  switch (p.link) {
    case LinkClass::intra_node:
      cap = C.node.intra.bandwidth_gbps * C.node.intra.bus_efficiency;
      break;
    case LinkClass::inter_node:
      cap = C.node.nic_count * C.node.nic.bandwidth_gbps * C.node.nic.bus_efficiency /
            std::max(1.0, C.network.oversubscription);
      break;
    case LinkClass::pcie:
      cap = C.node.pcie.bandwidth_gbps;
      break;
    default:
      break;
  }
  p.share = kS;
  if (cap > 0 && cc.bandwidth_gbps > 0)
    p.share = std::clamp<int64_t>(std::llround(double(kS) * cc.bandwidth_gbps / cap), 1, kS);
  return p;
}

// Indexes one stage's ops into its streams' Steps, in program order.
class StageIndexer {
 public:
  StageIndexer(StageData& sd, const StageProgram& sp, int stage, const OpCosts& costs,
               OpKeyMap<Time>& compute_ns_memo)
      : sd_(sd), sp_(sp), stage_(stage), costs_(costs), compute_ns_memo_(compute_ns_memo) {
    sd.program = &sp;
    sd.op_count = uint32_t(sp.ops.size());
    sd.position_of.resize(sd.op_count);
    sd.stream_of.resize(sd.op_count);
    sd.issue_ns.resize(sd.op_count);
    // Each stream's length first: its steps are then written in place (growing the vectors
    // copied every step about once more, a fifth of the indexing time at pp 16).
    std::array<uint32_t, kStreams> count{};
    for (const Op& op : sp.ops)
      if (size_t(op.stream) < size_t(kStreams)) ++count[size_t(op.stream)];
    for (int st = 0; st < kStreams; ++st) sd.steps[st].reserve(count[st]);
    sd.dep_at.reserve(sp.deps.size());
    last_on_.fill(-1);
  }

  void add(uint32_t i) {
    const Op& op = sp_.ops[i];
    const int st = int(op.stream);
    if (st < 0 || st >= kStreams) throw std::runtime_error("simulate: op with an invalid stream");
    for (uint32_t k = 0; k < op.dep_count; ++k)
      if (sp_.deps_of(op)[k] >= i)
        throw std::runtime_error("simulate: stage " + std::to_string(stage_) + " op " +
                                 std::to_string(i) + " depends on a later op");
    sd_.stream_of[i] = uint8_t(st);
    sd_.position_of[i] = uint32_t(sd_.steps[st].size());
    Step step;
    step.op = i;
    step.dep_begin = uint32_t(sd_.dep_at.size());
    if (op.dep_count > 0xffff) throw std::runtime_error("simulate: an op with too many deps");
    step.dep_count = uint16_t(op.dep_count);
    step.kind = op.kind;
    step.busy_cat = uint8_t(op.phase == Phase::recompute   ? kRecompute
                            : op.phase == Phase::optimizer ? kOptimizer
                                                           : kCompute);
    for (uint32_t k = 0; k < op.dep_count; ++k) {
      const uint32_t d = sp_.deps_of(op)[k];
      if (sd_.position_of[d] >= (1u << (32 - kStreamBits)))
        throw std::runtime_error("simulate: a stream is too long");
      sd_.dep_at.push_back(sd_.position_of[d] << kStreamBits | sd_.stream_of[d]);
    }
    step.cat = category_of(op);
    set_kind_fields(step, op, i);
    // The host issues the ops in program order; an op can run once the host has issued it.
    if (op.kind == OpKind::compute) {
      const Time host = to_ns(costs_.host_issue_time_s(op), "host issue", op);
      host_ns_ += host;  // <= kMaxClockNs + kMaxOpNs: no overflow before the check
      if (host_ns_ > kMaxClockNs)
        refuse_beyond_clock("the host's issue time", double(host_ns_) * 1e-9);
      if (host > 0) sd_.host_issue = true;
    }
    sd_.issue_ns[i] = host_ns_;
    last_on_[st] = i;
    sd_.steps[st].push_back(step);
  }

 private:
  // What the step of each kind of op carries: a collective's group key and ordinal, a
  // transfer's channel, a costed comm op's index, a kernel's duration, a buffer.
  void set_kind_fields(Step& step, const Op& op, uint32_t i) {
    switch (op.kind) {
      case OpKind::collective: {
        const GroupKey k = GroupKey::of(op);
        size_t j = 0;
        while (j < sd_.group_keys.size() && !(sd_.group_keys[j] == k)) ++j;
        if (j == sd_.group_keys.size()) {
          sd_.group_keys.push_back(k);
          sd_.ops_per_group_key.push_back(0);
        }
        step.key = uint8_t(j);
        step.ordinal = sd_.ops_per_group_key[j]++;
        step.comm_index = comm_index_of(i);
        break;
      }
      case OpKind::send:
      case OpKind::copy_d2h:
      case OpKind::copy_h2d:
        step.key = op.group == GroupKind::cp ? 2 : op.group == GroupKind::pp_prev ? 1 : 0;
        step.comm_index = comm_index_of(i);
        break;
      case OpKind::recv:
        step.key = op.group == GroupKind::cp ? 3 : op.group == GroupKind::pp_prev ? 1 : 0;
        break;
      case OpKind::compute:
      case OpKind::host_compute:
        step.compute_ns = compute_ns_memo_.get(
            key_of(op), [&] { return to_ns(costs_.compute_time_s(op), "compute", op); });
        break;
      case OpKind::alloc:
      case OpKind::free:
        step.mem_category = op.category;
        step.mem_bytes = op.bytes;
        // A free that the Program orders after an alloc on another stream (one since this
        // stream's previous op): the engine keeps their order when both are ready at once.
        step.key = op.kind == OpKind::free && last_alloc_ > last_on_[size_t(op.stream)] ? 1 : 0;
        if (op.kind == OpKind::alloc) last_alloc_ = i;
        break;
    }
  }

  // Costed comm ops are indexed by their distinct cost key: a Program repeats a few of them.
  int32_t comm_index_of(uint32_t i) {
    return comm_index_.get(key_of(sp_.ops[i]), [&] {
      sd_.comm_op_index.push_back(i);
      sd_.comm_ops.push_back(sp_.ops[i]);
      return int32_t(sd_.comm_op_index.size() - 1);
    });
  }

  StageData& sd_;
  const StageProgram& sp_;
  const int stage_;
  const OpCosts& costs_;
  OpKeyMap<Time>& compute_ns_memo_;  // shared by all stages
  OpKeyMap<int32_t> comm_index_;
  int64_t last_alloc_ = -1;                  // the latest alloc so far (-1: none)
  Time host_ns_ = 0;                         // host issue time of the ops so far
  std::array<int64_t, kStreams> last_on_{};  // each stream's latest op (-1: none)
};

// Anchors: the latest position on every stream that each op transitively waits for.
void find_anchors(StageData& sd) {
  const StageProgram& sp = *sd.program;
  sd.anchors.resize(sd.op_count);
  for (uint32_t i = 0; i < sd.op_count; ++i) {
    std::array<int32_t, kStreams> a;
    a.fill(-1);
    auto merge = [&](uint32_t d) {
      for (int st = 0; st < kStreams; ++st) a[st] = std::max(a[st], sd.anchors[d][st]);
      a[sd.stream_of[d]] = std::max(a[sd.stream_of[d]], int32_t(sd.position_of[d]));
    };
    if (sd.position_of[i] > 0) merge(sd.steps[sd.stream_of[i]][sd.position_of[i] - 1].op);
    const Op& op = sp.ops[i];
    for (uint32_t k = 0; k < op.dep_count; ++k) merge(sp.deps_of(op)[k]);
    sd.anchors[i] = a;
  }
}

}  // namespace

std::vector<StageData> build_stages(const Program& prog, const OpCosts& costs, bool lookahead,
                                    Program* release) {
  const int pp = int(prog.stages.size());
  std::vector<StageData> stages(pp);
  OpKeyMap<Time> compute_ns_memo;
  for (int s = 0; s < pp; ++s) {
    StageData& sd = stages[s];
    StageIndexer indexer(sd, prog.stages[s], s, costs, compute_ns_memo);
    for (uint32_t i = 0; i < sd.op_count; ++i) indexer.add(i);
    if (!sd.host_issue) std::vector<Time>().swap(sd.issue_ns);
    // Group keys are stored in a byte per op.
    if (sd.group_keys.size() > 250)
      throw std::runtime_error("simulate: too many distinct groups in a stage");
    for (int st = 0; st < kStreams; ++st) sd.stream_length[st] = uint32_t(sd.steps[st].size());
    sd.workspace_bytes = costs.workspace_bytes(s);
    sd.process = costs.process_memory(s);
    if (lookahead) {
      find_anchors(sd);
    } else if (release) {
      std::vector<Op>().swap(release->stages[s].ops);
      std::vector<uint32_t>().swap(release->stages[s].deps);
    }
  }
  return stages;
}

void cost_rank_classes(StageData& sd, const Layout& layout, const ClusterSpec& cluster,
                       const OpCosts& costs, bool lookahead) {
  const StageProgram& sp = *sd.program;
  const size_t ncls = sd.class_rep.size();
  sd.comm_costs.resize(ncls);
  if (lookahead) {
    sd.least_duration_ns.resize(ncls);
    sd.least_duration_prefix_ns.resize(ncls);
  }
  for (size_t cls = 0; cls < ncls; ++cls) {
    const int rep = sd.class_rep[cls];
    auto& cv = sd.comm_costs[cls];
    cv.resize(sd.comm_op_index.size());
    for (size_t k = 0; k < sd.comm_op_index.size(); ++k) {
      const Op& op = sd.comm_ops[k];
      cv[k] = split_comm_cost(costs.comm_cost(op, layout, rep), op, cluster);
    }
    if (!lookahead) continue;
    auto& md = sd.least_duration_ns[cls];
    md.assign(sd.op_count, 0);
    for (uint32_t i = 0; i < sd.op_count; ++i) {
      const Op& op = sp.ops[i];
      const Step& step = step_of(sd, i);
      if (step.comm_index >= 0)
        md[i] = cv[step.comm_index].total();
      else if (op.kind == OpKind::compute || op.kind == OpKind::host_compute)
        md[i] = step.compute_ns;
    }
    for (int st = 0; st < kStreams; ++st) {
      auto& pf = sd.least_duration_prefix_ns[cls][st];
      pf.assign(sd.stream_length[st] + 1, 0);
      for (uint32_t k = 0; k < sd.stream_length[st]; ++k)
        pf[k + 1] = pf[k] + md[sd.steps[st][k].op];
    }
  }
}

}  // namespace stratagem::sim
