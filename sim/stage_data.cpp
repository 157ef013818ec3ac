// Building the simulator's view of the workload (see stage_data.hpp).
#include "sim/stage_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace stratagem::sim {
namespace {

Time to_ns(double s, const char* what, const Op& op) {
  if (!std::isfinite(s) || s < 0)
    throw std::runtime_error(std::string("simulate: the cost of op '") + op_name(op) + "' (" +
                             what + ") is not a finite non-negative time");
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
  uint8_t tp, tp_big;
  int16_t chunk;
  int32_t layer, samples;
  int64_t bytes;
  double flops;
  bool operator==(const OpKey& o) const {
    return kind == o.kind && stream == o.stream && block == o.block && phase == o.phase &&
           collective == o.collective && group == o.group && tp == o.tp && tp_big == o.tp_big &&
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
        uint64_t(k.tp) << 48 | uint64_t(k.tp_big) << 56);
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
  return {op.kind,   op.stream, op.block, op.phase,   op.collective, op.group, op.tp,
          op.tp_big, op.chunk,  op.layer, op.samples, op.bytes,      op.flops};
}

Cat category_of(const Op& op) {
  switch (op.kind) {
    case OpKind::collective:
      return op.group == GroupKind::dp || op.group == GroupKind::tied_embedding ? kDp : kTp;
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
CommP split_comm_cost(const CommCost& cc, const Op& op, const ClusterSpec& C) {
  CommP p;
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
  p.w = kS;
  if (cap > 0 && cc.bandwidth_gbps > 0)
    p.w = std::clamp<int64_t>(std::llround(double(kS) * cc.bandwidth_gbps / cap), 1, kS);
  return p;
}

}  // namespace

std::vector<StageData> build_stages(const Program& prog, const OpCosts& costs, bool lookahead,
                                    Program* release) {
  const int pp = int(prog.stages.size());
  std::vector<StageData> stages(pp);
  OpKeyMap<Time> cmemo;
  for (int s = 0; s < pp; ++s) {
    StageData& sd = stages[s];
    const StageProgram& sp = prog.stages[s];
    // Costed comm ops are indexed by their distinct cost key: a Program repeats a few of them.
    OpKeyMap<int32_t> comm_index;
    auto comm_key = [&](uint32_t i) {
      return comm_index.get(key_of(sp.ops[i]), [&] {
        sd.comm_op.push_back(i);
        sd.comm_ops.push_back(sp.ops[i]);
        return int32_t(sd.comm_op.size() - 1);
      });
    };
    sd.sp = &sp;
    sd.n = uint32_t(sp.ops.size());
    sd.pos.resize(sd.n);
    sd.str.resize(sd.n);
    // Each stream's length first: its steps are then written in place (growing the vectors
    // copied every step about once more, a fifth of this function's time at pp 16).
    {
      std::array<uint32_t, kStreams> count{};
      for (const Op& op : sp.ops)
        if (size_t(op.stream) < size_t(kStreams)) ++count[size_t(op.stream)];
      for (int st = 0; st < kStreams; ++st) sd.steps[st].reserve(count[st]);
      sd.dep_at.reserve(sp.deps.size());
    }
    // The latest alloc so far, and each stream's latest op (-1: none).
    int64_t last_alloc = -1;
    int64_t last_on[kStreams];
    std::fill(last_on, last_on + kStreams, -1);
    for (uint32_t i = 0; i < sd.n; ++i) {
      const Op& op = sp.ops[i];
      const int st = int(op.stream);
      if (st < 0 || st >= kStreams) throw std::runtime_error("simulate: op with an invalid stream");
      for (uint32_t k = 0; k < op.dep_count; ++k)
        if (sp.deps_of(op)[k] >= i)
          throw std::runtime_error("simulate: stage " + std::to_string(s) + " op " +
                                   std::to_string(i) + " depends on a later op");
      sd.str[i] = uint8_t(st);
      sd.pos[i] = uint32_t(sd.steps[st].size());
      Step step;
      step.op = i;
      step.dep_begin = uint32_t(sd.dep_at.size());
      if (op.dep_count > 0xffff) throw std::runtime_error("simulate: an op with too many deps");
      step.dep_count = uint16_t(op.dep_count);
      step.kind = op.kind;
      step.busy = uint8_t(op.phase == Phase::recompute   ? kRecompute
                          : op.phase == Phase::optimizer ? kOptimizer
                                                         : kCompute);
      for (uint32_t k = 0; k < op.dep_count; ++k) {
        const uint32_t d = sp.deps_of(op)[k];
        if (sd.pos[d] >= (1u << 29)) throw std::runtime_error("simulate: a stream is too long");
        sd.dep_at.push_back(sd.pos[d] << 3 | sd.str[d]);
      }
      step.cat = category_of(op);
      switch (op.kind) {
        case OpKind::collective: {
          GroupKey k{op.group, op.tp, op.tp_big};
          size_t j = 0;
          while (j < sd.keys.size() && !(sd.keys[j] == k)) ++j;
          if (j == sd.keys.size()) {
            sd.keys.push_back(k);
            sd.key_count.push_back(0);
          }
          step.key = uint8_t(j);
          step.ord = sd.key_count[j]++;
          step.ci = comm_key(i);
          break;
        }
        case OpKind::send:
        case OpKind::copy_d2h:
        case OpKind::copy_h2d:
          step.key = op.group == GroupKind::pp_prev ? 1 : 0;
          step.ci = comm_key(i);
          break;
        case OpKind::recv:
          step.key = op.group == GroupKind::pp_prev ? 1 : 0;
          break;
        case OpKind::compute:
        case OpKind::host_compute: {
          step.cdur =
              cmemo.get(key_of(op), [&] { return to_ns(costs.compute_time_s(op), "compute", op); });
          break;
        }
        case OpKind::alloc:
        case OpKind::free:
          step.mem_category = op.category;
          step.mem_bytes = op.bytes;
          // A free that the Program orders after an alloc on another stream (one since this
          // stream's previous op): the engine keeps their order when both are ready at once.
          step.key = op.kind == OpKind::free && last_alloc > last_on[st] ? 1 : 0;
          if (op.kind == OpKind::alloc) last_alloc = i;
          break;
      }
      last_on[st] = i;
      sd.steps[st].push_back(step);
    }
    // Group keys are stored in a byte per op.
    if (sd.keys.size() > 250)
      throw std::runtime_error("simulate: too many distinct groups in a stage");
    for (int st = 0; st < kStreams; ++st) sd.len[st] = uint32_t(sd.steps[st].size());
    sd.workspace = costs.workspace_bytes(s);
    if (release && !lookahead) {
      std::vector<Op>().swap(release->stages[s].ops);
      std::vector<uint32_t>().swap(release->stages[s].deps);
    }
    if (!lookahead) continue;
    // Anchors: the latest position on every stream that each op transitively waits for.
    sd.anc.resize(sd.n);
    for (uint32_t i = 0; i < sd.n; ++i) {
      std::array<int32_t, kStreams> a;
      a.fill(-1);
      auto merge = [&](uint32_t d) {
        for (int st = 0; st < kStreams; ++st) a[st] = std::max(a[st], sd.anc[d][st]);
        a[sd.str[d]] = std::max(a[sd.str[d]], int32_t(sd.pos[d]));
      };
      if (sd.pos[i] > 0) merge(sd.steps[sd.str[i]][sd.pos[i] - 1].op);
      const Op& op = sp.ops[i];
      for (uint32_t k = 0; k < op.dep_count; ++k) merge(sp.deps_of(op)[k]);
      sd.anc[i] = a;
    }
  }
  return stages;
}

void cost_rank_classes(StageData& sd, const Layout& layout, const ClusterSpec& cluster,
                       const OpCosts& costs, bool lookahead) {
  const StageProgram& sp = *sd.sp;
  const size_t ncls = sd.rep.size();
  sd.comm.resize(ncls);
  if (lookahead) {
    sd.mind.resize(ncls);
    sd.prefix.resize(ncls);
  }
  for (size_t cls = 0; cls < ncls; ++cls) {
    const int rep = sd.rep[cls];
    auto& cv = sd.comm[cls];
    cv.resize(sd.comm_op.size());
    for (size_t k = 0; k < sd.comm_op.size(); ++k) {
      const Op& op = sd.comm_ops[k];
      cv[k] = split_comm_cost(costs.comm_cost(op, layout, rep), op, cluster);
    }
    if (!lookahead) continue;
    auto& md = sd.mind[cls];
    md.assign(sd.n, 0);
    for (uint32_t i = 0; i < sd.n; ++i) {
      const Op& op = sp.ops[i];
      const Step& step = step_of(sd, i);
      if (step.ci >= 0)
        md[i] = cv[step.ci].total();
      else if (op.kind == OpKind::compute || op.kind == OpKind::host_compute)
        md[i] = step.cdur;
    }
    for (int st = 0; st < kStreams; ++st) {
      auto& pf = sd.prefix[cls][st];
      pf.assign(sd.len[st] + 1, 0);
      for (uint32_t k = 0; k < sd.len[st]; ++k) pf[k + 1] = pf[k] + md[sd.steps[st][k].op];
    }
  }
}

}  // namespace stratagem::sim
