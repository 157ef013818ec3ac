// The discrete-event simulator with injected op costs: textbook pipeline times, bandwidth
// sharing, interference, memory peaks, deadlock detection, and single ops against the cost model.
#define BOOST_TEST_MODULE sim_engine
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

#include "stratagem/cost.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"
#include "stratagem/simulate.hpp"

using namespace stratagem;

namespace {

// Costs given by two functions (the simulator calls them once per distinct op at setup).
struct Injected : OpCosts {
  std::function<double(const Op&)> compute = [](const Op&) { return 0.0; };
  std::function<CommCost(const Op&, int rank)> comm = [](const Op&, int) { return CommCost{}; };
  std::function<double(const Op&)> host = [](const Op&) { return 0.0; };
  int64_t ws = 0;
  ProcessMemory process;
  double compute_time_s(const Op& op) const override { return compute(op); }
  double host_issue_time_s(const Op& op) const override { return host(op); }
  CommCost comm_cost(const Op& op, const Layout&, int rank) const override {
    return comm(op, rank);
  }
  int64_t workspace_bytes(int) const override { return ws; }
  ProcessMemory process_memory(int) const override { return process; }
};

ModelSpec tiny_model(int layers = 2) {
  ModelSpec m;
  m.name = "tiny";
  m.layers = layers, m.hidden = 64, m.heads = 2, m.kv_heads = 2, m.ffn_hidden = 256, m.vocab = 128;
  m.seq_len = 32;
  return m;
}

ClusterSpec small_cluster(int gpus_per_node, int nodes) {
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.node.gpus_per_node = gpus_per_node;
  c.nodes = nodes;
  c.node.nic_count = 1;
  c.node.nic.bandwidth_gbps = 25;
  c.node.nic.bus_efficiency = 1.0;
  c.network.oversubscription = 1.0;
  return c;
}

Plan make_plan(const ModelSpec& m, const ClusterSpec& c, int tp, int pp, int dp, int mb, int gb,
               const char* schedule = "1f1b") {
  PlanShorthand s;
  s.tp = tp, s.pp = pp, s.dp = dp, s.micro_batch = mb, s.global_batch = gb;
  s.schedule = std::string(schedule);
  Plan p = expand_shorthand(s, m, c);
  validate(p, m, c, "test");
  return p;
}

SimOptions opts(double interference = 1.0, bool trace = true) {
  SimOptions o;
  o.interference = interference;
  o.record_trace = trace;
  // ctest runs these twice: symmetric where ranks allow (default) and every rank simulated
  // (sim.engine_full sets STRATAGEM_TEST_FULL).
  o.full = std::getenv("STRATAGEM_TEST_FULL") != nullptr;
  return o;
}

// Spans of one rank keyed by op index (first iteration); in a symmetric run, its
// representative's.
std::map<uint32_t, SimOpSpan> spans_of(const SimResult& r, int rank) {
  std::map<uint32_t, SimOpSpan> out;
  const int who = r.trace_rep_of.empty() ? rank : r.trace_rep_of[rank];
  for (size_t i = 0; i < r.trace_ranks.size(); ++i)
    if (r.trace_ranks[i] == who)
      for (const auto& s : r.trace_ops[i])
        if (s.iteration == 0) out[s.op] = s;
  return out;
}

uint32_t add(StageProgram& sp, Op op, std::vector<uint32_t> deps = {}) {
  op.dep_begin = uint32_t(sp.deps.size());
  for (uint32_t d : deps) sp.deps.push_back(d);
  op.dep_count = uint32_t(deps.size());
  sp.ops.push_back(op);
  return uint32_t(sp.ops.size() - 1);
}
Op make_op(OpKind k, Stream s) {
  Op o;
  o.kind = k;
  o.stream = s;
  return o;
}

int64_t ns(double s) {
  return std::llround(s * 1e9);
}

}  // namespace

// ---- pipelines with known op times ----------------------------------------------------------

// Every layer's attention forward costs tf, its backward tb, everything else nothing: with one
// layer per stage a micro-batch costs tf + tb per stage.
Injected textbook_costs(double tf, double tb) {
  Injected c;
  c.compute = [=](const Op& op) {
    if (op.block != Block::attention) return 0.0;
    if (op.phase == Phase::forward) return tf;
    if (op.phase == Phase::backward) return tb;
    return 0.0;
  };
  return c;
}

BOOST_AUTO_TEST_CASE(gpipe_and_1f1b_textbook_iteration_time) {
  const ModelSpec m = tiny_model(2);
  const ClusterSpec c = small_cluster(2, 1);
  const double tf = 1e-3, tb = 2e-3;
  const Injected costs = textbook_costs(tf, tb);
  for (const char* sched : {"gpipe", "1f1b"}) {
    for (int M : {1, 2, 4, 8}) {
      const Plan p = make_plan(m, c, 1, 2, 1, 1, M, sched);
      const Layout L(p, c);
      const Program prog = build_program(m, p);
      const SimResult r = simulate(prog, L, c, costs, opts());
      BOOST_TEST_CONTEXT(sched << " m=" << M) {
        BOOST_TEST(!r.deadlock.deadlocked);
        BOOST_TEST(r.makespan_ns == (M + 2 - 1) * (ns(tf) + ns(tb)));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(four_stage_pipelines_and_iterations) {
  const ModelSpec m = tiny_model(4);
  const ClusterSpec c = small_cluster(4, 1);
  const Injected costs = textbook_costs(1e-3, 2e-3);
  for (const char* sched : {"gpipe", "1f1b"}) {
    const Plan p = make_plan(m, c, 1, 4, 1, 1, 8, sched);
    const Layout L(p, c);
    const Program prog = build_program(m, p);
    SimOptions o = opts();
    const SimResult r1 = simulate(prog, L, c, costs, o);
    BOOST_TEST(r1.makespan_ns == (8 + 4 - 1) * ns(3e-3));
    o.iterations = 3;
    const SimResult r3 = simulate(prog, L, c, costs, o);
    BOOST_TEST(r3.makespan_ns == 3 * r1.makespan_ns);
    BOOST_TEST(r3.stats.ops_executed == 3 * r1.stats.ops_executed);
  }
}

BOOST_AUTO_TEST_CASE(bubble_accounting_sums_to_the_makespan) {
  const ModelSpec m = tiny_model(2);
  const ClusterSpec c = small_cluster(2, 1);
  const Injected costs = textbook_costs(1e-3, 2e-3);
  const Plan p = make_plan(m, c, 1, 2, 1, 1, 4, "gpipe");
  const Layout L(p, c);
  const SimResult r = simulate(build_program(m, p), L, c, costs, opts());
  for (const auto& x : r.ranks) {
    const int64_t sum = x.compute_ns + x.recompute_ns + x.optimizer_ns + x.tp_ns + x.dp_ns +
                        x.pp_ns + x.bubble_ns + x.offload_ns;
    BOOST_TEST(sum == r.makespan_ns);
    BOOST_TEST(x.compute_ns == 4 * ns(3e-3));
    BOOST_TEST(x.bubble_ns == 1 * ns(3e-3));  // (p - 1) (tf + tb)
  }
}

// ---- the framework's host -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(host_issue_paces_the_gpu_only_when_it_is_slower) {
  // One stage of 2 layers: each attention forward costs 1 ms on the GPU, its backward 2 ms,
  // and the host takes h to issue each of them (in program order, from the iteration's start).
  const ModelSpec m = tiny_model(2);
  const ClusterSpec c = small_cluster(1, 1);
  const double tf = 1e-3, tb = 2e-3;
  const int M = 4;
  const Plan p = make_plan(m, c, 1, 1, 1, 1, M);
  const Layout L(p, c);
  const Program prog = build_program(m, p);
  auto run = [&](double h, int iterations) {
    Injected costs = textbook_costs(tf, tb);
    costs.host = [h](const Op& op) {
      return op.block == Block::attention && op.phase != Phase::recompute ? h : 0.0;
    };
    SimOptions o = opts();
    o.iterations = iterations;
    return simulate(prog, L, c, costs, o);
  };
  const int64_t gpu = M * 2 * ns(tf + tb);
  const SimResult none = run(0, 1);
  BOOST_TEST(none.makespan_ns == gpu);
  BOOST_TEST(!none.host_issue);
  BOOST_TEST(none.ranks[0].host_ns == 0);
  // A host faster than the GPU only delays the first kernel.
  const SimResult fast = run(0.5e-3, 1);
  BOOST_TEST(fast.host_issue);
  BOOST_TEST(fast.makespan_ns == ns(0.5e-3) + gpu);
  BOOST_TEST(fast.ranks[0].host_ns == ns(0.5e-3));
  // A host slower than every kernel: each runs as soon as it is issued; the last (a backward)
  // ends 2 ms after the host has issued all 4M of them.
  const double h = 5e-3;
  const SimResult slow = run(h, 1);
  BOOST_TEST(slow.makespan_ns == 4 * M * ns(h) + ns(tb));
  const SimRankResult& x = slow.ranks[0];
  BOOST_TEST(x.compute_ns == gpu);
  BOOST_TEST(x.host_ns == slow.makespan_ns - gpu);
  BOOST_TEST(x.compute_ns + x.recompute_ns + x.optimizer_ns + x.tp_ns + x.dp_ns + x.pp_ns +
                 x.bubble_ns + x.offload_ns + x.ep_ns + x.cp_ns + x.host_ns ==
             slow.makespan_ns);
  // The host begins the next iteration once the rank has finished this one.
  BOOST_TEST(run(h, 3).makespan_ns == 3 * slow.makespan_ns);
}

// ---- memory ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(one_f_one_b_peak_is_lower_by_m_minus_p_microbatches) {
  const ModelSpec m = tiny_model(2);
  const ClusterSpec c = small_cluster(2, 1);
  const Injected costs = textbook_costs(1e-3, 2e-3);
  const int M = 8, pp = 2;
  int64_t peak[2];
  int64_t act_per_mb = -1;
  int i = 0;
  for (const char* sched : {"gpipe", "1f1b"}) {
    const Plan p = make_plan(m, c, 1, pp, 1, 1, M, sched);
    const Layout L(p, c);
    const Program prog = build_program(m, p);
    int64_t act = 0;
    for (const Op& op : prog.stages[0].ops)
      if (op.kind == OpKind::alloc && op.category == MemCategory::activations && op.microbatch == 0)
        act += op.bytes;
    BOOST_TEST(act > 0);
    if (act_per_mb < 0) act_per_mb = act;
    BOOST_TEST(act == act_per_mb);
    const SimResult r = simulate(prog, L, c, costs, opts());
    peak[i++] = r.ranks[0].peak_allocated_bytes;
    BOOST_TEST(r.ranks[0].peak_by_category[int(MemCategory::activations)] ==
               (i == 1 ? M : pp) * act);
  }
  BOOST_TEST(peak[0] - peak[1] == (M - pp) * act_per_mb);
}

BOOST_AUTO_TEST_CASE(device_memory_adds_workspace_process_ledger_and_fragmentation) {
  const ModelSpec m = tiny_model(2);
  ClusterSpec c = small_cluster(2, 1);
  Injected costs = textbook_costs(1e-3, 2e-3);
  costs.ws = 1000;
  costs.process = {
      .cuda_context_bytes = 7000, .nccl_buffers_bytes = 300, .cublas_workspace_bytes = 50};
  const Plan p = make_plan(m, c, 1, 2, 1, 1, 2);
  const Layout L(p, c);
  const SimResult r = simulate(build_program(m, p), L, c, costs, opts());
  for (const auto& x : r.ranks) {
    int64_t cats = 0;
    for (int64_t v : x.peak_by_category) cats += v;
    // allocated = the Program's allocations + workspace (the categories) + cuBLAS; reserved adds
    // the fragmentation of all of it; the device adds the CUDA context and NCCL.
    BOOST_TEST(x.peak_allocated_bytes == cats + 50);
    const int64_t frag = int64_t(c.gpu.allocator_fragmentation * double(x.peak_allocated_bytes));
    BOOST_TEST(x.peak_fragmentation_bytes == frag);
    BOOST_TEST(x.peak_reserved_bytes == x.peak_allocated_bytes + frag);
    BOOST_TEST(x.peak_memory_bytes == x.peak_reserved_bytes + 7000 + 300);
    BOOST_TEST(x.peak_cuda_context_bytes == 7000);
    BOOST_TEST(x.peak_nccl_buffers_bytes == 300);
    BOOST_TEST(x.peak_cublas_workspace_bytes == 50);
    BOOST_TEST(peak_breakdown(x).total_bytes() == x.peak_memory_bytes);
  }
}

// Two gpipe stages whose HBM holds exactly what the Program allocates (no context, no
// fragmentation): the out-of-memory cases below lower it by one byte.
struct OomCase {
  ModelSpec m = tiny_model(2);
  ClusterSpec c = small_cluster(2, 1);
  Injected costs = textbook_costs(1e-3, 2e-3);
  Plan p;
  OomCase() {
    c.gpu.process = {};
    c.gpu.allocator_fragmentation = 0;
    p = make_plan(m, c, 1, 2, 1, 1, 8, "gpipe");
  }
};

BOOST_AUTO_TEST_CASE(out_of_memory_names_rank_op_and_time) {
  OomCase x;
  ClusterSpec& c = x.c;
  const Injected& costs = x.costs;
  const Layout L(x.p, c);
  const Program prog = build_program(x.m, x.p);
  const SimResult ok = simulate(prog, L, c, costs, opts());
  BOOST_TEST(!ok.oom.oom);
  // One byte less than the most-loaded rank needs: it runs out at its peak allocation.
  const SimRankResult* top = &ok.ranks[0];
  for (const auto& x : ok.ranks)
    if (x.peak_memory_bytes > top->peak_memory_bytes ||
        (x.peak_memory_bytes == top->peak_memory_bytes && x.peak_time_ns < top->peak_time_ns))
      top = &x;
  c.gpu.hbm_bytes = top->peak_memory_bytes - 1;
  const SimResult r = simulate(prog, L, c, costs, opts());
  BOOST_TEST(r.oom.oom);
  BOOST_TEST(r.oom.rank == top->rank);
  BOOST_TEST(r.oom.op == top->peak_op);
  BOOST_TEST(r.oom.time_ns == top->peak_time_ns);
  BOOST_TEST(r.oom.bytes > r.oom.hbm_bytes);
  BOOST_TEST(r.oom.op_name.find("alloc") != std::string::npos);
  BOOST_TEST(r.makespan_ns == ok.makespan_ns);  // the run still completes
}

// ---- communication ----------------------------------------------------------------------------

// Two stages on two nodes, each stage's program written by hand.
struct TwoStage {
  ModelSpec m = tiny_model(2);
  ClusterSpec c;
  Plan p;
  std::unique_ptr<Layout> L;
  Program prog;
  TwoStage(int gpus_per_node, int nodes, int dp) : c(small_cluster(gpus_per_node, nodes)) {
    p = make_plan(m, c, 1, 2, dp, 1, dp);
    L = std::make_unique<Layout>(p, c);
    prog.stages.resize(2);
    prog.stages[0].stage = 0;
    prog.stages[1].stage = 1;
    prog.num_microbatches = 1;
  }
};

CommCost inter(double lat, double bytes, double gbps) {
  CommCost cc;
  cc.latency_s = lat;
  cc.link_bytes = bytes;
  cc.bandwidth_gbps = gbps;
  cc.link = LinkClass::inter_node;
  return cc;
}

BOOST_AUTO_TEST_CASE(two_sends_sharing_a_nic_take_twice_as_long) {
  const double lat = 6e-6, bytes = 25e6, gbps = 25;  // 1 ms of data at the NIC's full rate
  Injected costs;
  costs.comm = [&](const Op&, int) { return inter(lat, bytes, gbps); };
  for (int gpn : {1, 2}) {  // 1: every rank has its own NIC; 2: ranks 0 and 1 share one
    TwoStage t(gpn, 4 / gpn, 2);
    Op send = make_op(OpKind::send, Stream::pp_comm);
    send.group = GroupKind::pp_next;
    send.bytes = int64_t(bytes);
    add(t.prog.stages[0], send);
    Op recv = make_op(OpKind::recv, Stream::pp_comm);
    recv.group = GroupKind::pp_prev;
    recv.bytes = int64_t(bytes);
    add(t.prog.stages[1], recv);
    const SimResult r = simulate(t.prog, *t.L, t.c, costs, opts());
    BOOST_TEST(!r.deadlock.deadlocked);
    const int64_t work = ns(lat + bytes / (gbps * 1e9)) - ns(lat);
    for (int rank : {0, 1}) {
      const auto s = spans_of(r, rank).at(0);
      BOOST_TEST_CONTEXT("gpus/node " << gpn << " rank " << rank) {
        BOOST_TEST(s.end_ns - s.start_ns == ns(lat) + (gpn == 2 ? 2 : 1) * work);
        // The receiver completes when the data has arrived.
        BOOST_TEST(spans_of(r, rank + 2).at(0).end_ns == s.end_ns);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(collective_and_send_on_one_nic_slow_each_other) {
  // Ranks 0,1 on node 0 and 2,3 on node 1; the tied-embedding groups {0,2} and {1,3} cross the
  // nodes. Each transfer alone takes half of the NIC: two fit, four share it two-to-one.
  const double lat = 6e-6, bytes = 12.5e6, gbps = 12.5;
  Injected costs;
  costs.comm = [&](const Op&, int) { return inter(lat, bytes, gbps); };
  const int64_t work = ns(lat + bytes / (gbps * 1e9)) - ns(lat);
  for (bool with_send : {false, true}) {
    TwoStage t(2, 2, 2);
    for (int s = 0; s < 2; ++s) {
      Op ar = make_op(OpKind::collective, Stream::dp_comm);
      ar.collective = Collective::all_reduce;
      ar.group = GroupKind::tied_embedding;
      ar.bytes = int64_t(bytes);
      add(t.prog.stages[s], ar);
    }
    if (with_send) {
      Op send = make_op(OpKind::send, Stream::pp_comm);
      send.group = GroupKind::pp_next;
      send.bytes = int64_t(bytes);
      add(t.prog.stages[0], send);
      Op recv = make_op(OpKind::recv, Stream::pp_comm);
      recv.group = GroupKind::pp_prev;
      add(t.prog.stages[1], recv);
    }
    const SimResult r = simulate(t.prog, *t.L, t.c, costs, opts());
    const auto s0 = spans_of(r, 0);
    BOOST_TEST_CONTEXT("with send " << with_send) {
      BOOST_TEST(s0.at(0).end_ns - s0.at(0).start_ns == ns(lat) + (with_send ? 2 : 1) * work);
      if (with_send) BOOST_TEST(s0.at(1).end_ns - s0.at(1).start_ns == ns(lat) + 2 * work);
      // Members finish together.
      BOOST_TEST(spans_of(r, 2).at(0).end_ns == s0.at(0).end_ns);
    }
  }
}

BOOST_AUTO_TEST_CASE(collective_starts_when_the_last_member_arrives) {
  TwoStage t(1, 4, 2);  // one GPU per node: the transfers do not share a NIC
  Injected costs;
  costs.compute = [](const Op&) { return 100e-6; };
  costs.comm = [](const Op&, int) { return inter(10e-6, 25e3, 25); };
  Op comp = make_op(OpKind::compute, Stream::compute);
  const uint32_t c0 = add(t.prog.stages[0], comp);
  Op ar = make_op(OpKind::collective, Stream::dp_comm);
  ar.collective = Collective::all_reduce;
  ar.group = GroupKind::tied_embedding;
  ar.bytes = 25000;
  add(t.prog.stages[0], ar, {c0});
  add(t.prog.stages[1], ar);
  const SimResult r = simulate(t.prog, *t.L, t.c, costs, opts());
  const int64_t total = ns(10e-6 + 25e3 / 25e9);
  BOOST_TEST(spans_of(r, 0).at(1).start_ns == ns(100e-6));
  BOOST_TEST(spans_of(r, 0).at(1).end_ns == ns(100e-6) + total);
  BOOST_TEST(spans_of(r, 2).at(0).start_ns == 0);
  BOOST_TEST(spans_of(r, 2).at(0).end_ns == ns(100e-6) + total);
}

BOOST_AUTO_TEST_CASE(compute_overlapping_communication_is_slowed) {
  TwoStage t(2, 2, 2);
  const double D = 1e-3;
  Injected costs;
  costs.compute = [&](const Op&) { return D; };
  costs.comm = [](const Op&, int) { return inter(3e-6, 50e6, 25); };  // 2 ms of data
  add(t.prog.stages[0], make_op(OpKind::compute, Stream::compute));
  Op send = make_op(OpKind::send, Stream::pp_comm);
  send.group = GroupKind::pp_next;
  add(t.prog.stages[0], send);
  Op recv = make_op(OpKind::recv, Stream::pp_comm);
  recv.group = GroupKind::pp_prev;
  add(t.prog.stages[1], recv);
  for (double f : {1.0, 1.15, 1.3}) {
    const SimResult r = simulate(t.prog, *t.L, t.c, costs, opts(f));
    const auto s = spans_of(r, 0).at(0);
    const int64_t head = ns(3e-6) - ns(3e-6) / 3;  // data starts moving after the head latency
    const double expect = double(head) + (double(ns(D)) - double(head)) * f;
    BOOST_TEST_CONTEXT("factor " << f) {
      BOOST_TEST(std::abs(double(s.end_ns) - expect) <= 1e-4 * expect);
    }
  }
}

// Both stages receive before they send: each waits for the other.
void add_receive_before_send(TwoStage& t) {
  for (int s = 0; s < 2; ++s) {
    Op recv = make_op(OpKind::recv, Stream::pp_comm);
    recv.group = s == 0 ? GroupKind::pp_next : GroupKind::pp_prev;
    recv.bytes = 1000;
    const uint32_t r0 = add(t.prog.stages[s], recv);
    Op send = recv;
    send.kind = OpKind::send;
    add(t.prog.stages[s], send, {r0});
  }
}

// ---- bad programs -----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(deadlocked_program_is_detected_and_named) {
  TwoStage t(2, 2, 2);
  Injected costs;
  costs.comm = [](const Op&, int) { return inter(5e-6, 1e3, 25); };
  add_receive_before_send(t);
  const SimResult r = simulate(t.prog, *t.L, t.c, costs, opts());
  BOOST_TEST(r.deadlock.deadlocked);
  BOOST_TEST(r.deadlock.ranks == std::vector<int>({0, 1, 2, 3}));
  BOOST_TEST(r.deadlock.message.find("rank 0 (stage 0)") != std::string::npos);
  BOOST_TEST(r.deadlock.message.find("recv") != std::string::npos);
  BOOST_TEST(r.deadlock.message.find("from rank 2") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(collective_missing_a_member_is_a_deadlock) {
  TwoStage t(2, 2, 2);
  Injected costs;
  Op ar = make_op(OpKind::collective, Stream::dp_comm);
  ar.collective = Collective::all_reduce;
  ar.group = GroupKind::tied_embedding;
  add(t.prog.stages[0], ar);  // stage 1 never joins
  const SimResult r = simulate(t.prog, *t.L, t.c, costs, opts());
  BOOST_TEST(r.deadlock.deadlocked);
  BOOST_TEST(r.deadlock.ranks == std::vector<int>({0, 1}));
  BOOST_TEST(r.deadlock.message.find("1 of 2 arrived") != std::string::npos);
}

// ---- against the cost model -------------------------------------------------------------------

// Each kind of op alone on every rank takes exactly the cost model's time.
BOOST_AUTO_TEST_CASE(single_ops_match_the_cost_model_exactly) {
  const ModelSpec m = load_model("gpt2-350m");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 2;
  PlanShorthand sh;
  sh.tp = 4, sh.pp = 2, sh.dp = 2, sh.micro_batch = 2, sh.global_batch = 8;
  sh.offload = std::string("activations");
  const Plan p = expand_shorthand(sh, m, c);
  validate(p, m, c, "test");
  const Layout L(p, c);
  const Program full = build_program(m, p);
  const CostModel cost(m, c, p.dtype);
  const CostModelCosts costs(cost, p);
  auto first = [&](OpKind k, int stage) {
    for (const Op& op : full.stages[stage].ops)
      if (op.kind == k) return op;
    BOOST_FAIL("no such op");
    return Op{};
  };
  for (OpKind k : {OpKind::compute, OpKind::collective, OpKind::copy_d2h}) {
    Program prog;
    prog.stages.resize(2);
    for (int s = 0; s < 2; ++s) {
      Op op = first(k, s);
      op.dep_begin = op.dep_count = 0;
      add(prog.stages[s], op);
    }
    const SimResult r = simulate(prog, L, c, costs, opts(1.15));
    for (int rank = 0; rank < L.world_size(); ++rank) {
      const Op& op = prog.stages[L.coords(rank).stage].ops[0];
      const auto s = spans_of(r, rank).at(0);
      BOOST_TEST_CONTEXT(to_string(k) << " rank " << rank) {
        BOOST_TEST(s.end_ns - s.start_ns == ns(cost.op_time_s(op, L, rank)));
      }
    }
  }
  // A pipeline send and its receive (stage 0 and stage 1 are on different nodes here).
  Program prog;
  prog.stages.resize(2);
  Op send = first(OpKind::send, 0);
  send.dep_begin = send.dep_count = 0;
  add(prog.stages[0], send);
  Op recv = first(OpKind::recv, 1);
  recv.dep_begin = recv.dep_count = 0;
  add(prog.stages[1], recv);
  const SimResult r = simulate(prog, L, c, costs, opts(1.15));
  for (int rank = 0; rank < 8; ++rank) {
    const auto s = spans_of(r, rank).at(0);
    BOOST_TEST(s.end_ns - s.start_ns == ns(cost.op_time_s(send, L, rank)));
    BOOST_TEST(spans_of(r, rank + 8).at(0).end_ns == s.end_ns);
  }
}

BOOST_AUTO_TEST_CASE(real_program_with_the_cost_model_runs_and_accounts) {
  const ModelSpec m = load_model("gpt2-350m");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 2;
  for (const char* sched : {"gpipe", "1f1b", "interleaved"}) {
    PlanShorthand sh;
    sh.tp = 2, sh.pp = 4, sh.dp = 2, sh.micro_batch = 1, sh.global_batch = 16;
    sh.schedule = std::string(sched);
    if (std::string(sched) == "interleaved") sh.vpp = 2;
    sh.zero = 1;
    const Plan p = expand_shorthand(sh, m, c);
    validate(p, m, c, "test");
    const Layout L(p, c);
    const CostModel cost(m, c, p.dtype);
    const SimResult r =
        simulate(build_program(m, p), L, c, CostModelCosts(cost, p), opts(0, false));
    BOOST_TEST_CONTEXT(sched) {
      BOOST_TEST(!r.deadlock.deadlocked, r.deadlock.message);
      BOOST_TEST(r.makespan_ns > 0);
      BOOST_TEST(r.ranks.size() == 16u);
      for (const auto& x : r.ranks) {
        const int64_t sum = x.compute_ns + x.recompute_ns + x.optimizer_ns + x.tp_ns + x.dp_ns +
                            x.pp_ns + x.bubble_ns + x.offload_ns;
        BOOST_TEST(sum == r.makespan_ns);
      }
    }
  }
}

// ---- simulate_consuming: the same figures with the Program freed at setup ----------------------

namespace {
void same_figures(const SimResult& a, const SimResult& b) {
  BOOST_TEST(a.makespan_ns == b.makespan_ns);
  BOOST_TEST(a.iterations == b.iterations);
  BOOST_TEST(a.stats.symmetric == b.stats.symmetric);
  BOOST_TEST(a.stats.ops_executed == b.stats.ops_executed);
  BOOST_TEST(a.oom.oom == b.oom.oom);
  BOOST_TEST(a.oom.op == b.oom.op);
  BOOST_TEST(a.oom.time_ns == b.oom.time_ns);
  BOOST_TEST(a.deadlock.deadlocked == b.deadlock.deadlocked);
  BOOST_TEST_REQUIRE(a.ranks.size() == b.ranks.size());
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    const SimRankResult &x = a.ranks[i], &y = b.ranks[i];
    BOOST_TEST_CONTEXT("rank " << i) {
      BOOST_TEST(x.peak_memory_bytes == y.peak_memory_bytes);
      BOOST_TEST(x.peak_op == y.peak_op);
      BOOST_TEST(x.peak_time_ns == y.peak_time_ns);
      BOOST_TEST(x.end_ns == y.end_ns);
      BOOST_TEST(x.compute_ns == y.compute_ns);
      BOOST_TEST(x.bubble_ns == y.bubble_ns);
      BOOST_TEST(x.dp_ns == y.dp_ns);
      BOOST_TEST(x.offload_ns == y.offload_ns);
      BOOST_TEST(x.ops_executed == y.ops_executed);
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(consuming_simulation_gives_the_same_figures_and_frees_the_ops) {
  const ModelSpec m = load_model("gpt2-350m");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 2;
  struct Case {
    const char* sched;
    int tp, pp, dp, vpp, zero;
    const char* offload;
  };
  const Case cases[] = {{"1f1b", 2, 4, 2, 1, 1, ""},
                        {"interleaved", 2, 4, 2, 2, 0, ""},
                        {"gpipe", 4, 2, 2, 1, 0, ""},
                        {"1f1b", 1, 1, 16, 1, 3, "optimizer,params"}};
  for (const Case& k : cases) {
    PlanShorthand sh;
    sh.tp = k.tp, sh.pp = k.pp, sh.dp = k.dp, sh.micro_batch = 1, sh.global_batch = 32;
    sh.schedule = std::string(k.sched);
    if (k.vpp > 1) sh.vpp = k.vpp;
    sh.zero = k.zero;
    if (*k.offload) sh.offload = std::string(k.offload);
    const Plan p = expand_shorthand(sh, m, c);
    validate(p, m, c, "test");
    const Layout L(p, c);
    const CostModel cost(m, c, p.dtype);
    const CostModelCosts costs(cost, p);
    for (bool full : {false, true}) {
      SimOptions o = opts(0, false);
      o.full = full;
      const SimResult ref = simulate(build_program(m, p), L, c, costs, o);
      Program prog = build_program(m, p);
      const SimResult r = simulate_consuming(std::move(prog), L, c, costs, o);
      BOOST_TEST_CONTEXT(k.sched << " tp" << k.tp << " pp" << k.pp << " z" << k.zero
                                 << (full ? " full" : " symmetric")) {
        BOOST_TEST(!ref.deadlock.deadlocked);
        same_figures(ref, r);
        for (const auto& sp : prog.stages) BOOST_TEST(sp.ops.empty());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(consuming_simulation_reports_oom_and_deadlock_without_op_names) {
  OomCase x;
  const ModelSpec& m = x.m;
  ClusterSpec& c = x.c;
  const Injected& costs = x.costs;
  const Plan& p = x.p;
  const Layout L(p, c);
  const SimResult ok = simulate(build_program(m, p), L, c, costs, opts(1.0, false));
  c.gpu.hbm_bytes = ok.ranks[0].peak_memory_bytes - 1;
  const SimResult ref = simulate(build_program(m, p), L, c, costs, opts(1.0, false));
  const SimResult r = simulate_consuming(build_program(m, p), L, c, costs, opts(1.0, false));
  BOOST_TEST(ref.oom.oom);
  same_figures(ref, r);
  BOOST_TEST(r.oom.op_name == "op " + std::to_string(r.oom.op) + " of stage " +
                                  std::to_string(L.coords(r.oom.rank).stage));

  TwoStage t(2, 2, 2);
  Injected cc;
  cc.comm = [](const Op&, int) { return inter(5e-6, 1e3, 25); };
  add_receive_before_send(t);
  const SimResult d = simulate_consuming(std::move(t.prog), *t.L, t.c, cc, opts(1.0, false));
  BOOST_TEST(d.deadlock.deadlocked);
  BOOST_TEST(
      d.deadlock.message.find("rank 0 (stage 0): pp_comm stream at op 0") != std::string::npos,
      d.deadlock.message);
}
