// Context parallelism: the plan's validation, the Layout's cp and dp-with-cp groups, the
// Program's ops of each kind (counts, bytes, matching), and the cost of the split attention.
#define BOOST_TEST_MODULE context_parallel
#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "src/cost/cp_cost.hpp"
#include "src/search/layer_costs.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"
#include "test/support/cli_json.hpp"
#include "test/support/input_error.hpp"

using namespace stratagem;
using stratagem::test::input_error;

namespace {
ModelSpec tiny_llama() {
  ModelSpec m;
  m.name = "tiny";
  m.layers = 4, m.hidden = 256, m.heads = 8, m.kv_heads = 4, m.ffn_hidden = 512;
  m.vocab = 1000, m.seq_len = 256;
  m.position = Position::rope, m.activation = Activation::swiglu, m.norm = Norm::rmsnorm;
  m.tied_embeddings = false, m.bias = false, m.dropout = false;
  return m;
}

ClusterSpec nodes(int n) {
  ClusterSpec c = load_cluster("dgx-h100");
  c.nodes = n;
  return c;
}

Plan cp_plan(const ModelSpec& m, const ClusterSpec& c, int tp, int cp, int pp, const char* kind,
             int global_batch = 8) {
  PlanShorthand s;
  s.tp = tp, s.cp = cp, s.pp = pp;
  // A kind names how a split moves K and V: --cp-kind with cp 1 is refused.
  if (cp > 1) s.cp_kind = kind;
  s.micro_batch = 1, s.global_batch = global_batch;
  s.flash_attention = true;
  return expand_shorthand(s, m, c);
}

std::string check(const Plan& p, const ModelSpec& m, const ClusterSpec& c) {
  return input_error([&] { validate(p, m, c, "plan"); });
}
}  // namespace

BOOST_AUTO_TEST_CASE(shorthand_and_describe) {
  const ModelSpec m = tiny_llama();
  const ClusterSpec c = nodes(2);
  const Plan p = cp_plan(m, c, 2, 4, 1, "allgather");
  BOOST_TEST(p.layers.front().cp == 4);
  BOOST_TEST(p.layers.front().dp == 2);  // 16 GPUs / (tp 2 x cp 4)
  BOOST_TEST(p.devices_per_stage() == 16);
  BOOST_TEST(p.layers.front().dp_cp() == 8);
  BOOST_TEST(p.describe().find("tp2 cp4-allgather dp2") != std::string::npos, p.describe());
  BOOST_TEST(check(p, m, c) == "");
  PlanShorthand s;
  s.cp_kind = "ulysses";
  BOOST_TEST(input_error([&] { expand_shorthand(s, m, c); }).find("--cp-kind") == 0);
  // A kind without a split (issue 41: accepted with exit 0).
  s.cp_kind = "a2a";
  BOOST_TEST(input_error([&] { expand_shorthand(s, m, c); }).find("--cp-kind: ") == 0);
  s.cp = 1;
  BOOST_TEST(input_error([&] { expand_shorthand(s, m, c); }).find("--cp 1 turns it off") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(validation_names_the_field) {
  ModelSpec m = tiny_llama();
  const ClusterSpec c = nodes(1);
  // ring: 200 tokens are not 2 x cp = 16 equal chunks (but 8 equal pieces for allgather).
  m.seq_len = 200;
  std::string e = check(cp_plan(m, c, 1, 8, 1, "ring"), m, c);
  BOOST_TEST(e.find("plan: embedding.cp: the ring cuts the sequence into 2 x cp = 16") == 0, e);
  BOOST_TEST(check(cp_plan(m, c, 1, 8, 1, "allgather"), m, c) == "");  // 200 / 8 = 25
  m = tiny_llama();
  // a2a: kv_heads 4 over cp x tp = 8 ranks.
  e = check(cp_plan(m, c, 1, 8, 1, "a2a"), m, c);
  BOOST_TEST(e.find("embedding.cp_kind: a2a splits heads over cp x tp = 8 ranks, which do not "
                    "divide kv_heads (4)") != std::string::npos,
             e);
  BOOST_TEST(check(cp_plan(m, c, 2, 2, 1, "a2a"), m, c) == "");
  // MLA's attention is not split.
  ModelSpec mla = m;
  mla.attention = AttentionKind::mla;
  e = check(cp_plan(mla, c, 1, 2, 1, "ring"), mla, c);
  BOOST_TEST(e.find("embedding.cp: context parallelism of MLA attention") != std::string::npos, e);
  // One cp through the stage.
  Plan p = cp_plan(m, c, 1, 2, 1, "ring");
  p.layers[2].cp = 4, p.layers[2].dp = 2;
  e = check(p, m, c);
  BOOST_TEST(e.find("layers[2].cp: cp 4 differs from the embedding's cp 2") != std::string::npos,
             e);
  // tp x cp x dp must fill the stage.
  p = cp_plan(m, c, 1, 2, 1, "ring");
  p.layers[1].dp = 2;
  e = check(p, m, c);
  BOOST_TEST(e.find("layers[1]: tp x cp x dp = 4 but the stage has 8 devices") != std::string::npos,
             e);
  // Selective recompute without flash attention.
  p = cp_plan(m, c, 1, 2, 1, "ring");
  p.flash_attention = false;
  for (auto& l : p.layers) l.recompute = Recompute::selective;
  e = check(p, m, c);
  BOOST_TEST(e.find("layers[0].recompute: selective recompute with cp > 1 needs "
                    "flash_attention") != std::string::npos,
             e);
}

BOOST_AUTO_TEST_CASE(layout_cp_groups_sit_between_tp_and_dp) {
  const ModelSpec m = tiny_llama();
  const ClusterSpec c = nodes(4);                 // 32 GPUs
  const Plan p = cp_plan(m, c, 2, 4, 2, "ring");  // dp 2
  const Layout L(p, c);
  BOOST_TEST(L.cp() == 4);
  const int tp = 2, cp = 4, dp = 2, D = 16;
  for (int r = 0; r < L.world_size(); ++r) {
    const int local = r % D, stage = r / D;
    const int t = local % tp, ci = (local / tp) % cp, d = local / (tp * cp);
    BOOST_TEST(L.cp_index(local, tp) == ci);
    // cp group: equal (t, d), cp index 0..cp-1 in order.
    const auto& g = L.group(L.cp_group(r, tp));
    BOOST_TEST((g.kind == GroupKind::cp));
    BOOST_TEST(int(g.ranks.size()) == cp);
    for (int k = 0; k < cp; ++k) BOOST_TEST(g.ranks[k] == stage * D + t + tp * (k + cp * d));
    // dp group: equal t, all cp x dp ranks (the data-parallel group with context parallel).
    const auto& dg = L.group(L.dp_group(r, tp));
    BOOST_TEST(int(dg.ranks.size()) == cp * dp);
    for (int q : dg.ranks) BOOST_TEST(q % D % tp == t);
    // tp group: unchanged, tp consecutive ranks.
    const auto& tg = L.group(L.tp_group(r, tp));
    BOOST_TEST(tg.ranks.front() == r - t);
    // Ring neighbours.
    BOOST_TEST(L.cp_next_rank(r, tp) == stage * D + t + tp * ((ci + 1) % cp + cp * d));
    BOOST_TEST(L.cp_prev_rank(r, tp) == stage * D + t + tp * ((ci + cp - 1) % cp + cp * d));
  }
  // Every rank is in exactly one cp group.
  std::map<int, int> seen;
  for (const auto& g : L.groups())
    if (g.kind == GroupKind::cp)
      for (int q : g.ranks) seen[q]++;
  BOOST_TEST(int(seen.size()) == L.world_size());
  for (auto& [q, n] : seen) BOOST_TEST(n == 1);
  // No cp groups at cp 1: a plan without cp keeps its group ids.
  const Plan flat = cp_plan(m, c, 2, 1, 2, "ring");
  const Layout flat_layout(flat, c);
  for (const auto& g : flat_layout.groups()) BOOST_TEST((g.kind != GroupKind::cp));
}

namespace {
struct OpCounts {
  std::map<std::tuple<int, int, int>, int> ops;  // (kind, phase, part) of layer 0, mb 0
  std::map<std::tuple<int, int, int>, int64_t> bytes;
};
OpCounts layer0_ops(const Program& prog) {
  OpCounts c;
  for (const Op& op : prog.stages[0].ops) {
    if (op.layer != 0 || op.microbatch != 0 || op.block != Block::attention) continue;
    if (op.kind == OpKind::alloc || op.kind == OpKind::free || op.group == GroupKind::tp) continue;
    const int sub = op.kind == OpKind::collective ? 10 + int(op.collective) : int(op.part);
    c.ops[{int(op.kind), int(op.phase), sub}]++;
    c.bytes[{int(op.kind), int(op.phase), sub}] = op.bytes;
    if (op.stream != Stream::compute) BOOST_TEST((op.stream == Stream::cp_comm));
  }
  return c;
}
constexpr int kCompute = int(OpKind::compute), kSend = int(OpKind::send), kRecv = int(OpKind::recv),
              kColl = int(OpKind::collective);
constexpr int kFwd = int(Phase::forward), kBwd = int(Phase::backward), kRe = int(Phase::recompute);
constexpr int kPre = int(AttentionPart::pre), kCore = int(AttentionPart::core),
              kPost = int(AttentionPart::post);
}  // namespace

BOOST_AUTO_TEST_CASE(program_ops_of_each_kind) {
  const ModelSpec m = tiny_llama();
  const ClusterSpec c = nodes(1);
  const int cp = 4, tp = 2;
  // One rank's K and V: 2 bytes x (256 / 4 tokens) x 2 x kv_hidden 128 / tp 2.
  const int64_t kv = 2 * (256 / cp) * 2 * 128 / tp;
  {
    Plan p = cp_plan(m, c, tp, cp, 1, "ring");
    for (auto& l : p.layers) l.recompute = Recompute::full;
    const OpCounts o = layer0_ops(build_program(m, p));
    for (int ph : {kFwd, kRe, kBwd}) {
      BOOST_TEST(o.ops.at({kCompute, ph, kPre}) == 1);
      BOOST_TEST(o.ops.at({kCompute, ph, kPost}) == 1);
      BOOST_TEST(o.ops.at({kCompute, ph, kCore}) == cp);
      BOOST_TEST(o.ops.at({kSend, ph, kPre}) == cp - 1);  // K, V blocks
      BOOST_TEST(o.ops.at({kRecv, ph, kPre}) == cp - 1);
      BOOST_TEST(o.bytes.at({kSend, ph, kPre}) == kv);
    }
    BOOST_TEST(o.ops.at({kSend, kBwd, kCore}) == cp);  // dK, dV accumulators
    BOOST_TEST(o.ops.at({kRecv, kBwd, kCore}) == cp);
    BOOST_TEST(o.bytes.at({kSend, kBwd, kCore}) == kv);
    BOOST_TEST(o.ops.count({kSend, kFwd, kCore}) == 0);
  }
  {
    const OpCounts o = layer0_ops(build_program(m, cp_plan(m, c, tp, cp, 1, "allgather")));
    const int ag = 10 + int(Collective::all_gather), rs = 10 + int(Collective::reduce_scatter);
    BOOST_TEST(o.ops.at({kCompute, kFwd, kCore}) == 1);
    BOOST_TEST(o.ops.at({kColl, kFwd, ag}) == 1);
    BOOST_TEST(o.bytes.at({kColl, kFwd, ag}) == cp * kv);
    BOOST_TEST(o.ops.at({kColl, kBwd, ag}) == 1);
    BOOST_TEST(o.ops.at({kColl, kBwd, rs}) == 1);
    BOOST_TEST(o.bytes.at({kColl, kBwd, rs}) == cp * kv);
    BOOST_TEST(o.ops.count({kSend, kFwd, kPre}) == 0);
  }
  {
    const OpCounts o = layer0_ops(build_program(m, cp_plan(m, c, tp, cp / 2, 1, "a2a")));
    const int a2a = 10 + int(Collective::all_to_all);
    const int64_t tokens = 256 / (cp / 2);
    const int64_t qkv = 2 * tokens * (256 + 2 * 128) / tp, out = 2 * tokens * 256 / tp;
    BOOST_TEST(o.ops.at({kColl, kFwd, a2a}) == 2);
    BOOST_TEST(o.ops.at({kColl, kBwd, a2a}) == 2);
    const CpComm f =
        cp_comm(m, cp_plan(m, c, tp, cp / 2, 1, "a2a").layers[0], 1, Phase::forward, Dtype::bf16);
    BOOST_TEST(f.before_bytes == qkv);
    BOOST_TEST(f.after_bytes == out);
  }
}

// Every cp send meets its recv in order, every cp collective is issued by all its members in
// the same sequence, on each kind, beside pipeline and data parallelism.
BOOST_AUTO_TEST_CASE(program_cp_transfers_match) {
  const ModelSpec m = tiny_llama();
  const ClusterSpec c = nodes(2);
  for (const char* kind : {"ring", "allgather", "a2a"}) {
    BOOST_TEST_CONTEXT(kind) {
      Plan p = cp_plan(m, c, 2, 2, 2, kind, 16);  // dp 2
      for (auto& l : p.layers) l.zero = 1;
      p.embedding.zero = 1;
      BOOST_TEST(check(p, m, c) == "");
      const Layout L(p, c);
      const Program prog = build_program(m, p);
      std::map<std::pair<int, int>, std::vector<std::tuple<int64_t, int, int, int>>> sends, recvs;
      std::map<int, std::map<int, std::vector<std::pair<int, int64_t>>>> colls;
      for (int r = 0; r < L.world_size(); ++r) {
        for (const Op& op : prog.stages[L.coords(r).stage].ops) {
          const auto key = std::make_tuple(op.bytes, op.microbatch, int(op.phase), op.cp_step);
          if (op.kind == OpKind::send) sends[{r, resolve_peer(L, r, op)}].push_back(key);
          if (op.kind == OpKind::recv) recvs[{resolve_peer(L, r, op), r}].push_back(key);
          if (op.kind == OpKind::collective) {
            const int g = resolve_group(L, r, op);
            BOOST_REQUIRE(g >= 0);
            colls[g][r].push_back({int(op.collective), op.bytes});
          }
        }
      }
      BOOST_TEST(sends.size() == recvs.size());
      for (auto& [pair, seq] : sends)
        BOOST_TEST((seq == recvs[pair]), "send/recv order " << pair.first << "->" << pair.second);
      for (auto& [g, members] : colls) {
        BOOST_TEST(members.size() == L.group(g).ranks.size());
        for (auto& [r, seq] : members) BOOST_TEST((seq == members.begin()->second));
      }
    }
  }
}

// The split attention is the whole block's work: FLOPs of the parts sum to forward_work's, and
// a cp rank does 1 / cp of the full-length attention.
BOOST_AUTO_TEST_CASE(attention_parts_sum_to_the_block) {
  const ModelSpec m = tiny_llama();
  for (const char* kind : {"ring", "allgather", "a2a"}) {
    LayerStrategy s;
    s.tp = 2, s.cp = 2, s.cp_kind = cp_kind_from(kind, "test");
    for (bool flash : {false, true}) {
      const BlockWork whole = forward_work(m, s, Block::attention, 2, flash);
      double flops = 0, bytes = 0;
      int kernels = 0;
      for (AttentionPart part : {AttentionPart::pre, AttentionPart::core, AttentionPart::post}) {
        const int n = part == AttentionPart::core ? cp_core_steps(s) : 1;
        const BlockWork w = attention_part_work(m, s, part, 2, flash);
        flops += n * w.flops(), bytes += n * w.elementwise_bytes, kernels += n * w.kernels;
      }
      BOOST_TEST(flops == whole.flops(), boost::test_tools::tolerance(1e-12));
      BOOST_TEST(bytes == whole.elementwise_bytes, boost::test_tools::tolerance(1e-12));
      const int core_kernels = attention_core_work(m, s, 2, flash).kernels;
      BOOST_TEST(kernels == whole.kernels + (cp_core_steps(s) - 1) * core_kernels);
    }
    LayerStrategy one = s;
    one.cp = 1;
    const double full = attention_core_work(m, one, 2, true).attention_flops;
    BOOST_TEST(attention_core_work(m, s, 2, true).attention_flops * s.cp == full,
               boost::test_tools::tolerance(1e-12));
  }
}

// The cost model prices each part; the ring's steps and pre, post add up to the whole block.
BOOST_AUTO_TEST_CASE(cost_of_the_parts) {
  const ModelSpec m = tiny_llama();
  const ClusterSpec c = nodes(1);
  const Plan p = cp_plan(m, c, 2, 4, 1, "ring");
  const CostModel cost(m, c, p.dtype);
  const Program prog = build_program(m, p);
  double parts_fwd = 0;
  for (const Op& op : prog.stages[0].ops)
    if (op.kind == OpKind::compute && op.layer == 0 && op.microbatch == 0 &&
        op.phase == Phase::forward && op.block == Block::attention) {
      BOOST_TEST((op.part != AttentionPart::whole));
      parts_fwd += cost.compute_time_s(op);
    }
  const double whole =
      cost.block_time_s(forward_work(m, p.layers[0], Block::attention, 1, p.flash_attention));
  // The parts launch cp - 1 more attention kernels than the whole block.
  const double launches = (4 - 1) * c.gpu.kernel_launch_s;
  BOOST_TEST(parts_fwd == whole + launches, boost::test_tools::tolerance(1e-9));
}

// The search's candidates under a context group: one tp, sequence parallelism, the kinds the
// model allows; and its default cp degrees keep a rank at 8,192 tokens or more.
BOOST_AUTO_TEST_CASE(search_candidates_under_cp) {
  ModelSpec m = tiny_llama();
  m.seq_len = 65536;
  const ClusterSpec c = nodes(2);
  BOOST_TEST((search_detail::cp_degrees_for(m, c, {}) == std::vector<int>{2, 4, 8}));
  BOOST_TEST((search_detail::cp_degrees_for(m, c, {1}).empty()));
  search_detail::SpaceFilter f;
  f.cp = 4, f.cp_tp = 2, f.flash_attention = false;
  const auto cands = search_detail::layer_candidates(m, c, 16, 4, f);
  BOOST_TEST(!cands.empty());
  std::set<int> kinds;
  for (const auto& s : cands) {
    BOOST_TEST(s.cp == 4);
    BOOST_TEST(s.tp == 2);
    BOOST_TEST(s.dp == 2);
    BOOST_TEST(s.sequence_parallel);
    BOOST_TEST((s.recompute != Recompute::selective));  // no flash attention
    kinds.insert(int(s.cp_kind));
  }
  // kv_heads 4 do not split over cp x tp = 8 ranks: no a2a.
  BOOST_TEST((kinds == std::set<int>{int(CpKind::ring), int(CpKind::allgather)}));
}

using stratagem::test::run_json;

// The estimator's closed form and the simulator's run of the Program agree on each kind: the
// same memory per category, iteration time and exposed cp time within a few percent; both
// report cp_comm, the simulator also exposed_comm_s.cp; a plan without cp reports neither.
BOOST_AUTO_TEST_CASE(estimator_and_simulator_agree_on_each_kind) {
  const std::string plan =
      "--model llama3-8b --seq-len 32768 --cluster dgx-h100 --nodes 1 --tp 2 --cp 4 "
      "--sequence-parallel --recompute full --flash-attention --micro-batch 1 --global-batch 4 "
      "--cp-kind ";
  for (const char* kind : {"ring", "allgather", "a2a"}) {
    BOOST_TEST_CONTEXT(kind) {
      const nlohmann::json e = run_json("estimate " + plan + kind);
      const nlohmann::json s = run_json("simulate " + plan + kind);
      BOOST_TEST(e["memory_breakdown_bytes"] == s["memory_breakdown_bytes"]);
      const double te = e["iteration_time_s"], ts = s["iteration_time_s"];
      BOOST_TEST(std::abs(te - ts) / ts <= 0.03, te << " s estimated, " << ts << " s simulated");
      BOOST_TEST(e["time_breakdown_s"].contains("cp_comm"));
      BOOST_TEST(s["time_breakdown_s"].contains("cp_comm"));
      BOOST_TEST(s["exposed_comm_s"].contains("cp"));
      BOOST_TEST(s["time_breakdown_s"]["cp_comm"].get<double>() >= 0);
    }
  }
  const nlohmann::json flat =
      run_json("simulate --model gpt2-124m --cluster dgx-h100 --nodes 1 --global-batch 8");
  BOOST_TEST(!flat["time_breakdown_s"].contains("cp_comm"));
  BOOST_TEST(!flat["exposed_comm_s"].contains("cp"));
}

// The closed form's exposed cp time per kind, from the cost model's prices of the ops.
BOOST_AUTO_TEST_CASE(closed_form_cp_cost) {
  const ModelSpec m = tiny_llama();
  const ClusterSpec c = nodes(2);
  for (const char* kind : {"ring", "allgather", "a2a"}) {
    BOOST_TEST_CONTEXT(kind) {
      const Plan p = cp_plan(m, c, 2, 2, 1, kind, 8);
      const CostModel cost(m, c, p.dtype);
      const LayerStrategy& s = p.layers.front();
      const CpComm f = cp_comm(m, s, 1, Phase::forward, p.dtype);
      const CpComm b = cp_comm(m, s, 1, Phase::backward, p.dtype);
      const cost_detail::CpCost x = cost_detail::cp_cost(cost, s, 1, 2, p.flash_attention);
      auto coll = [&](Collective k, int64_t bytes) {
        return cost.fabric().collective_cost(k, bytes, s.cp, 2).time_s();
      };
      if (s.cp_kind == CpKind::allgather) {
        BOOST_TEST(x.fwd_s == coll(Collective::all_gather, f.before_bytes));
        BOOST_TEST(x.bwd_s >= coll(Collective::reduce_scatter, b.after_bytes));
      } else if (s.cp_kind == CpKind::a2a) {
        BOOST_TEST(x.fwd_s == coll(Collective::all_to_all, f.before_bytes) +
                                  coll(Collective::all_to_all, f.after_bytes));
      } else {
        // At least the last dK/dV hop home, which nothing hides.
        BOOST_TEST(x.bwd_s >= cost.fabric().p2p_cost(b.kv_bytes, false).time_s());
        BOOST_TEST(x.fwd_s >= 0);
      }
      BOOST_TEST((x.fwd_s > 0 || s.cp_kind == CpKind::ring));
    }
  }
}
