// The discrete-event simulator (see sim/README.md for the model and the PDES scheme).
//
// Time is integer nanoseconds. Every rank of a stage shares its StageProgram; what the
// simulator keeps per rank is a cursor per stream, the running compute op, the interference
// windows of its comm streams, its memory counters and its two pipeline channels. Per-op costs
// are computed once per (stage, rank class, op) while setting up. The event queue is a binary
// heap of plain structs ordered by (time, sequence). Same-time completions of a rank are all
// applied before that rank's streams advance (in stream order), so the outcome does not depend
// on the order in which same-time events are popped, nor on how ranks are spread over
// processes. Bandwidth sharing is an integer fluid model (no floating point in the event
// loop), so every process computes bit-identical times.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "sim/tunables.hpp"
#include "stratagem/error.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem {
namespace {

using Time = int64_t;
constexpr Time kNever = std::numeric_limits<Time>::max();
constexpr Time kMinTime = std::numeric_limits<Time>::min();
constexpr int64_t kS = sim::kRateScale;  // progress units per ns at full speed
constexpr int kStreams = kNumStreams;

inline int64_t ceil_div(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }
// Proportional share: every flow on a resource whose weights sum past kS slows by the same
// factor, so n flows that each fill the link take n times as long.
inline int64_t share_rate(int64_t sum_w) {
  return sum_w <= kS ? kS : std::max<int64_t>(1, (kS * kS) / sum_w);
}

Time to_ns(double s, const char* what, const Op& op) {
  if (!std::isfinite(s) || s < 0)
    throw std::runtime_error(std::string("simulate: the cost of op '") + op_name(op) + "' (" + what +
                             ") is not a finite non-negative time");
  return static_cast<Time>(std::llround(s * 1e9));
}

// Breakdown categories of compute-stream time.
enum Cat : uint8_t { kCompute, kRecompute, kOptimizer, kTp, kDp, kPp, kBubble, kOffload, kNone, kRecv };

// Cost of a communication op on one rank, split for the fluid model: `head` latency before the
// bytes move, `work` ns of data movement at full speed on the link, `tail` latency after.
struct CommP {
  Time head = 0, tail = 0, work = 0;
  int64_t w = kS;  // share of the resource a full-speed flow takes, in kS units
  LinkClass link = LinkClass::none;
  Time total() const { return head + work + tail; }
};

struct GroupKey {
  GroupKind kind;
  uint8_t tp, tp_big;
  bool operator==(const GroupKey& o) const { return kind == o.kind && tp == o.tp && tp_big == o.tp_big; }
};

struct StageData {
  const StageProgram* sp = nullptr;
  uint32_t n = 0;
  std::array<uint32_t, kStreams> len{};
  std::array<std::vector<uint32_t>, kStreams> ops_of;  // op indices of each stream, in order
  std::vector<uint32_t> pos;   // position of op in its stream
  std::vector<uint8_t> str;    // stream of op
  std::vector<uint8_t> key;    // collective: group key; send/recv: 0 = pp_next, 1 = pp_prev
  std::vector<uint32_t> ord;   // collective: ordinal among the stage's ops of its key
  std::vector<uint8_t> cat;    // Cat of the op (for the breakdown)
  std::vector<GroupKey> keys;
  std::vector<uint32_t> key_count;
  std::vector<Time> cdur;      // compute / host_compute duration
  std::vector<int32_t> ci;     // index into comm[class] (-1: not a costed comm op)
  std::vector<std::vector<CommP>> comm;          // [class][ci]
  std::vector<std::vector<Time>> mind;           // [class][op] lower bound of the duration
  std::vector<std::array<std::vector<Time>, kStreams>> prefix;  // [class][stream][k]: sum of the first k
  std::vector<std::array<int32_t, kStreams>> anc;  // latest position on each stream op depends on
  std::vector<int> rep;        // representative rank of each class
  int64_t workspace = 0;
};

struct Arrival {
  uint64_t seq;
  Time a;
  Time xfer;  // arrival - send start
};

struct Channel {
  int peer = -1;
  uint64_t sent = 0, recvd = 0;
  bool waiting = false;
  uint8_t wait_stream = 0;
  uint64_t wait_seq = 0;
  std::vector<Arrival> fifo;
  size_t head = 0;
};

struct RankSt {
  int rank = 0, stage = 0, cls = 0, node = 0, li = -1;
  std::array<uint32_t, kStreams> it{}, pos{};
  std::array<uint8_t, kStreams> running{};
  std::array<Time, kStreams> start{};
  std::array<Time, kStreams> act_b{};  // data movement of the stream's comm op began (kNever: none)
  std::array<Time, kStreams> wake{};   // last completion on the stream
  std::array<uint8_t, kStreams> wake_cat{};
  std::array<Time, kStreams> wake_dur{};  // how long that op moved data (not waiting for peers)
  bool dirty = false;
  bool done = false;
  // The compute stream's running kernel: remaining work in kS units at cref.
  bool crun = false;
  int64_t cR = 0;
  Time cref = 0, cend = 0;
  uint32_t cver = 0;
  // Memory.
  std::array<int64_t, kNumMemCategories> mem{};
  int64_t alloc = 0;
  bool oom = false;
  Channel ch[2];
  uint8_t chmap[2] = {0, 1};
  int gbase = 0;
  Time last_compute_end = 0;
  std::array<int64_t, 8> acc{};
  Time end = 0;
  uint64_t ops = 0;
  SimRankResult res;
};

struct Member {
  int32_t rank;
  uint8_t stream;
  uint32_t op;
  Time head, tail, work;
  int64_t w;
  LinkClass link;
  Time fin;
};

struct Coll {
  int32_t group = -1;
  uint64_t ordinal = 0;
  uint64_t serial = 0;
  int size = 0, arrived = 0;
  Time max_arr = kMinTime, start = 0, evt = kNever, value = kMinTime;
  int finish_pending = 0;
  bool cross = false, started = false, local_done = false, odirty = false, live = false;
  uint32_t ver = 0;
  std::vector<Member> members;  // local members
};

enum XKind : uint8_t { kXSend, kXCopy };
struct Xfer {
  XKind kind = kXSend;
  bool remote = false, odirty = false, live = false, sent = false;
  int32_t rank = 0, dst = -1, dst_ch = 0;
  uint8_t stream = 0;
  uint64_t seq = 0, serial = 0;
  Time start = 0, head = 0, tail = 0, work = 0, fin = kNever, evt = kNever;
  uint32_t ver = 0;
};

enum OwnerKind : uint8_t { kOwnColl, kOwnXfer, kOwnForeign };
struct Flow {
  int64_t R = 0, w = 0;
  Time join = 0, fin = kNever;
  OwnerKind owner_kind = kOwnForeign;
  int32_t owner = -1, slot = 0;
};

struct Res {
  Time t = 0;
  int64_t sum_w = 0;
  std::vector<int32_t> active, pending;  // pending sorted by join
};

enum EvType : uint8_t { kEvCompute, kEvOpEnd, kEvColl, kEvCollDone, kEvXfer, kEvXferDone, kEvDeliver };
struct Ev {
  Time t;
  uint64_t st;  // sequence number << 8 | EvType: ties in time go in push order
  uint32_t id, ver;
  EvType type() const { return EvType(st & 0xff); }
};

// A 4-ary min-heap of events ordered by (time, sequence): half the depth of a binary heap.
class EventQueue {
 public:
  bool empty() const { return v_.empty(); }
  const Ev& top() const { return v_[0]; }
  void push(const Ev& e) {
    size_t i = v_.size();
    v_.push_back(e);
    while (i > 0) {
      const size_t p = (i - 1) / 4;
      if (!less(e, v_[p])) break;
      v_[i] = v_[p];
      i = p;
    }
    v_[i] = e;
  }
  void pop() {
    const Ev e = v_.back();
    v_.pop_back();
    const size_t n = v_.size();
    if (n == 0) return;
    size_t i = 0;
    for (;;) {
      const size_t c = 4 * i + 1;
      if (c >= n) break;
      size_t best = c;
      const size_t end = std::min(c + 4, n);
      for (size_t k = c + 1; k < end; ++k)
        if (less(v_[k], v_[best])) best = k;
      if (!less(v_[best], e)) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = e;
  }

 private:
  static bool less(const Ev& a, const Ev& b) { return a.t < b.t || (a.t == b.t && a.st < b.st); }
  std::vector<Ev> v_;
};

enum MsgType : uint8_t { kMsgArrive, kMsgFinish, kMsgJoin, kMsgDeliver };
struct Msg {
  MsgType type;
  int32_t i0, i1;
  uint64_t u;
  Time t0, t1, effect;
  int64_t x, y;
};

struct Delivery {
  int32_t dst, ch;
  uint64_t seq;
  Time a, xfer;
};

struct Bnd {
  uint32_t pos, op;
  Time delay;
};

// Fields of an op that its cost depends on (not the micro-batch, buffer or dependencies).
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
    mix(uint64_t(k.kind) | uint64_t(k.stream) << 8 | uint64_t(k.block) << 16 | uint64_t(k.phase) << 24 |
        uint64_t(k.collective) << 32 | uint64_t(k.group) << 40 | uint64_t(k.tp) << 48 |
        uint64_t(k.tp_big) << 56);
    mix(uint64_t(uint16_t(k.chunk)) | uint64_t(uint32_t(k.layer)) << 16);
    mix(uint64_t(uint32_t(k.samples)));
    mix(uint64_t(k.bytes));
    uint64_t f;
    std::memcpy(&f, &k.flops, sizeof f);
    mix(f);
    return size_t(h);
  }
};
OpKey key_of(const Op& op) {
  return {op.kind, op.stream, op.block, op.phase, op.collective, op.group, op.tp, op.tp_big,
          op.chunk, op.layer, op.samples, op.bytes, op.flops};
}

Cat category_of(const Op& op) {
  switch (op.kind) {
    case OpKind::collective:
      return op.group == GroupKind::dp || op.group == GroupKind::tied_embedding ? kDp : kTp;
    case OpKind::send: return kPp;
    case OpKind::recv: return kRecv;
    case OpKind::copy_d2h:
    case OpKind::copy_h2d:
    case OpKind::host_compute: return kOffload;
    default: return kNone;
  }
}

// Waits for a non-blocking collective, yielding the core between polls: when processes share
// cores (mpirun --oversubscribe, or a loaded machine), a spinning waiter would otherwise take
// the time slice of the process it waits for.
void wait_yielding(MPI_Request* req) {
  int done = 0;
  for (int spin = 0;; ++spin) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (spin > 64) sched_yield();
  }
}

class Sim {
 public:
  Sim(const Program& prog, const Layout& layout, const ClusterSpec& cluster, const OpCosts& costs,
      const SimOptions& opt)
      : prog_(prog), L_(layout), C_(cluster), costs_(costs), opt_(opt) {}

  SimResult run();

 private:
  // ---- setup ----
  void setup();
  void setup_stages();
  void setup_ranks();
  void setup_partition(bool single);
  void setup_boundaries(bool* unsafe);
  int res_of(LinkClass link, int rank, OpKind kind) const {
    switch (link) {
      case LinkClass::intra_node: return 3 * rank;
      case LinkClass::inter_node: return 3 * W_ + ranks_[rank].node;
      case LinkClass::pcie: return 3 * rank + (kind == OpKind::copy_h2d ? 1 : 2);
      default: return -1;
    }
  }
  const CommP& comm(const StageData& sd, int cls, uint32_t op) const { return sd.comm[cls][sd.ci[op]]; }

  // ---- event loop ----
  void push(Time t, EvType type, uint32_t id, uint32_t ver) {
    heap_.push({t, (seq_++ << 8) | uint64_t(type), id, ver});
  }
  void run_until(Time H);
  void handle(const Ev& e);
  void flush_dirty(Time t);
  void mark_dirty(RankSt& r) {
    if (!r.dirty) {
      r.dirty = true;
      dirty_.push_back(r.rank);
    }
  }
  void advance(RankSt& r, Time t);
  bool ready(const RankSt& r, const StageData& sd, int s, uint32_t op) const;
  bool start_op(RankSt& r, const StageData& sd, int s, uint32_t op, Time t);
  // xfer: how long the op moved data (-1: since it started); waiting for peers is not counted.
  void complete_op(RankSt& r, int s, Time t, bool inline_, Time xfer = -1);

  // compute
  void start_compute(RankSt& r, const StageData& sd, int s, uint32_t op, Time t);
  Time compute_end(const RankSt& r) const;
  void consume(RankSt& r, Time now) const;
  void refresh_compute(RankSt& r, Time now);
  void set_act(RankSt& r, int s, Time b, Time now) {
    r.act_b[s] = b;
    refresh_compute(r, now);
  }
  void charge_gap(RankSt& r, const StageData& sd, uint32_t op, Time t);
  void charge_wait(RankSt& r, int s, Time gap);
  // memory
  int64_t device_bytes(int64_t alloc, int64_t ws) const {
    const int64_t a = alloc + ws;
    return a + ctx_ + static_cast<int64_t>(frag_ * double(a));
  }
  void memory_event(RankSt& r, const StageData& sd, const Op& o, uint32_t op, Time t, int sign);
  // collectives
  int coll_for(int g, uint64_t ordinal);
  void arrive(RankSt& r, const StageData& sd, int s, uint32_t op, Time t);
  void coll_start(int id, Time now);
  void coll_finish(int id, Time t);
  // transfers
  void start_send(RankSt& r, const StageData& sd, int s, uint32_t op, Time t);
  void start_copy(RankSt& r, const StageData& sd, int s, uint32_t op, Time t);
  bool start_recv(RankSt& r, const StageData& sd, int s, uint32_t op, Time t);
  void deliver(int dst, int ch, uint64_t seq, Time a, Time xfer, Time now);
  int xfer_new() {
    int id;
    if (!free_xfers_.empty()) {
      id = free_xfers_.back();
      free_xfers_.pop_back();
    } else {
      id = int(xfers_.size());
      xfers_.emplace_back();
    }
    Xfer& x = xfers_[id];
    x.live = true;
    x.odirty = false;
    x.sent = false;
    x.fin = x.evt = kNever;
    x.serial = ++serial_;
    return id;
  }
  void xfer_free(int id) {
    xfers_[id].live = false;
    free_xfers_.push_back(id);
  }
  // fluid resources
  int new_flow(int res, int64_t R, int64_t w, Time join, OwnerKind ok, int owner, int slot);
  void res_add(int rid, int fid);
  void res_advance(Res& R, Time T);
  void res_predict(Res& R);
  void set_fin(int fid, Time fin);
  void flush_owners();
  void coll_update(int id);
  void xfer_update(int id);

  // ---- PDES ----
  bool local(int rank) const { return owner_[rank] == me_; }
  void send_msg(int proc, const Msg& m) {
    outbox_[proc].push_back(m);
    ++stats_.messages;
  }
  Time compute_eot(Time glb);
  Time lb_start(const RankSt& r, const StageData& sd, uint32_t x, uint32_t itx, Time glb) const;
  void exchange();
  void apply(const Msg& m);
  std::string describe_stuck(const RankSt& r) const;

  const Program& prog_;
  const Layout& L_;
  const ClusterSpec& C_;
  const OpCosts& costs_;
  const SimOptions& opt_;

  int W_ = 0, K_ = 1, G_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int P_ = 1, me_ = 0;
  bool trace_ = false;
  int64_t q_slow_ = kS;
  int64_t ctx_ = 0, hbm_ = 0;
  double frag_ = 0;

  std::vector<StageData> stages_;
  std::vector<RankSt> ranks_;
  std::vector<int> owner_, local_ranks_;
  std::vector<int32_t> rank_groups_;
  std::vector<int32_t> group_size_;
  std::vector<std::vector<int>> group_procs_;
  std::vector<uint8_t> group_nic_shared_;
  std::vector<int32_t> group_inst_;
  std::vector<Res> res_;
  std::vector<std::vector<int>> res_holders_;  // NICs only; empty: not shared
  std::vector<Flow> flows_;
  std::vector<int32_t> free_flows_;
  std::vector<Coll> colls_;
  std::vector<int32_t> free_colls_;
  std::vector<Xfer> xfers_;
  std::vector<int32_t> free_xfers_;
  std::vector<Delivery> deliveries_;
  std::vector<int32_t> free_deliveries_;
  std::vector<std::pair<OwnerKind, int32_t>> dirty_owners_;
  struct Scratch {
    int32_t id;
    int64_t R, w;
  };
  std::vector<Scratch> scratch_;
  EventQueue heap_;
  uint64_t seq_ = 0, serial_ = 0;
  std::vector<int> dirty_, work_;
  Time now_ = 0;
  Time last_event_ = 0;

  // PDES state
  std::vector<std::vector<Msg>> outbox_;
  std::vector<std::array<std::vector<Bnd>, kStreams>> bnd_;  // per local index
  std::vector<std::array<std::pair<uint32_t, uint32_t>, kStreams>> bcur_;
  std::vector<int> bnd_ranks_;
  std::vector<std::pair<int32_t, uint64_t>> cross_colls_, cross_xfers_;

  // results
  SimStats stats_;
  SimOom oom_;
  std::vector<std::vector<SimOpSpan>> spans_;
  std::vector<std::vector<trace::MemorySample>> samples_;
};

// ================================================================================ setup ====

void Sim::setup_stages() {
  const int pp = int(prog_.stages.size());
  stages_.resize(pp);
  std::unordered_map<OpKey, Time, OpKeyHash> cmemo;
  for (int s = 0; s < pp; ++s) {
    StageData& sd = stages_[s];
    const StageProgram& sp = prog_.stages[s];
    sd.sp = &sp;
    sd.n = uint32_t(sp.ops.size());
    sd.pos.resize(sd.n);
    sd.str.resize(sd.n);
    sd.key.assign(sd.n, 0);
    sd.ord.assign(sd.n, 0);
    sd.cat.resize(sd.n);
    sd.cdur.assign(sd.n, 0);
    sd.ci.assign(sd.n, -1);
    int ncomm = 0;
    for (uint32_t i = 0; i < sd.n; ++i) {
      const Op& op = sp.ops[i];
      const int st = int(op.stream);
      if (st < 0 || st >= kStreams) throw std::runtime_error("simulate: op with an invalid stream");
      for (uint32_t k = 0; k < op.dep_count; ++k)
        if (sp.deps_of(op)[k] >= i)
          throw std::runtime_error("simulate: stage " + std::to_string(s) + " op " + std::to_string(i) +
                                   " depends on a later op");
      sd.str[i] = uint8_t(st);
      sd.pos[i] = uint32_t(sd.ops_of[st].size());
      sd.ops_of[st].push_back(i);
      sd.cat[i] = category_of(op);
      switch (op.kind) {
        case OpKind::collective: {
          GroupKey k{op.group, op.tp, op.tp_big};
          size_t j = 0;
          while (j < sd.keys.size() && !(sd.keys[j] == k)) ++j;
          if (j == sd.keys.size()) {
            sd.keys.push_back(k);
            sd.key_count.push_back(0);
          }
          sd.key[i] = uint8_t(j);
          sd.ord[i] = sd.key_count[j]++;
          sd.ci[i] = ncomm++;
          break;
        }
        case OpKind::send:
        case OpKind::copy_d2h:
        case OpKind::copy_h2d:
          sd.key[i] = op.group == GroupKind::pp_prev ? 1 : 0;
          sd.ci[i] = ncomm++;
          break;
        case OpKind::recv: sd.key[i] = op.group == GroupKind::pp_prev ? 1 : 0; break;
        case OpKind::compute:
        case OpKind::host_compute: {
          OpKey key = key_of(op);
          auto it = cmemo.find(key);
          if (it == cmemo.end()) it = cmemo.emplace(key, to_ns(costs_.compute_time_s(op), "compute", op)).first;
          sd.cdur[i] = it->second;
          break;
        }
        default: break;
      }
    }
    if (sd.keys.size() > 250) throw std::runtime_error("simulate: too many distinct groups in a stage");
    for (int st = 0; st < kStreams; ++st) sd.len[st] = uint32_t(sd.ops_of[st].size());
    // Anchors: the latest position on every stream that each op transitively waits for.
    sd.anc.resize(sd.n);
    for (uint32_t i = 0; i < sd.n; ++i) {
      std::array<int32_t, kStreams> a;
      a.fill(-1);
      auto merge = [&](uint32_t d) {
        for (int st = 0; st < kStreams; ++st) a[st] = std::max(a[st], sd.anc[d][st]);
        a[sd.str[d]] = std::max(a[sd.str[d]], int32_t(sd.pos[d]));
      };
      if (sd.pos[i] > 0) merge(sd.ops_of[sd.str[i]][sd.pos[i] - 1]);
      const Op& op = sp.ops[i];
      for (uint32_t k = 0; k < op.dep_count; ++k) merge(sp.deps_of(op)[k]);
      sd.anc[i] = a;
    }
    sd.workspace = costs_.workspace_bytes(s);
  }
}

void Sim::setup_ranks() {
  W_ = L_.world_size();
  G_ = std::max(1, C_.node.gpus_per_node);
  ranks_.resize(W_);
  // Group keys of each stage resolved for every rank, and rank classes.
  int max_keys = 0;
  for (auto& sd : stages_) max_keys = std::max<int>(max_keys, int(sd.keys.size()));
  rank_groups_.assign(size_t(W_) * std::max(1, max_keys), -1);
  std::vector<std::vector<std::vector<int64_t>>> sigs(stages_.size());
  for (int r = 0; r < W_; ++r) {
    RankSt& rk = ranks_[r];
    const RankCoords c = L_.coords(r);
    rk.rank = r;
    rk.stage = c.stage;
    rk.node = r / G_;
    rk.gbase = r * std::max(1, max_keys);
    rk.act_b.fill(kNever);
    rk.wake.fill(-1);
    rk.wake_cat.fill(kNone);
    StageData& sd = stages_[rk.stage];
    std::vector<int64_t> sig;
    for (size_t k = 0; k < sd.keys.size(); ++k) {
      Op op;
      op.kind = OpKind::collective;
      op.group = sd.keys[k].kind;
      op.tp = sd.keys[k].tp;
      op.tp_big = sd.keys[k].tp_big;
      const int g = resolve_group(L_, r, op);
      rank_groups_[rk.gbase + k] = g;
      if (g < 0) {
        sig.push_back(-1);
        continue;
      }
      const auto& ranks = L_.group(g).ranks;
      std::vector<int> nodes;
      for (int m : ranks) nodes.push_back(m / G_);
      std::sort(nodes.begin(), nodes.end());
      sig.push_back(int64_t(ranks.size()) << 32 | int64_t(std::unique(nodes.begin(), nodes.end()) - nodes.begin()));
    }
    for (int ch = 0; ch < 2; ++ch) {
      Op op;
      op.kind = OpKind::send;
      op.group = ch == 0 ? GroupKind::pp_next : GroupKind::pp_prev;
      const int peer = resolve_peer(L_, r, op);
      rk.ch[ch].peer = peer;
      sig.push_back(peer < 0 ? -1 : (peer / G_ == rk.node ? 1 : 0));
    }
    if (rk.ch[1].peer == rk.ch[0].peer) rk.chmap[1] = 0;
    auto& list = sigs[rk.stage];
    size_t cls = 0;
    while (cls < list.size() && list[cls] != sig) ++cls;
    if (cls == list.size()) {
      list.push_back(sig);
      sd.rep.push_back(r);
    }
    rk.cls = int(cls);
  }
  // Communication costs per (stage, class, op), and the per-stream lower bounds.
  for (size_t s = 0; s < stages_.size(); ++s) {
    StageData& sd = stages_[s];
    const StageProgram& sp = *sd.sp;
    const size_t ncls = sd.rep.size();
    sd.comm.resize(ncls);
    sd.mind.resize(ncls);
    sd.prefix.resize(ncls);
    for (size_t cls = 0; cls < ncls; ++cls) {
      const int rep = sd.rep[cls];
      std::unordered_map<OpKey, CommP, OpKeyHash> memo;
      auto& cv = sd.comm[cls];
      auto& md = sd.mind[cls];
      md.assign(sd.n, 0);
      for (uint32_t i = 0; i < sd.n; ++i) {
        const Op& op = sp.ops[i];
        if (sd.ci[i] >= 0) {
          OpKey key = key_of(op);
          auto it = memo.find(key);
          if (it == memo.end()) {
            const CommCost cc = costs_.comm_cost(op, L_, rep);
            CommP p;
            const Time lat = to_ns(cc.latency_s, "latency", op);
            const Time total = to_ns(cc.time_s(), "time", op);
            p.work = std::max<Time>(0, total - lat);
            p.tail = lat / 3;
            p.head = lat - p.tail;
            p.link = p.work > 0 ? cc.link : LinkClass::none;
            double cap = 0;
            switch (p.link) {
              case LinkClass::intra_node: cap = C_.node.intra.bandwidth_gbps * C_.node.intra.bus_efficiency; break;
              case LinkClass::inter_node:
                cap = C_.node.nic_count * C_.node.nic.bandwidth_gbps * C_.node.nic.bus_efficiency /
                      std::max(1.0, C_.network.oversubscription);
                break;
              case LinkClass::pcie: cap = C_.node.pcie.bandwidth_gbps; break;
              default: break;
            }
            p.w = kS;
            if (cap > 0 && cc.bandwidth_gbps > 0)
              p.w = std::clamp<int64_t>(std::llround(double(kS) * cc.bandwidth_gbps / cap), 1, kS);
            it = memo.emplace(key, p).first;
          }
          if (int(cv.size()) <= sd.ci[i]) cv.resize(sd.ci[i] + 1);
          cv[sd.ci[i]] = it->second;
          md[i] = it->second.total();
        } else if (op.kind == OpKind::compute || op.kind == OpKind::host_compute) {
          md[i] = sd.cdur[i];
        }
      }
      for (int st = 0; st < kStreams; ++st) {
        auto& pf = sd.prefix[cls][st];
        pf.assign(sd.len[st] + 1, 0);
        for (uint32_t k = 0; k < sd.len[st]; ++k) pf[k + 1] = pf[k] + md[sd.ops_of[st][k]];
      }
    }
  }
  // Groups.
  const auto& groups = L_.groups();
  group_size_.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) group_size_[g] = int32_t(groups[g].ranks.size());
  group_inst_.assign(groups.size(), -1);
  res_.resize(size_t(3) * W_ + (W_ + G_ - 1) / G_);
}

void Sim::setup_partition(bool single) {
  owner_.assign(W_, 0);
  if (P_ > 1 && !single) {
    const int pp = L_.pp();
    for (int r = 0; r < W_; ++r) {
      if (opt_.mirror)
        owner_[r] = r;
      else if (P_ <= pp)
        owner_[r] = int(int64_t(L_.coords(r).stage) * P_ / pp);
      else
        owner_[r] = int(int64_t(r) * P_ / W_);
    }
  }
  local_ranks_.clear();
  for (int r = 0; r < W_; ++r) {
    ranks_[r].li = -1;
    if (owner_[r] == me_) {
      ranks_[r].li = int(local_ranks_.size());
      local_ranks_.push_back(r);
    }
  }
  const auto& groups = L_.groups();
  group_procs_.assign(groups.size(), {});
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& pr = group_procs_[g];
    for (int m : groups[g].ranks) pr.push_back(owner_[m]);
    std::sort(pr.begin(), pr.end());
    pr.erase(std::unique(pr.begin(), pr.end()), pr.end());
  }
  const int nodes = (W_ + G_ - 1) / G_;
  res_holders_.assign(res_.size(), {});
  for (int n = 0; n < nodes; ++n) {
    std::vector<int> h;
    for (int r = n * G_; r < std::min(W_, (n + 1) * G_); ++r) h.push_back(owner_[r]);
    std::sort(h.begin(), h.end());
    h.erase(std::unique(h.begin(), h.end()), h.end());
    if (h.size() > 1) res_holders_[3 * W_ + n] = h;
  }
  group_nic_shared_.assign(groups.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int m : groups[g].ranks)
      if (owner_[m] == me_ && !res_holders_[3 * W_ + m / G_].empty()) group_nic_shared_[g] = 1;
}

// Ops whose execution sends events to other processes, with the least delay between the op's
// start and the effect of those events (the lookahead of the conservative PDES).
void Sim::setup_boundaries(bool* unsafe) {
  bnd_.assign(local_ranks_.size(), {});
  bcur_.assign(local_ranks_.size(), {});
  bnd_ranks_.clear();
  if (P_ == 1) return;
  for (int r : local_ranks_) {
    RankSt& rk = ranks_[r];
    const StageData& sd = stages_[rk.stage];
    bool any = !res_holders_[3 * W_ + rk.node].empty();
    for (size_t k = 0; k < sd.keys.size(); ++k) {
      const int g = rank_groups_[rk.gbase + k];
      if (g >= 0 && (group_procs_[g].size() > 1 || group_nic_shared_[g])) any = true;
    }
    for (int ch = 0; ch < 2; ++ch)
      if (rk.ch[ch].peer >= 0 && !local(rk.ch[ch].peer)) any = true;
    if (!any) continue;
    auto& lists = bnd_[rk.li];
    for (uint32_t i = 0; i < sd.n; ++i) {
      const Op& op = sd.sp->ops[i];
      Time delay = kNever;
      if (op.kind == OpKind::collective) {
        const int g = rank_groups_[rk.gbase + sd.key[i]];
        if (g < 0) continue;
        const CommP& cp = comm(sd, rk.cls, i);
        const bool cross = group_procs_[g].size() > 1;
        const bool shared = cp.link == LinkClass::inter_node && group_nic_shared_[g];
        if (!cross && !shared) continue;
        delay = cp.head;
        if (cp.head <= 0 || (cross && cp.tail <= 0)) *unsafe = true;
      } else if (op.kind == OpKind::send) {
        const int peer = rk.ch[rk.chmap[sd.key[i]]].peer;
        const CommP& cp = comm(sd, rk.cls, i);
        const bool remote = peer >= 0 && !local(peer);
        const int res = res_of(cp.link, r, op.kind);
        const bool shared = res >= 0 && !res_holders_[res].empty();
        if (!remote && !shared) continue;
        if (remote) {
          delay = cp.total();
          if (cp.tail <= 0 || delay <= 0) *unsafe = true;
        }
        if (shared) {
          delay = std::min(delay, cp.head);
          if (cp.head <= 0) *unsafe = true;
        }
      } else {
        continue;
      }
      lists[sd.str[i]].push_back({sd.pos[i], i, delay});
    }
    bnd_ranks_.push_back(r);
  }
}

void Sim::setup() {
  K_ = std::max(1, opt_.iterations);
  trace_ = opt_.record_trace;
  comm_ = opt_.comm;
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_size(comm_, &P_);
    MPI_Comm_rank(comm_, &me_);
  }
  const double f = opt_.interference > 0 ? opt_.interference : sim::kComputeCommInterference;
  q_slow_ = std::clamp<int64_t>(std::llround(double(kS) / std::max(1.0, f)), 1, kS);
  ctx_ = C_.gpu.context_overhead_bytes;
  hbm_ = C_.gpu.hbm_bytes;
  frag_ = C_.gpu.allocator_fragmentation;
  if (int(prog_.stages.size()) != L_.pp())
    throw std::runtime_error("simulate: the program has " + std::to_string(prog_.stages.size()) +
                             " stages but the layout " + std::to_string(L_.pp()));
  if (opt_.mirror && P_ != L_.world_size())
    throw InputError("simulate --mirror: the MPI world has " + std::to_string(P_) +
                     " processes but the plan needs " + std::to_string(L_.world_size()) +
                     " (one process per simulated rank)");
  setup_stages();
  setup_ranks();
  bool unsafe = false;
  setup_partition(false);
  setup_boundaries(&unsafe);
  if (P_ > 1) {
    int u = unsafe, any = 0;
    MPI_Allreduce(&u, &any, 1, MPI_INT, MPI_MAX, comm_);
    if (any) {
      if (opt_.mirror)
        throw InputError("simulate --mirror: a communication op without latency leaves the "
                         "parallel simulation no lookahead");
      // Zero-latency communication: no lookahead; process 0 simulates every rank.
      setup_partition(true);
      bool dummy = false;
      setup_boundaries(&dummy);
      bnd_ranks_.clear();
      bnd_.assign(local_ranks_.size(), {});
    }
  }
  outbox_.assign(P_, {});
  for (int r : local_ranks_) {
    RankSt& rk = ranks_[r];
    rk.res.rank = r;
    rk.res.stage = rk.stage;
    rk.res.peak_memory_bytes = device_bytes(0, stages_[rk.stage].workspace);
    rk.res.peak_by_category[int(MemCategory::buffers)] = stages_[rk.stage].workspace;
    rk.res.peak_context_bytes = ctx_;
    rk.res.peak_fragmentation_bytes = rk.res.peak_memory_bytes - ctx_ - stages_[rk.stage].workspace;
  }
  if (trace_) {
    spans_.assign(local_ranks_.size(), {});
    samples_.assign(local_ranks_.size(), {});
  }
}

// ========================================================================= event loop ====

void Sim::run_until(Time H) {
  if (!dirty_.empty()) flush_dirty(now_);
  while (!heap_.empty() && heap_.top().t < H) {
    const Time t = heap_.top().t;
    now_ = t;
    last_event_ = t;
    do {
      const Ev e = heap_.top();
      heap_.pop();
      ++stats_.heap_events;
      handle(e);
    } while (!heap_.empty() && heap_.top().t == t);
    flush_dirty(t);
  }
}

void Sim::flush_dirty(Time t) {
  while (!dirty_.empty()) {
    work_.swap(dirty_);
    std::sort(work_.begin(), work_.end());
    for (int r : work_) {
      RankSt& rk = ranks_[r];
      rk.dirty = false;
      advance(rk, t);
    }
    work_.clear();
  }
}

void Sim::handle(const Ev& e) {
  switch (e.type()) {
    case kEvCompute: {
      RankSt& r = ranks_[e.id];
      if (!r.crun || e.ver != r.cver) return;
      r.crun = false;
      const int s = int(Stream::compute);
      const StageData& sd = stages_[r.stage];
      const Op& op = sd.sp->ops[sd.ops_of[s][r.pos[s]]];
      const Time busy = e.t - r.start[s];
      r.acc[op.phase == Phase::recompute ? kRecompute : op.phase == Phase::optimizer ? kOptimizer : kCompute] += busy;
      r.last_compute_end = e.t;
      complete_op(r, s, e.t, false);
      return;
    }
    case kEvOpEnd: complete_op(ranks_[e.id], int(e.ver), e.t, false); return;
    case kEvColl: {
      Coll& c = colls_[e.id];
      if (!c.live || e.ver != c.ver) return;
      if (!c.cross) {
        coll_finish(int(e.id), e.t);
        return;
      }
      Time v = kMinTime;
      for (const Member& m : c.members) v = std::max(v, m.fin + m.tail);
      c.local_done = true;
      c.value = std::max(c.value, v);
      for (int p : group_procs_[c.group])
        if (p != me_) {
          Msg m{};
          m.type = kMsgFinish;
          m.i0 = c.group;
          m.u = c.ordinal;
          m.t0 = v;
          m.effect = v;
          send_msg(p, m);
        }
      if (c.finish_pending == 0) push(c.value, kEvCollDone, e.id, c.ver);
      return;
    }
    case kEvCollDone: {
      Coll& c = colls_[e.id];
      if (!c.live || e.ver != c.ver) return;
      coll_finish(int(e.id), e.t);
      return;
    }
    case kEvXfer: {
      Xfer& x = xfers_[e.id];
      if (!x.live || e.ver != x.ver) return;
      RankSt& r = ranks_[x.rank];
      if (x.kind == kXCopy) {
        complete_op(r, x.stream, e.t, false);
        xfer_free(int(e.id));
        return;
      }
      if (!x.remote) {
        set_act(r, x.stream, kNever, e.t);
        deliver(x.dst, x.dst_ch, x.seq, e.t, e.t - x.start, e.t);
        complete_op(r, x.stream, e.t, false);
        xfer_free(int(e.id));
        return;
      }
      // Remote receiver: the bytes are through; the arrival is known now.
      const Time a = e.t + x.tail;
      Msg m{};
      m.type = kMsgDeliver;
      m.i0 = x.dst;
      m.i1 = x.dst_ch;
      m.u = x.seq;
      m.t0 = a;
      m.t1 = a - x.start;
      m.effect = a;
      send_msg(owner_[x.dst], m);
      x.sent = true;
      push(a, kEvXferDone, e.id, ++x.ver);
      return;
    }
    case kEvXferDone: {
      Xfer& x = xfers_[e.id];
      if (!x.live || e.ver != x.ver) return;
      RankSt& r = ranks_[x.rank];
      set_act(r, x.stream, kNever, e.t);
      complete_op(r, x.stream, e.t, false);
      xfer_free(int(e.id));
      return;
    }
    case kEvDeliver: {
      const Delivery d = deliveries_[e.id];
      free_deliveries_.push_back(int32_t(e.id));
      deliver(d.dst, d.ch, d.seq, d.a, d.xfer, e.t);
      return;
    }
  }
}

bool Sim::ready(const RankSt& r, const StageData& sd, int s, uint32_t op) const {
  const uint32_t it = r.it[s];
  if (r.pos[s] == 0 && it > 0)
    for (int s2 = 0; s2 < kStreams; ++s2)
      if (sd.len[s2] && r.it[s2] < it) return false;  // iteration boundary: the rank drains first
  const Op& o = sd.sp->ops[op];
  const uint32_t* d = sd.sp->deps.data() + o.dep_begin;
  for (uint32_t k = 0; k < o.dep_count; ++k) {
    const uint32_t dep = d[k];
    const int sdp = sd.str[dep];
    if (r.it[sdp] < it || (r.it[sdp] == it && r.pos[sdp] <= sd.pos[dep])) return false;
  }
  return true;
}

void Sim::advance(RankSt& r, Time t) {
  const StageData& sd = stages_[r.stage];
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < kStreams; ++s) {
      while (!r.running[s] && r.it[s] < uint32_t(K_) && sd.len[s] > 0) {
        const uint32_t op = sd.ops_of[s][r.pos[s]];
        if (!ready(r, sd, s, op)) break;
        if (!start_op(r, sd, s, op, t)) break;
        progress = true;
      }
    }
  }
}

void Sim::complete_op(RankSt& r, int s, Time t, bool inline_, Time xfer) {
  const StageData& sd = stages_[r.stage];
  const uint32_t op = sd.ops_of[s][r.pos[s]];
  if (trace_) spans_[r.li].push_back({op, r.it[s], r.start[s], t});
  r.running[s] = 0;
  r.wake[s] = t;
  r.wake_cat[s] = sd.cat[op];
  r.wake_dur[s] = xfer >= 0 ? xfer : t - r.start[s];
  r.end = std::max(r.end, t);
  ++r.ops;
  if (++r.pos[s] == sd.len[s]) {
    r.pos[s] = 0;
    ++r.it[s];
  }
  if (!inline_) mark_dirty(r);
}

bool Sim::start_op(RankSt& r, const StageData& sd, int s, uint32_t op, Time t) {
  const Op& o = sd.sp->ops[op];
  r.start[s] = t;
  switch (o.kind) {
    case OpKind::alloc:
    case OpKind::free:
      memory_event(r, sd, o, op, t, o.kind == OpKind::alloc ? 1 : -1);
      complete_op(r, s, t, true);
      return true;
    case OpKind::compute:
      if (s == int(Stream::compute)) {
        charge_gap(r, sd, op, t);
        if (sd.cdur[op] == 0) {
          r.last_compute_end = t;
          complete_op(r, s, t, true);
          return true;
        }
        start_compute(r, sd, s, op, t);
        return false;
      }
      [[fallthrough]];
    case OpKind::host_compute:
      if (sd.cdur[op] == 0) {
        complete_op(r, s, t, true);
        return true;
      }
      r.running[s] = 1;
      push(t + sd.cdur[op], kEvOpEnd, uint32_t(r.rank), uint32_t(s));
      return false;
    case OpKind::collective:
      r.running[s] = 1;
      arrive(r, sd, s, op, t);
      return false;
    case OpKind::send:
      r.running[s] = 1;
      start_send(r, sd, s, op, t);
      return false;
    case OpKind::recv: return start_recv(r, sd, s, op, t);
    case OpKind::copy_d2h:
    case OpKind::copy_h2d:
      r.running[s] = 1;
      start_copy(r, sd, s, op, t);
      return false;
  }
  return false;
}

// ---- compute and interference ----

void Sim::start_compute(RankSt& r, const StageData& sd, int s, uint32_t op, Time t) {
  r.running[s] = 1;
  r.crun = true;
  r.cR = sd.cdur[op] * kS;
  r.cref = t;
  r.cend = compute_end(r);
  push(r.cend, kEvCompute, uint32_t(r.rank), ++r.cver);
}

// The running kernel progresses at kS per ns, or q_slow_ while a comm op of the rank moves
// data (a stream's window opens at act_b and stays open until the op completes).
Time Sim::compute_end(const RankSt& r) const {
  int64_t R = r.cR;
  Time t = r.cref;
  for (;;) {
    if (R <= 0) return t;
    bool active = false;
    Time next = kNever;
    for (int s = 1; s < kStreams; ++s) {
      const Time b = r.act_b[s];
      if (b == kNever) continue;
      if (b <= t) active = true;
      else next = std::min(next, b);
    }
    if (active) return t + ceil_div(R, q_slow_);
    if (next == kNever || kS * (next - t) >= R) return t + ceil_div(R, kS);
    R -= kS * (next - t);
    t = next;
  }
}

void Sim::consume(RankSt& r, Time now) const {
  Time t = r.cref;
  int64_t R = r.cR;
  while (t < now && R > 0) {
    bool active = false;
    Time next = kNever;
    for (int s = 1; s < kStreams; ++s) {
      const Time b = r.act_b[s];
      if (b == kNever) continue;
      if (b <= t) active = true;
      else next = std::min(next, b);
    }
    const Time seg = active ? now : std::min(next, now);
    R -= (active ? q_slow_ : kS) * (seg - t);
    t = seg;
  }
  r.cR = R;
  r.cref = now;
}

void Sim::refresh_compute(RankSt& r, Time now) {
  if (!r.crun || q_slow_ == kS) return;
  consume(r, now);
  const Time e = compute_end(r);
  if (e != r.cend) {
    r.cend = e;
    push(e, kEvCompute, uint32_t(r.rank), ++r.cver);
  }
}

// Idle time of the compute stream before a kernel, charged to what the kernel waited for: the
// part during which that op moved data is exposed communication, the rest (waiting for a peer
// to reach the collective or to send) is pipeline bubble.
void Sim::charge_gap(RankSt& r, const StageData& sd, uint32_t op, Time t) {
  const Time gap = t - r.last_compute_end;
  if (gap <= 0) return;
  static constexpr Cat prio[] = {kRecv, kTp, kDp, kPp, kOffload};
  int best = 99, best_s = -1;
  auto consider = [&](int s) {
    if (r.wake[s] != t) return;
    for (int p = 0; p < 5; ++p)
      if (r.wake_cat[s] == prio[p] && p < best) best = p, best_s = s;
  };
  const Op& o = sd.sp->ops[op];
  const uint32_t* d = sd.sp->deps.data() + o.dep_begin;
  for (uint32_t k = 0; k < o.dep_count; ++k) consider(sd.str[d[k]]);
  if (best == 99)
    for (int s = 1; s < kStreams; ++s) consider(s);
  charge_wait(r, best_s, gap);
}

void Sim::charge_wait(RankSt& r, int s, Time gap) {
  if (s < 0 || r.wake_cat[s] == kNone) {
    r.acc[kBubble] += gap;
    return;
  }
  const Cat cat = r.wake_cat[s] == kRecv ? kPp : Cat(r.wake_cat[s]);
  const Time part = std::min(gap, std::max<Time>(0, r.wake_dur[s]));
  r.acc[cat] += part;
  r.acc[kBubble] += gap - part;
}

// ---- memory ----

void Sim::memory_event(RankSt& r, const StageData& sd, const Op& o, uint32_t op, Time t, int sign) {
  const int c = int(o.category);
  r.mem[c] += sign * o.bytes;
  r.alloc += sign * o.bytes;
  const int64_t dev = device_bytes(r.alloc, sd.workspace);
  SimRankResult& res = r.res;
  if (sign > 0 && dev > res.peak_memory_bytes) {
    res.peak_memory_bytes = dev;
    res.peak_allocated_bytes = r.alloc;
    for (int k = 0; k < kNumMemCategories; ++k) res.peak_by_category[k] = r.mem[k];
    res.peak_by_category[int(MemCategory::buffers)] += sd.workspace;
    res.peak_context_bytes = ctx_;
    res.peak_fragmentation_bytes = dev - ctx_ - r.alloc - sd.workspace;
    res.peak_time_ns = t;
    res.peak_op = int32_t(op);
    res.peak_iteration = int32_t(r.it[sd.str[op]]);
  }
  if (sign > 0 && dev > hbm_ && !r.oom) {
    r.oom = true;
    if (!oom_.oom || t < oom_.time_ns || (t == oom_.time_ns && r.rank < oom_.rank)) {
      oom_.oom = true;
      oom_.rank = r.rank;
      oom_.op = int32_t(op);
      oom_.iteration = int32_t(r.it[sd.str[op]]);
      oom_.time_ns = t;
      oom_.bytes = dev;
      oom_.hbm_bytes = hbm_;
    }
  }
  if (trace_) {
    trace::MemorySample m;
    m.time_ns = t;
    for (int k = 0; k < kNumMemCategories; ++k) m.bytes[k] = r.mem[k];
    m.bytes[int(MemCategory::buffers)] += sd.workspace;
    m.total_bytes = dev;
    m.high_water_bytes = res.peak_memory_bytes;
    samples_[r.li].push_back(m);
  }
}

// ---- collectives ----

int Sim::coll_for(int g, uint64_t ordinal) {
  int id = group_inst_[g];
  if (id >= 0) {
    if (colls_[id].ordinal != ordinal)
      throw std::logic_error("simulate: collective " + std::to_string(ordinal) + " of group " +
                             std::to_string(g) + " arrived while collective " +
                             std::to_string(colls_[id].ordinal) + " is open");
    return id;
  }
  if (!free_colls_.empty()) {
    id = free_colls_.back();
    free_colls_.pop_back();
  } else {
    id = int(colls_.size());
    colls_.emplace_back();
  }
  Coll& c = colls_[id];
  c.group = g;
  c.ordinal = ordinal;
  c.serial = ++serial_;
  c.size = group_size_[g];
  c.arrived = 0;
  c.max_arr = kMinTime;
  c.evt = kNever;
  c.value = kMinTime;
  c.cross = group_procs_[g].size() > 1;
  c.finish_pending = c.cross ? int(group_procs_[g].size()) - 1 : 0;
  c.started = c.local_done = c.odirty = false;
  c.live = true;
  c.members.clear();
  group_inst_[g] = id;
  return id;
}

void Sim::arrive(RankSt& r, const StageData& sd, int s, uint32_t op, Time t) {
  const int g = rank_groups_[r.gbase + sd.key[op]];
  if (g < 0) {  // no group (e.g. tied embedding with pp == 1): nothing to do
    push(t, kEvOpEnd, uint32_t(r.rank), uint32_t(s));
    return;
  }
  const uint64_t ordinal = uint64_t(r.it[s]) * sd.key_count[sd.key[op]] + sd.ord[op];
  const int id = coll_for(g, ordinal);
  Coll& c = colls_[id];
  const CommP& cp = comm(sd, r.cls, op);
  c.members.push_back({r.rank, uint8_t(s), op, cp.head, cp.tail, cp.work, cp.w, cp.link, kNever});
  ++c.arrived;
  c.max_arr = std::max(c.max_arr, t);
  if (c.cross)
    for (int p : group_procs_[g])
      if (p != me_) {
        Msg m{};
        m.type = kMsgArrive;
        m.i0 = g;
        m.i1 = r.rank;
        m.u = ordinal;
        m.t0 = t;
        m.effect = t + cp.head;
        send_msg(p, m);
      }
  if (c.arrived == c.size) coll_start(id, t);
}

void Sim::coll_start(int id, Time now) {
  Coll& c = colls_[id];
  c.started = true;
  c.start = c.max_arr;
  for (size_t i = 0; i < c.members.size(); ++i) {
    Member& m = colls_[id].members[i];
    const Time join = c.start + m.head;
    const int res = m.work > 0 ? res_of(m.link, m.rank, OpKind::collective) : -1;
    set_act(ranks_[m.rank], m.stream, join, now);
    if (res >= 0) {
      new_flow(res, m.work * kS, m.w, join, kOwnColl, id, int(i));
    } else {
      colls_[id].members[i].fin = join;
    }
  }
  Coll& cc = colls_[id];
  if (!cc.odirty) {
    cc.odirty = true;
    dirty_owners_.push_back({kOwnColl, id});
  }
  if (cc.cross) cross_colls_.push_back({id, cc.serial});
  flush_owners();
}

void Sim::coll_update(int id) {
  Coll& c = colls_[id];
  c.odirty = false;
  if (!c.live || !c.started || c.local_done) return;
  Time T = kMinTime;
  for (const Member& m : c.members) {
    if (m.fin == kNever) return;
    T = std::max(T, c.cross ? m.fin : m.fin + m.tail);
  }
  if (T != c.evt) {
    c.evt = T;
    push(T, kEvColl, uint32_t(id), ++c.ver);
  }
}

void Sim::coll_finish(int id, Time t) {
  Coll& c = colls_[id];
  for (const Member& m : c.members) {
    RankSt& r = ranks_[m.rank];
    set_act(r, m.stream, kNever, t);
    complete_op(r, m.stream, t, false, t - c.start);
  }
  group_inst_[c.group] = -1;
  c.live = false;
  ++c.ver;
  free_colls_.push_back(id);
}

// ---- sends, receives, copies ----

void Sim::start_send(RankSt& r, const StageData& sd, int s, uint32_t op, Time t) {
  const int ch = r.chmap[sd.key[op]];
  const int peer = r.ch[ch].peer;
  if (peer < 0 || peer == r.rank)
    throw std::runtime_error("simulate: rank " + std::to_string(r.rank) + " op " + std::to_string(op) +
                             " sends to no pipeline peer");
  const CommP& cp = comm(sd, r.cls, op);
  const int id = xfer_new();
  Xfer& x = xfers_[id];
  x.kind = kXSend;
  x.rank = r.rank;
  x.stream = uint8_t(s);
  x.start = t;
  x.head = cp.head;
  x.tail = cp.tail;
  x.work = cp.work;
  x.dst = peer;
  const RankSt& q = ranks_[peer];
  x.dst_ch = q.ch[0].peer == r.rank ? 0 : 1;
  x.seq = r.ch[ch].sent++;
  x.remote = !local(peer);
  set_act(r, s, t + cp.head, t);
  const int res = cp.work > 0 ? res_of(cp.link, r.rank, OpKind::send) : -1;
  if (res >= 0) {
    new_flow(res, cp.work * kS, cp.w, t + cp.head, kOwnXfer, id, 0);
  } else {
    xfers_[id].fin = t + cp.head;
    xfers_[id].odirty = true;
    dirty_owners_.push_back({kOwnXfer, id});
  }
  if (xfers_[id].remote) cross_xfers_.push_back({id, xfers_[id].serial});
  flush_owners();
}

void Sim::start_copy(RankSt& r, const StageData& sd, int s, uint32_t op, Time t) {
  const Op& o = sd.sp->ops[op];
  const CommP& cp = comm(sd, r.cls, op);
  const int id = xfer_new();
  Xfer& x = xfers_[id];
  x.kind = kXCopy;
  x.rank = r.rank;
  x.stream = uint8_t(s);
  x.start = t;
  x.head = cp.head;
  x.tail = cp.tail;
  x.work = cp.work;
  x.remote = false;
  const int res = cp.work > 0 ? res_of(cp.link, r.rank, o.kind) : -1;
  if (res >= 0) {
    new_flow(res, cp.work * kS, cp.w, t + cp.head, kOwnXfer, id, 0);
  } else {
    x.fin = t + cp.head;
    x.odirty = true;
    dirty_owners_.push_back({kOwnXfer, id});
  }
  flush_owners();
}

void Sim::xfer_update(int id) {
  Xfer& x = xfers_[id];
  x.odirty = false;
  if (!x.live || x.sent || x.fin == kNever) return;
  const Time T = x.remote ? x.fin : x.fin + x.tail;
  if (T != x.evt) {
    x.evt = T;
    push(T, kEvXfer, uint32_t(id), ++x.ver);
  }
}

bool Sim::start_recv(RankSt& r, const StageData& sd, int s, uint32_t op, Time t) {
  Channel& c = r.ch[r.chmap[sd.key[op]]];
  const uint64_t seq = c.recvd++;
  if (c.head < c.fifo.size()) {
    const Arrival a = c.fifo[c.head++];
    if (c.head == c.fifo.size()) {
      c.fifo.clear();
      c.head = 0;
    }
    if (a.seq != seq) throw std::logic_error("simulate: pipeline messages out of order");
    complete_op(r, s, t, true, a.xfer);
    return true;
  }
  r.running[s] = 1;
  c.waiting = true;
  c.wait_seq = seq;
  c.wait_stream = uint8_t(s);
  return false;
}

void Sim::deliver(int dst, int ch, uint64_t seq, Time a, Time xfer, Time now) {
  RankSt& r = ranks_[dst];
  Channel& c = r.ch[r.chmap[ch]];
  if (c.waiting && c.wait_seq == seq) {
    c.waiting = false;
    complete_op(r, c.wait_stream, now, false, xfer);
    return;
  }
  c.fifo.push_back({seq, a, xfer});
}

// ---- the integer fluid model of shared links ----

int Sim::new_flow(int res, int64_t R, int64_t w, Time join, OwnerKind ok, int owner, int slot) {
  int fid;
  if (!free_flows_.empty()) {
    fid = free_flows_.back();
    free_flows_.pop_back();
  } else {
    fid = int(flows_.size());
    flows_.emplace_back();
  }
  Flow& f = flows_[fid];
  f.R = R;
  f.w = w;
  f.join = join;
  f.fin = kNever;
  f.owner_kind = ok;
  f.owner = owner;
  f.slot = slot;
  if (ok != kOwnForeign && !res_holders_[res].empty())
    for (int p : res_holders_[res])
      if (p != me_) {
        Msg m{};
        m.type = kMsgJoin;
        m.i0 = res;
        m.t0 = join;
        m.x = R;
        m.y = w;
        m.effect = join;
        send_msg(p, m);
      }
  res_add(res, fid);
  return fid;
}

void Sim::res_add(int rid, int fid) {
  Res& R = res_[rid];
  Flow& f = flows_[fid];
  // Predictions are exact until a flow joins: flows predicted to be done by now are gone.
  if (R.active.size() + R.pending.size() == 1) {
    const int32_t old = R.active.empty() ? R.pending[0] : R.active[0];
    if (flows_[old].fin <= now_) {
      free_flows_.push_back(old);
      R.active.clear();
      R.pending.clear();
    }
  }
  if (R.active.empty() && R.pending.empty()) {
    R.t = now_;
    R.sum_w = 0;
    R.pending.push_back(fid);
    set_fin(fid, f.join + ceil_div(f.R, share_rate(f.w)));
    return;
  }
  res_advance(R, now_);
  auto it = std::upper_bound(R.pending.begin(), R.pending.end(), f.join,
                             [&](Time j, int32_t other) { return j < flows_[other].join; });
  R.pending.insert(it, fid);
  res_predict(R);
}

void Sim::res_advance(Res& R, Time T) {
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
        free_flows_.push_back(a);
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
void Sim::res_predict(Res& R) {
  if (R.active.size() + R.pending.size() == 1) {
    const bool act = !R.active.empty();
    const int32_t fid = act ? R.active[0] : R.pending[0];
    set_fin(fid, (act ? R.t : flows_[fid].join) + ceil_div(flows_[fid].R, share_rate(flows_[fid].w)));
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

void Sim::set_fin(int fid, Time fin) {
  Flow& f = flows_[fid];
  if (f.fin == fin) return;
  f.fin = fin;
  if (f.owner_kind == kOwnColl) {
    Coll& c = colls_[f.owner];
    c.members[f.slot].fin = fin;
    if (!c.odirty) {
      c.odirty = true;
      dirty_owners_.push_back({kOwnColl, f.owner});
    }
  } else if (f.owner_kind == kOwnXfer) {
    Xfer& x = xfers_[f.owner];
    x.fin = fin;
    if (!x.odirty) {
      x.odirty = true;
      dirty_owners_.push_back({kOwnXfer, f.owner});
    }
  }
}

void Sim::flush_owners() {
  for (size_t i = 0; i < dirty_owners_.size(); ++i) {
    const auto [k, id] = dirty_owners_[i];
    if (k == kOwnColl) coll_update(id);
    else xfer_update(id);
  }
  dirty_owners_.clear();
}

// =============================================================================== PDES ====

// Earliest virtual time at which anything this process does from now on can take effect on
// another process: the next window may run every event before the minimum of these.
Time Sim::compute_eot(Time glb) {
  Time eot = kNever;
  for (const auto& box : outbox_)
    for (const Msg& m : box) eot = std::min(eot, m.effect);
  if (glb == kNever) return eot;
  for (int r : bnd_ranks_) {
    const RankSt& rk = ranks_[r];
    const StageData& sd = stages_[rk.stage];
    for (int s = 0; s < kStreams; ++s) {
      const auto& list = bnd_[rk.li][s];
      if (list.empty()) continue;
      auto& [it, k] = bcur_[rk.li][s];
      while (it < uint32_t(K_)) {
        const Bnd& b = list[k];
        const bool passed = it < rk.it[s] || (it == rk.it[s] && (b.pos < rk.pos[s] || (b.pos == rk.pos[s] && rk.running[s])));
        if (!passed) break;
        if (++k == list.size()) {
          k = 0;
          ++it;
        }
      }
      if (it >= uint32_t(K_)) continue;
      const Bnd& b = list[k];
      const Time lb = lb_start(rk, sd, b.op, it, glb);
      eot = std::min(eot, lb + b.delay);
    }
  }
  size_t w = 0;
  for (size_t i = 0; i < cross_colls_.size(); ++i) {
    const auto [id, serial] = cross_colls_[i];
    const Coll& c = colls_[id];
    if (!c.live || c.serial != serial || c.local_done) continue;
    cross_colls_[w++] = cross_colls_[i];
    Time lbfin = glb, tail = kNever;
    for (const Member& m : c.members) {
      lbfin = std::max(lbfin, c.start + m.head + m.work);
      tail = std::min(tail, m.tail);
    }
    eot = std::min(eot, lbfin + tail);
  }
  cross_colls_.resize(w);
  w = 0;
  for (size_t i = 0; i < cross_xfers_.size(); ++i) {
    const auto [id, serial] = cross_xfers_[i];
    const Xfer& x = xfers_[id];
    if (!x.live || x.serial != serial || x.sent) continue;
    cross_xfers_[w++] = cross_xfers_[i];
    eot = std::min(eot, std::max(glb, x.start + x.head + x.work) + x.tail);
  }
  cross_xfers_.resize(w);
  return eot;
}

// Lower bound of the start of op x (iteration itx) of rank r: the latest of the chains of
// ops on each stream that x depends on, each run at its uncontended duration.
Time Sim::lb_start(const RankSt& r, const StageData& sd, uint32_t x, uint32_t itx, Time glb) const {
  Time lb = glb;
  const auto& md = sd.mind[r.cls];
  for (int s = 0; s < kStreams; ++s) {
    const int32_t a = sd.anc[x][s];
    if (a < 0) continue;
    const uint32_t ih = r.it[s], ph = r.pos[s];
    if (ih > itx || (ih == itx && ph > uint32_t(a))) continue;  // already done
    const uint32_t h = sd.ops_of[s][ph];
    const Time head_end = r.running[s] ? std::max(glb, r.start[s] + md[h]) : glb + md[h];
    const auto& pf = sd.prefix[r.cls][s];
    const Time total = pf[sd.len[s]];
    const Time sum = (Time(itx) * total + pf[a + 1]) - (Time(ih) * total + pf[ph + 1]);
    lb = std::max(lb, head_end + sum);
  }
  return lb;
}

void Sim::exchange() {
  std::vector<int> scount(P_), rcount(P_), sdisp(P_), rdisp(P_);
  for (int p = 0; p < P_; ++p) scount[p] = int(outbox_[p].size() * sizeof(Msg));
  MPI_Request req;
  MPI_Ialltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, comm_, &req);
  wait_yielding(&req);
  int stot = 0, rtot = 0;
  for (int p = 0; p < P_; ++p) {
    sdisp[p] = stot;
    rdisp[p] = rtot;
    stot += scount[p];
    rtot += rcount[p];
  }
  std::vector<Msg> sbuf(stot / sizeof(Msg)), rbuf(rtot / sizeof(Msg));
  size_t at = 0;
  for (int p = 0; p < P_; ++p) {
    std::copy(outbox_[p].begin(), outbox_[p].end(), sbuf.begin() + at);
    at += outbox_[p].size();
    outbox_[p].clear();
  }
  MPI_Ialltoallv(sbuf.data(), scount.data(), sdisp.data(), MPI_BYTE, rbuf.data(), rcount.data(),
                 rdisp.data(), MPI_BYTE, comm_, &req);
  wait_yielding(&req);
  for (const Msg& m : rbuf) apply(m);
  flush_owners();
}

void Sim::apply(const Msg& m) {
  // The lookahead guarantees that nothing received takes effect before the current horizon.
  if (m.effect < now_)
    throw std::logic_error("simulate: a cross-process event for t=" + std::to_string(m.effect) +
                           " arrived at t=" + std::to_string(now_) + " (lookahead violated)");
  switch (m.type) {
    case kMsgArrive: {
      const int id = coll_for(m.i0, m.u);
      Coll& c = colls_[id];
      ++c.arrived;
      c.max_arr = std::max(c.max_arr, m.t0);
      if (c.arrived == c.size) coll_start(id, now_);
      return;
    }
    case kMsgFinish: {
      const int id = group_inst_[m.i0];
      if (id < 0 || colls_[id].ordinal != m.u) throw std::logic_error("simulate: finish of an unknown collective");
      Coll& c = colls_[id];
      --c.finish_pending;
      c.value = std::max(c.value, m.t0);
      if (c.local_done && c.finish_pending == 0) push(c.value, kEvCollDone, uint32_t(id), c.ver);
      return;
    }
    case kMsgJoin: new_flow(m.i0, m.x, m.y, m.t0, kOwnForeign, -1, 0); return;
    case kMsgDeliver: {
      int id;
      if (!free_deliveries_.empty()) {
        id = free_deliveries_.back();
        free_deliveries_.pop_back();
      } else {
        id = int(deliveries_.size());
        deliveries_.emplace_back();
      }
      deliveries_[id] = {m.i0, m.i1, m.u, m.t0, m.t1};
      push(m.t0, kEvDeliver, uint32_t(id), 0);
      return;
    }
  }
}

std::string Sim::describe_stuck(const RankSt& r) const {
  const StageData& sd = stages_[r.stage];
  std::ostringstream os;
  os << "rank " << r.rank << " (stage " << r.stage << ")";
  bool first = true;
  for (int s = 0; s < kStreams; ++s) {
    if (sd.len[s] == 0 || r.it[s] >= uint32_t(K_)) continue;
    const uint32_t op = sd.ops_of[s][r.pos[s]];
    const Op& o = sd.sp->ops[op];
    os << (first ? ": " : "; ") << to_string(Stream(s)) << " stream at op " << op << " '" << op_name(o) << "'";
    if (K_ > 1) os << " (iteration " << r.it[s] << ")";
    first = false;
    if (!r.running[s]) {
      std::vector<std::string> waits;
      if (r.pos[s] == 0 && r.it[s] > 0) waits.push_back("the end of the previous iteration");
      const uint32_t* d = sd.sp->deps.data() + o.dep_begin;
      for (uint32_t k = 0; k < o.dep_count; ++k) {
        const uint32_t dep = d[k];
        const int sdp = sd.str[dep];
        if (r.it[sdp] < r.it[s] || (r.it[sdp] == r.it[s] && r.pos[sdp] <= sd.pos[dep]))
          waits.push_back("op " + std::to_string(dep) + " '" + op_name(sd.sp->ops[dep]) + "'");
      }
      os << " waits for ";
      for (size_t i = 0; i < waits.size(); ++i) os << (i ? ", " : "") << waits[i];
      continue;
    }
    switch (o.kind) {
      case OpKind::recv: {
        const Channel& c = r.ch[r.chmap[sd.key[op]]];
        os << " waits for message #" << c.wait_seq << " from rank " << c.peer << " (no matching send)";
        break;
      }
      case OpKind::collective: {
        const int g = rank_groups_[r.gbase + sd.key[op]];
        const int id = g >= 0 ? group_inst_[g] : -1;
        if (id >= 0 && !colls_[id].started) {
          const Coll& c = colls_[id];
          os << " waits in " << to_string(o.collective) << " over " << to_string(L_.group(g).kind)
             << " group [";
          const auto& gr = L_.group(g).ranks;
          for (size_t i = 0; i < gr.size(); ++i) os << (i ? "," : "") << gr[i];
          os << "]: " << c.arrived << " of " << c.size << " arrived";
          std::vector<int> missing;
          for (int m : gr) {
            if (!local(m)) continue;
            bool in = false;
            for (const Member& mm : c.members) in |= mm.rank == m;
            if (!in) missing.push_back(m);
          }
          if (!missing.empty()) {
            os << ", missing";
            for (int m : missing) os << " " << m;
          }
        } else {
          os << " (running)";
        }
        break;
      }
      default: os << " (running)"; break;
    }
  }
  return os.str();
}

SimResult Sim::run() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  setup();
  const auto t1 = clock::now();
  stats_.processes = P_;
  now_ = 0;
  for (int r : local_ranks_) mark_dirty(ranks_[r]);
  Time last = 0;
  if (P_ == 1) {
    run_until(kNever);
    last = last_event_;
  } else {
    double t_eot = 0, t_red = 0, t_run = 0, t_x = 0;
    auto tick = [] { return std::chrono::steady_clock::now(); };
    auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    for (;;) {
      const Time glb = !dirty_.empty() ? now_ : heap_.empty() ? kNever : heap_.top().t;
      bool out = false;
      for (const auto& b : outbox_) out |= !b.empty();
      auto q0 = tick();
      int64_t loc[3] = {glb, compute_eot(glb), out ? -1 : 0}, glo[3];
      auto q1 = tick();
      MPI_Request req;
      MPI_Iallreduce(loc, glo, 3, MPI_INT64_T, MPI_MIN, comm_, &req);
      wait_yielding(&req);
      auto q2 = tick();
      t_eot += secs(q0, q1);
      t_red += secs(q1, q2);
      if (glo[0] == kNever && glo[2] == 0) break;
      const Time H = glo[1];
      // With messages waiting to go out the window may be empty: they are sent at its end.
      if (glo[0] != kNever && H <= glo[0] && glo[2] == 0)
        throw std::logic_error("simulate: the parallel simulation made no progress at t=" + std::to_string(H));
      ++stats_.windows;
      auto q3 = tick();
      run_until(H);
      auto q4 = tick();
      last = last_event_;
      // Received events take effect at or after H; apply them at H.
      if (H != kNever) now_ = std::max(now_, H);
      exchange();
      t_run += secs(q3, q4);
      t_x += secs(q4, tick());
    }
    if (std::getenv("STRATAGEM_SIM_PROFILE"))
      std::fprintf(stderr, "process %d: eot %.3f s, allreduce %.3f s, events %.3f s, exchange %.3f s, %zu boundary ranks\n",
                   me_, t_eot, t_red, t_run, t_x, bnd_ranks_.size());
  }
  const auto t2 = clock::now();

  // ---- results ----
  SimResult out;
  out.iterations = K_;
  Time end = 0;
  for (int r : local_ranks_) end = std::max(end, ranks_[r].end);
  bool stuck = false;
  for (int r : local_ranks_) {
    const RankSt& rk = ranks_[r];
    const StageData& sd = stages_[rk.stage];
    for (int s = 0; s < kStreams; ++s)
      if (sd.len[s] && rk.it[s] < uint32_t(K_)) stuck = true;
  }
  if (P_ > 1) {
    int64_t loc[2] = {end, last}, glo[2];
    MPI_Allreduce(loc, glo, 2, MPI_INT64_T, MPI_MAX, comm_);
    end = glo[0];
    last = glo[1];
    int st = stuck, any = 0;
    MPI_Allreduce(&st, &any, 1, MPI_INT, MPI_MAX, comm_);
    stuck = any;
  }
  out.makespan_ns = end;
  // Finalize the local ranks' time accounting against the makespan.
  std::vector<SimRankResult> mine;
  for (int r : local_ranks_) {
    RankSt& rk = ranks_[r];
    SimRankResult& res = rk.res;
    res.end_ns = rk.end;
    res.ops_executed = int64_t(rk.ops);
    auto acc = rk.acc;
    if (rk.end > rk.last_compute_end) {
      // After the last kernel: the rank's last transfers, then waiting for the others.
      Time best = -1;
      int bs = -1;
      for (int s = 1; s < kStreams; ++s)
        if (rk.wake[s] > best) best = rk.wake[s], bs = s;
      std::swap(rk.acc, acc);
      charge_wait(rk, bs, rk.end - rk.last_compute_end);
      std::swap(rk.acc, acc);
    }
    acc[kBubble] += std::max<Time>(0, end - std::max(rk.end, rk.last_compute_end));
    res.compute_ns = acc[kCompute];
    res.recompute_ns = acc[kRecompute];
    res.optimizer_ns = acc[kOptimizer];
    res.tp_ns = acc[kTp];
    res.dp_ns = acc[kDp];
    res.pp_ns = acc[kPp];
    res.bubble_ns = acc[kBubble];
    res.offload_ns = acc[kOffload];
    stats_.ops_executed += rk.ops;
    mine.push_back(res);
  }
  // Deadlock: describe the stuck local ranks, gather to process 0.
  std::string desc;
  std::vector<int> stuck_ranks;
  if (stuck) {
    for (int r : local_ranks_) {
      const RankSt& rk = ranks_[r];
      const StageData& sd = stages_[rk.stage];
      bool st = false;
      for (int s = 0; s < kStreams; ++s) st |= sd.len[s] && rk.it[s] < uint32_t(K_);
      if (!st) continue;
      stuck_ranks.push_back(r);
      if (stuck_ranks.size() <= 8) desc += "  " + describe_stuck(rk) + "\n";
    }
  }
  auto gather_bytes = [&](const void* data, int bytes, std::vector<char>& all, std::vector<int>& counts) {
    counts.assign(P_, 0);
    MPI_Gather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm_);
    std::vector<int> disp(P_, 0);
    int tot = 0;
    for (int p = 0; p < P_; ++p) disp[p] = tot, tot += counts[p];
    all.resize(me_ == 0 ? tot : 0);
    MPI_Gatherv(data, bytes, MPI_BYTE, all.data(), counts.data(), disp.data(), MPI_BYTE, 0, comm_);
  };
  if (P_ > 1) {
    std::vector<char> all;
    std::vector<int> counts;
    gather_bytes(mine.data(), int(mine.size() * sizeof(SimRankResult)), all, counts);
    if (me_ == 0) {
      mine.resize(all.size() / sizeof(SimRankResult));
      if (!all.empty()) std::memcpy(mine.data(), all.data(), all.size());
    }
    gather_bytes(stuck_ranks.data(), int(stuck_ranks.size() * sizeof(int)), all, counts);
    if (me_ == 0) {
      stuck_ranks.resize(all.size() / sizeof(int));
      if (!all.empty()) std::memcpy(stuck_ranks.data(), all.data(), all.size());
    }
    gather_bytes(desc.data(), int(desc.size()), all, counts);
    if (me_ == 0) desc.assign(all.begin(), all.end());
    struct OomPod {
      int64_t flag, time, bytes;
      int32_t rank, op, it, pad;
    } mo{oom_.oom, oom_.time_ns, oom_.bytes, oom_.rank, oom_.op, oom_.iteration, 0};
    std::vector<OomPod> alloom(P_);
    MPI_Allgather(&mo, sizeof mo, MPI_BYTE, alloom.data(), sizeof mo, MPI_BYTE, comm_);
    for (const OomPod& o : alloom)
      if (o.flag && (!oom_.oom || o.time < oom_.time_ns || (o.time == oom_.time_ns && o.rank < oom_.rank))) {
        oom_.oom = true;
        oom_.time_ns = o.time;
        oom_.bytes = o.bytes;
        oom_.rank = o.rank;
        oom_.op = o.op;
        oom_.iteration = o.it;
        oom_.hbm_bytes = hbm_;
      }
    uint64_t sl[4] = {stats_.ops_executed, stats_.heap_events, stats_.messages, 0}, sg[4];
    MPI_Allreduce(sl, sg, 4, MPI_UINT64_T, MPI_SUM, comm_);
    stats_.ops_executed = sg[0];
    stats_.heap_events = sg[1];
    stats_.messages = sg[2];
  }
  std::sort(mine.begin(), mine.end(), [](const SimRankResult& a, const SimRankResult& b) { return a.rank < b.rank; });
  std::sort(stuck_ranks.begin(), stuck_ranks.end());
  out.ranks = std::move(mine);
  if (oom_.oom) {
    const int st = L_.coords(oom_.rank).stage;
    oom_.op_name = op_name(prog_.stages[st].ops[oom_.op]);
  }
  out.oom = oom_;
  if (stuck) {
    out.deadlock.deadlocked = true;
    out.deadlock.time_ns = last;
    out.deadlock.ranks = stuck_ranks;
    // Every process described up to 8 of its stuck ranks; keep the first 8 overall.
    std::string lines;
    size_t at = 0;
    for (int k = 0; k < 8 && at < desc.size(); ++k) {
      const size_t nl = desc.find('\n', at);
      const size_t e = nl == std::string::npos ? desc.size() : nl + 1;
      lines += desc.substr(at, e - at);
      at = e;
    }
    std::ostringstream os;
    os << "the Program deadlocks: at t=" << last << " ns no op can run, but " << stuck_ranks.size()
       << " of " << W_ << " ranks have unfinished ops:\n"
       << lines;
    if (stuck_ranks.size() > 8) os << "  ... and " << stuck_ranks.size() - 8 << " more ranks\n";
    out.deadlock.message = os.str();
  }
  stats_.setup_s = std::chrono::duration<double>(t1 - t0).count();
  stats_.run_s = std::chrono::duration<double>(t2 - t1).count();
  out.stats = stats_;
  if (trace_) {
    out.trace_ranks = local_ranks_;
    out.trace_ops = std::move(spans_);
    out.trace_memory = std::move(samples_);
  }
  return out;
}

}  // namespace

SimResult simulate(const Program& program, const Layout& layout, const ClusterSpec& cluster,
                   const OpCosts& costs, const SimOptions& options) {
  Sim sim(program, layout, cluster, costs, options);
  return sim.run();
}

}  // namespace stratagem
