// Layout group invariants and Program invariants for every schedule, including a plan whose
// layers differ in tp, dp, ZeRO stage, recompute and offload.
#define BOOST_TEST_MODULE layout_program
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>
#include <tuple>

#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"

using namespace stratagem;

namespace {
struct Case {
  std::string name;
  ModelSpec model;
  ClusterSpec cluster;
  Plan plan;
};

ModelSpec tiny_gpt(int layers) {
  ModelSpec m;
  m.name = "tiny";
  m.layers = layers, m.hidden = 256, m.heads = 8, m.kv_heads = 8, m.ffn_hidden = 1024;
  m.vocab = 1000, m.seq_len = 128;
  return m;
}

Case make_case(std::string name, int nodes, PlanShorthand s, int layers = 8) {
  Case c{std::move(name), tiny_gpt(layers), load_cluster("dgx-a100-80g"), {}};
  c.cluster.nodes = nodes;
  c.plan = expand_shorthand(s, c.model, c.cluster);
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  PlanShorthand s;
  s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 32;
  out.push_back(make_case("1f1b tp2 pp2 dp4", 2, s));
  s = {};
  s.pp = 4, s.micro_batch = 2, s.global_batch = 32, s.schedule = "gpipe", s.zero = 1;
  out.push_back(make_case("gpipe pp4 dp4 z1", 2, s));
  s = {};
  s.tp = 4, s.pp = 2, s.vpp = 2, s.micro_batch = 1, s.global_batch = 16;
  s.sequence_parallel = true, s.recompute = "selective";
  out.push_back(make_case("interleaved pp2 v2 tp4 sp", 1, s));
  s = {};
  s.tp = 1, s.pp = 4, s.vpp = 2, s.micro_batch = 1, s.global_batch = 32, s.zero = 2;
  out.push_back(make_case("interleaved pp4 v2 z2 dp4", 2, s));
  s = {};
  s.tp = 2, s.pp = 2, s.micro_batch = 2, s.global_batch = 64, s.recompute = "full";
  s.no_overlap_grad_reduce = true;
  out.push_back(make_case("1f1b full recompute no overlap", 2, s));
  // Heterogeneous: layers differ in every per-layer field.
  s = {};
  s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 32;
  Case h = make_case("heterogeneous", 2, s);
  auto& L = h.plan.layers;
  L[0] = {1, 8, false, 0, Recompute::none, false, false, false};
  L[1] = {4, 2, true, 3, Recompute::full, false, false, false};
  L[2] = {2, 4, false, 2, Recompute::selective, true, false, true};
  L[3] = {8, 1, true, 0, Recompute::none, false, false, false};
  L[4] = {2, 4, false, 1, Recompute::full, false, true, false};
  L[5] = {4, 2, false, 3, Recompute::none, true, true, true};
  h.plan.chunks = {{0, 3}, {3, 8}};
  validate(h.plan, h.model, h.cluster, "heterogeneous");
  out.push_back(h);
  // Untied LLaMA-style model with GQA and pp 3 (uneven split).
  Case l = make_case("llama gqa pp3", 3, [] {
    PlanShorthand q;
    q.tp = 2, q.pp = 3, q.micro_batch = 1, q.global_batch = 24, q.zero = 1;
    return q;
  }());
  out.push_back(l);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(layout_groups_partition_the_world) {
  for (auto& c : cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      Layout L(c.plan, c.cluster);
      const int W = L.world_size();
      // For every tp degree in use: tp groups partition each stage, dp groups too, and a rank
      // is in exactly one of each.
      for (int tp : L.tp_degrees()) {
        std::vector<int> in_tp(W, 0), in_dp(W, 0);
        std::set<int> tp_ids, dp_ids;
        for (int r = 0; r < W; ++r) {
          tp_ids.insert(L.tp_group(r, tp));
          dp_ids.insert(L.dp_group(r, tp));
        }
        for (int id : tp_ids)
          for (int r : L.group(id).ranks) in_tp[r]++;
        for (int id : dp_ids)
          for (int r : L.group(id).ranks) in_dp[r]++;
        for (int r = 0; r < W; ++r) {
          BOOST_TEST(in_tp[r] == 1);
          BOOST_TEST(in_dp[r] == 1);
          const auto& g = L.group(L.tp_group(r, tp));
          BOOST_TEST((int)g.ranks.size() == tp);
          BOOST_TEST(std::count(g.ranks.begin(), g.ranks.end(), r) == 1);
          // tp is innermost: a tensor group stays inside one node.
          for (int q : g.ranks) BOOST_TEST(L.coords(q).node == L.coords(r).node);
        }
      }
      // pp is outermost: neighbours keep the local index.
      for (int r = 0; r < W; ++r) {
        int n = L.next_stage_rank(r);
        if (n >= 0) BOOST_TEST(L.coords(n).local == L.coords(r).local);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(program_invariants) {
  for (auto& c : cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      Layout L(c.plan, c.cluster);
      Program prog = build_program(c.model, c.plan);
      const int W = L.world_size();
      const int M = prog.num_microbatches;
      // (src, dst) -> sequence of (bytes, microbatch, phase) for sends and recvs.
      std::map<std::pair<int, int>, std::vector<std::tuple<int64_t, int, int>>> sends, recvs;
      // group id -> per member sequence of (collective, bytes).
      std::map<int, std::map<int, std::vector<std::pair<int, int64_t>>>> colls;
      std::map<std::tuple<int, int, int>, int> compute_per_mb;  // (mb, phase, block) -> count
      for (int r = 0; r < W; ++r) {
        const StageProgram& sp = prog.stages[L.coords(r).stage];
        std::map<int, int64_t> live;
        for (size_t i = 0; i < sp.ops.size(); ++i) {
          const Op& op = sp.ops[i];
          for (uint32_t d = 0; d < op.dep_count; ++d) BOOST_TEST(sp.deps_of(op)[d] < i);
          switch (op.kind) {
            case OpKind::send: {
              int peer = resolve_peer(L, r, op);
              BOOST_TEST(peer >= 0);
              sends[{r, peer}].push_back({op.bytes, op.microbatch, (int)op.phase});
              break;
            }
            case OpKind::recv: {
              int peer = resolve_peer(L, r, op);
              BOOST_TEST(peer >= 0);
              recvs[{peer, r}].push_back({op.bytes, op.microbatch, (int)op.phase});
              break;
            }
            case OpKind::collective: {
              int g = resolve_group(L, r, op);
              BOOST_TEST(g >= 0);
              const auto& ranks = L.group(g).ranks;
              BOOST_TEST(std::count(ranks.begin(), ranks.end(), r) == 1);
              colls[g][r].push_back({(int)op.collective, op.bytes});
              break;
            }
            case OpKind::alloc:
              BOOST_TEST(op.bytes > 0);
              BOOST_TEST(live.count(op.buffer) == 0);
              live[op.buffer] = op.bytes;
              break;
            case OpKind::free:
              BOOST_TEST(live.count(op.buffer) == 1);
              BOOST_TEST(live[op.buffer] == op.bytes);
              live.erase(op.buffer);
              break;
            case OpKind::compute:
              if (op.microbatch >= 0 && L.coords(r).local == 0)
                compute_per_mb[{op.microbatch, (int)op.phase, (int)op.block}]++;
              break;
            default:
              break;
          }
        }
        BOOST_TEST(live.empty(), "rank " << r << " leaves " << live.size() << " buffers allocated");
      }
      BOOST_TEST(sends.size() == recvs.size());
      for (auto& [pair, seq] : sends)
        BOOST_TEST((seq == recvs[pair]), "send/recv order " << pair.first << "->" << pair.second);
      for (auto& [g, members] : colls) {
        BOOST_TEST(members.size() == L.group(g).ranks.size(),
                   "group " << g << " not all members issue");
        for (auto& [r, seq] : members)
          BOOST_TEST((seq == members.begin()->second), "group " << g << " rank " << r);
      }
      // Per micro-batch: one forward and one backward op per block of every layer, plus the
      // embedding and the head; recompute adds its ops.
      const int layers = c.model.layers;
      int full = 0, selective = 0;
      for (const auto& l : c.plan.layers)
        full += l.recompute == Recompute::full, selective += l.recompute == Recompute::selective;
      for (int mb = 0; mb < M; ++mb) {
        using B = Block;
        auto count = [&](Phase ph, B b) { return compute_per_mb[{mb, (int)ph, (int)b}]; };
        BOOST_TEST(count(Phase::forward, B::attention) == layers);
        BOOST_TEST(count(Phase::forward, B::mlp) == layers);
        BOOST_TEST(count(Phase::backward, B::attention) == layers);
        BOOST_TEST(count(Phase::backward, B::mlp) == layers);
        BOOST_TEST(count(Phase::forward, B::embedding) == 1);
        BOOST_TEST(count(Phase::backward, B::embedding) == 1);
        BOOST_TEST(count(Phase::forward, B::head) == 1);
        BOOST_TEST(count(Phase::backward, B::head) == 1);
        BOOST_TEST(count(Phase::recompute, B::mlp) == full);
        BOOST_TEST(count(Phase::recompute, B::attention) ==
                   full + (c.plan.flash_attention ? 0 : selective));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(schedules_order_passes_as_published) {
  // 1F1B on stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then alternate.
  ModelSpec m = tiny_gpt(8);
  ClusterSpec c = load_cluster("dgx-a100-80g");
  PlanShorthand s;
  s.pp = 4, s.tp = 2, s.micro_batch = 1, s.global_batch = 6, s.dp = 1;
  c.nodes = 1;
  Plan p = expand_shorthand(s, m, c);
  Program prog = build_program(m, p);
  std::string order;
  for (const Op& op : prog.stages[0].ops)
    if (op.kind == OpKind::compute && op.block == Block::embedding)
      order += (op.phase == Phase::forward ? "F" : "B") + std::to_string(op.microbatch);
  BOOST_TEST(order == "F0F1F2F3B0F4B1F5B2B3B4B5");
}
