// Mixture-of-Experts plans: the expert groups against Megatron-Core's RankGenerator rule, the
// Program's MoE ops (counts, streams, groups, bytes), their prices, and the plan's checks.
#define BOOST_TEST_MODULE moe_plan
#include <boost/test/unit_test.hpp>
#include <map>
#include <set>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"
#include "stratagem/workload_moe.hpp"

using namespace stratagem;

namespace {
// A small Mixtral-like decoder: 8 experts, top-2, SwiGLU, the first layer dense.
ModelSpec tiny_moe(int layers = 4) {
  ModelSpec m;
  m.name = "tiny-moe";
  m.layers = layers, m.hidden = 256, m.heads = 8, m.kv_heads = 8, m.ffn_hidden = 1024;
  m.vocab = 1000, m.seq_len = 128;
  m.activation = Activation::swiglu, m.norm = Norm::rmsnorm, m.position = Position::rope;
  m.bias = false, m.dropout = false, m.tied_embeddings = false;
  m.moe.experts = 8, m.moe.top_k = 2, m.moe.expert_ffn_hidden = 512, m.moe.dense_layers = 1;
  return m;
}

ClusterSpec cluster(int nodes) {
  ClusterSpec c = load_cluster("dgx-h100");
  c.nodes = nodes;
  return c;
}

Plan plan_of(const ModelSpec& m, const ClusterSpec& c, PlanShorthand s) {
  Plan p = expand_shorthand(s, m, c);
  validate(p, m, c, "test");
  return p;
}

// Megatron-Core's RankGenerator for the experts (order "tp-cp-ep-dp-pp", tp = etp, cp = 1):
// the ranks of a stage that share every coordinate but `axis`.
std::set<std::vector<int>> megatron_groups(int D, int etp, int ep, int stage, char axis) {
  std::set<std::vector<int>> out;
  const int edp = D / (etp * ep);
  std::map<std::tuple<int, int, int>, std::vector<int>> by_key;
  for (int ed = 0; ed < edp; ++ed)
    for (int e = 0; e < ep; ++e)
      for (int et = 0; et < etp; ++et) {
        const int rank = stage * D + et + etp * (e + ep * ed);
        auto key = axis == 'e'   ? std::tuple(et, -1, ed)
                   : axis == 'd' ? std::tuple(et, e, -1)
                                 : std::tuple(-1, e, ed);
        by_key[key].push_back(rank);
      }
  for (auto& [k, v] : by_key) out.insert(v);
  return out;
}

std::set<std::vector<int>> layout_groups(const Layout& L, GroupKind kind, int stage) {
  std::set<std::vector<int>> out;
  for (const Group& g : L.groups())
    if (g.kind == kind && g.stage == stage) out.insert(g.ranks);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(expert_groups_follow_megatron_rank_generator) {
  const ModelSpec m = tiny_moe();
  struct Shape {
    int nodes, tp, pp, ep, etp;
  };
  for (Shape x : {Shape{1, 1, 1, 8, 1}, Shape{2, 2, 2, 4, 1}, Shape{2, 1, 1, 4, 2},
                  Shape{4, 2, 2, 2, 2}, Shape{2, 4, 1, 8, 2}}) {
    const ClusterSpec c = cluster(x.nodes);
    PlanShorthand s;
    s.tp = x.tp, s.pp = x.pp, s.ep = x.ep, s.etp = x.etp, s.global_batch = 256;
    const Plan p = plan_of(m, c, s);
    const Layout L(p, c);
    const int D = p.devices_per_stage();
    for (int stage = 0; stage < x.pp; ++stage) {
      BOOST_TEST(
          (layout_groups(L, GroupKind::ep, stage) == megatron_groups(D, x.etp, x.ep, stage, 'e')));
      BOOST_TEST((layout_groups(L, GroupKind::expert_dp, stage) ==
                  megatron_groups(D, x.etp, x.ep, stage, 'd')));
      BOOST_TEST((layout_groups(L, GroupKind::expert_tp, stage) ==
                  megatron_groups(D, x.etp, x.ep, stage, 't')));
    }
    // Every rank finds itself in the groups the Layout resolves for it.
    for (int r = 0; r < p.world_size(); ++r) {
      for (int id : {L.ep_group(r, x.etp, x.ep), L.expert_dp_group(r, x.etp, x.ep),
                     L.expert_tp_group(r, x.etp, x.ep)}) {
        const auto& ranks = L.group(id).ranks;
        BOOST_TEST((std::find(ranks.begin(), ranks.end(), r) != ranks.end()));
      }
      BOOST_TEST(int(L.group(L.ep_group(r, x.etp, x.ep)).ranks.size()) == x.ep);
      BOOST_TEST(int(L.group(L.expert_dp_group(r, x.etp, x.ep)).ranks.size()) ==
                 D / (x.ep * x.etp));
    }
  }
}

BOOST_AUTO_TEST_CASE(dense_plans_get_no_expert_groups) {
  ModelSpec m = tiny_moe();
  m.moe = MoeSpec{};
  const ClusterSpec c = cluster(1);
  PlanShorthand s;
  s.tp = 2, s.global_batch = 64;
  const Layout L(plan_of(m, c, s), c);
  for (const Group& g : L.groups())
    BOOST_TEST((g.kind != GroupKind::ep && g.kind != GroupKind::expert_dp &&
                g.kind != GroupKind::expert_tp));
}

BOOST_AUTO_TEST_CASE(program_moe_ops) {
  const ModelSpec m = tiny_moe(4);
  const ClusterSpec c = cluster(2);  // 16 ranks: etp 2 x ep 4 x expert_dp 2
  PlanShorthand s;
  s.ep = 4, s.etp = 2, s.micro_batch = 1, s.global_batch = 32, s.zero = 1;
  const Plan p = plan_of(m, c, s);
  BOOST_TEST(p.layers[0].ep == 1);  // the dense layer
  BOOST_TEST(p.layers[1].ep == 4);
  BOOST_TEST(p.layers[3].etp == 2);
  const Program prog = build_program(m, p);
  const int M = prog.num_microbatches;
  const int moe_layers = 3;
  const StageProgram& st = prog.stages[0];
  std::map<std::tuple<Block, Phase, Collective, GroupKind>, int> count;
  std::map<std::tuple<Block, Phase, Collective, GroupKind>, int64_t> bytes;
  for (const Op& op : st.ops) {
    if (op.kind != OpKind::compute && op.kind != OpKind::collective) continue;
    if (op.stream == Stream::ep_comm) {
      BOOST_TEST((op.kind == OpKind::collective));
      BOOST_TEST(op.strategy.etp == 2);
      BOOST_TEST(op.strategy.ep == 4);
      BOOST_TEST(m.is_moe_layer(op.layer));
    }
    const auto k = std::tuple(op.block, op.phase, op.collective, op.group);
    ++count[k];
    bytes[k] = op.bytes;
  }
  const int n = moe_layers * M;
  for (Phase ph : {Phase::forward, Phase::backward}) {
    BOOST_TEST((count[{Block::router, ph, Collective::none, GroupKind::none}] == n));
    BOOST_TEST((count[{Block::experts, ph, Collective::none, GroupKind::none}] == n));
    BOOST_TEST((count[{Block::combine, ph, Collective::none, GroupKind::none}] == n));
    BOOST_TEST((count[{Block::router, ph, Collective::all_to_all, GroupKind::ep}] == n));
    BOOST_TEST((count[{Block::combine, ph, Collective::all_to_all, GroupKind::ep}] == n));
    BOOST_TEST((count[{Block::experts, ph, Collective::all_gather, GroupKind::expert_tp}] == n));
    BOOST_TEST(
        (count[{Block::experts, ph, Collective::reduce_scatter, GroupKind::expert_tp}] == n));
    // Dispatch: tokens x top_k copies of the hidden state (one sample per rank).
    const int64_t a2a = int64_t(1) * m.seq_len * m.moe.top_k * m.hidden * 2;
    BOOST_TEST((bytes[{Block::router, ph, Collective::all_to_all, GroupKind::ep}] == a2a));
    BOOST_TEST(
        (bytes[{Block::experts, ph, Collective::all_gather, GroupKind::expert_tp}] == 2 * a2a));
  }
  // Only the dense layer keeps a Block::mlp compute op.
  BOOST_TEST((count[{Block::mlp, Phase::forward, Collective::none, GroupKind::none}] == M));
  // The experts' gradients: once per iteration over the expert data-parallel group (ZeRO-1: a
  // reduce-scatter), their updated shard gathered after the step.
  const int64_t experts = moe_expert_parameters_per_rank(m, p.layers[1]);
  BOOST_TEST(experts == 2 * 3 * 256 * 256);  // 8/4 experts of 3 x h x 512/2
  BOOST_TEST(
      (count[{Block::experts, Phase::backward, Collective::reduce_scatter, GroupKind::expert_dp}] ==
       moe_layers));
  BOOST_TEST(
      (bytes[{Block::experts, Phase::backward, Collective::reduce_scatter, GroupKind::expert_dp}] ==
       experts * 2));
  BOOST_TEST(
      (count[{Block::optimizer, Phase::optimizer, Collective::all_gather, GroupKind::expert_dp}] ==
       moe_layers));
  // Every op resolves to a group of the Layout on every rank.
  const Layout L(p, c);
  for (int r = 0; r < p.world_size(); ++r)
    for (const Op& op : st.ops)
      if (op.kind == OpKind::collective) BOOST_TEST(resolve_group(L, r, op) >= 0);
}

BOOST_AUTO_TEST_CASE(program_zero3_experts) {
  // ZeRO-3 over expert_dp 2 (8 ranks, ep 4): the experts gathered over their expert
  // data-parallel group before the experts' compute, in forward and once per backward pass,
  // freed after; their gradients staged and reduce-scattered every micro-batch, no gather
  // after the step. At ep 8 (expert_dp 1) they stay whole: no gather, no staging.
  const ModelSpec m = tiny_moe(4);
  const ClusterSpec c = cluster(1);
  for (const char* recompute : {"none", "full"}) {
    PlanShorthand s;
    s.ep = 4, s.micro_batch = 1, s.global_batch = 32, s.zero = 3, s.recompute = recompute;
    const Plan p = plan_of(m, c, s);
    FrameworkSpec staging;  // stratagem's runtime: ZeRO-2/3 gradients staged per layer
    staging.layer_gradient_staging = true;
    const Program prog = build_program(m, p, staging);
    const int M = prog.num_microbatches, moe_layers = 3;
    const int64_t experts = moe_expert_parameters_per_rank(m, p.layers[1]);
    std::map<std::tuple<OpKind, Phase, Collective, GroupKind, MemCategory>, int> count;
    int live = 0, peak_live = 0;
    for (const Op& op : prog.stages[0].ops) {
      if (op.block != Block::experts || op.kind == OpKind::compute) continue;
      if (op.stream == Stream::ep_comm) continue;
      ++count[{op.kind, op.phase, op.collective, op.group, op.category}];
      if (op.kind == OpKind::alloc && op.category == MemCategory::buffers) {
        BOOST_TEST(op.bytes == experts * 2);  // the rank's 2 experts gathered, bf16
        peak_live = std::max(peak_live, ++live);
      }
      if (op.kind == OpKind::free && op.category == MemCategory::buffers) --live;
      if (op.kind == OpKind::collective && op.group == GroupKind::expert_dp) {
        BOOST_TEST(op.strategy.etp == 1);
        BOOST_TEST(op.strategy.ep == 4);
      }
    }
    BOOST_TEST(peak_live == 1);  // one layer's experts gathered at a time
    const int n = moe_layers * M;
    const auto key = [](OpKind k, Phase ph, Collective cl, GroupKind g, MemCategory cat) {
      return std::tuple(k, ph, cl, g, cat);
    };
    for (Phase ph : {Phase::forward, Phase::backward})
      BOOST_TEST(count[key(OpKind::collective, ph, Collective::all_gather, GroupKind::expert_dp,
                           MemCategory::buffers)] == n);
    BOOST_TEST(count[key(OpKind::collective, Phase::recompute, Collective::all_gather,
                         GroupKind::expert_dp, MemCategory::buffers)] == 0);
    BOOST_TEST(count[key(OpKind::collective, Phase::backward, Collective::reduce_scatter,
                         GroupKind::expert_dp, MemCategory::buffers)] == n);
    BOOST_TEST(count[key(OpKind::alloc, Phase::backward, Collective::none, GroupKind::none,
                         MemCategory::grads)] == n);
    BOOST_TEST(count[key(OpKind::collective, Phase::optimizer, Collective::all_gather,
                         GroupKind::expert_dp, MemCategory::buffers)] == 0);
    // The resident states hold a half of the experts (expert_dp 2).
    ModelStates whole, sharded;
    LayerStrategy es = expert_strategy(p.layers[1]);
    sharded.add(es, experts, p.dtype);
    es.zero = 0;
    whole.add(es, experts, p.dtype);
    BOOST_TEST(2 * sharded.weights == whole.weights);
  }
  PlanShorthand s;
  s.ep = 8, s.micro_batch = 1, s.global_batch = 32, s.zero = 3;
  const Program prog = build_program(m, plan_of(m, c, s));
  for (const Op& op : prog.stages[0].ops)
    BOOST_TEST(!(op.group == GroupKind::expert_dp ||
                 (op.block == Block::experts && op.kind == OpKind::alloc)));
}

BOOST_AUTO_TEST_CASE(etp_defaults_to_tp) {
  // As Megatron-Core's expert_tensor_parallel_size; etp x ep = 1 under tp > 1 is refused.
  const ModelSpec m = tiny_moe(2);
  const ClusterSpec c = cluster(1);
  PlanShorthand s;
  s.tp = 2, s.global_batch = 16;
  const Plan p = plan_of(m, c, s);
  BOOST_TEST(p.layers[0].etp == 1);  // dense
  BOOST_TEST(p.layers[1].etp == 2);
  s.etp = 1;
  try {
    plan_of(m, c, s);
    BOOST_TEST_FAIL("etp 1 ep 1 at tp 2 accepted");
  } catch (const InputError& e) {
    BOOST_TEST(std::string(e.what()).find("layers[1].etp") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(moe_prices) {
  ModelSpec m = tiny_moe(4);
  m.moe.experts = 16;
  const ClusterSpec c = cluster(2);
  PlanShorthand s;
  s.ep = 16, s.global_batch = 64;
  Plan p = plan_of(m, ClusterSpec(c), s);
  // 16 ranks over 2 nodes: the all-to-all crosses the network for half of its copies.
  const CostModel cost(m, c, p.dtype);
  const int64_t bytes = 1 << 24;
  const CommCost two = cost.moe_comm_cost(Collective::all_to_all, bytes, 16, 2, 1.0, 0);
  BOOST_TEST(int(two.link) == int(LinkClass::inter_node));
  BOOST_TEST(two.link_bytes == double(bytes) * 8 / 16);
  const CommCost one = cost.moe_comm_cost(Collective::all_to_all, bytes, 8, 1, 1.0, 0);
  BOOST_TEST(int(one.link) == int(LinkClass::intra_node));
  BOOST_TEST(one.time_s() < two.time_s());
  // Imbalance paces the experts and the all-to-all by the busiest rank.
  Plan q = p;
  q.routing_imbalance = 1.5;
  const CostModel skewed(m, c, q.dtype);
  BOOST_TEST(
      skewed.moe_comm_cost(Collective::all_to_all, bytes, 16, 2, q.expert_load_factor(16, 16), 0)
          .link_bytes == 1.5 * two.link_bytes);
  // The Program's experts op of layer 1 carries the load its plan expects.
  auto experts_op = [&](const Plan& plan) {
    const Program prog = build_program(m, plan);
    for (const Op& op : prog.stages[0].ops)
      if (op.kind == OpKind::compute && op.block == Block::experts && op.layer == 1) {
        Op big = op;
        big.samples = 64;  // large enough that the GEMMs are not latency-bound
        return big;
      }
    BOOST_FAIL("no experts op");
    return Op{};
  };
  BOOST_TEST(experts_op(q).strategy.expert_load == 1.5);
  BOOST_TEST(skewed.compute_time_s(experts_op(q)) > cost.compute_time_s(experts_op(p)));
  // A rank holding every expert computes its own tokens' copies: no imbalance at ep 1; half
  // the experts per rank average it down.
  BOOST_TEST(q.expert_load_factor(1, 16) == 1.0);
  BOOST_TEST(q.expert_load_factor(16, 16) == 1.5);
  BOOST_TEST(q.expert_load_factor(2, 16) == 1.0 + 0.5 / 15);
  // A capacity factor caps what the busiest expert takes.
  q.capacity_factor = 1.0;
  const CostModel capped(m, c, q.dtype);
  BOOST_TEST(capped.compute_time_s(experts_op(q)) == cost.compute_time_s(experts_op(p)));
  // Node-limited routing: at most one node per token (top-2) sends half the network bytes.
  Plan l = p;
  l.moe_node_limit = 1;
  const CostModel limited(m, c, l.dtype);
  const CommCost lim = limited.moe_comm_cost(Collective::all_to_all, bytes, 16, 2, 1.0, 1);
  BOOST_TEST(lim.time_s() < two.time_s());
  // The experts' grouped GEMM runs less efficiently when each expert gets fewer rows.
  const MoeShape few = moe_shape(m, p.layers[1], 1), many = moe_shape(m, p.layers[1], 16);
  BOOST_TEST(few.expert_rows * 16 == many.expert_rows);
  Gemm g_few{few.expert_rows, 2 * few.expert_width, m.hidden, few.local_experts};
  Gemm g_many{many.expert_rows, 2 * many.expert_width, m.hidden, many.local_experts};
  BOOST_TEST(cost.gemm_efficiency(g_few) < cost.gemm_efficiency(g_many));
}

BOOST_AUTO_TEST_CASE(bad_moe_plans_name_the_field) {
  const ModelSpec m = tiny_moe(4);
  const ClusterSpec c = cluster(1);
  auto fails_with = [&](PlanShorthand s, const std::string& field) {
    try {
      plan_of(m, c, s);
    } catch (const InputError& e) {
      const std::string what = e.what();
      BOOST_TEST_INFO(what);
      BOOST_TEST(what.find(field) != std::string::npos);
      return;
    }
    BOOST_TEST_FAIL("no error for " + field);
  };
  PlanShorthand s;
  s.global_batch = 64;
  s.ep = 3;
  fails_with(s, "layers[1].ep");  // 3 does not divide 8 experts
  s.ep = 8, s.etp = 2;
  fails_with(s, "layers[1].ep");  // 16 expert ranks on an 8-GPU stage
  s.ep = 2, s.etp = 1, s.zero = 3, s.offload = "params";
  plan_of(m, c, s);  // ZeRO-3 and offload of the experts over their expert data-parallel group
  s.offload = "none", s.zero = 0;
  s.routing_imbalance = 0.5;
  BOOST_CHECK_THROW(plan_of(m, c, s), InputError);
  // ep on a dense model, and on a dense layer of a plan file.
  ModelSpec dense = m;
  dense.moe = MoeSpec{};
  PlanShorthand d;
  d.ep = 2, d.global_batch = 64;
  BOOST_CHECK_THROW(expand_shorthand(d, dense, c), InputError);
  // Routing figures on a dense model (issue 41: kept and printed with exit 0, pricing nothing).
  for (int flag = 0; flag < 3; ++flag) {
    PlanShorthand r;
    r.global_batch = 64;
    if (flag == 0) r.routing_imbalance = 2.0;
    if (flag == 1) r.capacity_factor = 1.5;
    if (flag == 2) r.moe_node_limit = 2;
    BOOST_CHECK_THROW(expand_shorthand(r, dense, c), InputError);
  }
  PlanShorthand ok;
  ok.ep = 2, ok.global_batch = 64;
  Plan p = plan_of(m, c, ok);
  p.layers[0].ep = 2;
  try {
    validate(p, m, c, "plan.json");
    BOOST_TEST_FAIL("ep on a dense layer accepted");
  } catch (const InputError& e) {
    BOOST_TEST(std::string(e.what()).find("layers[0].ep") != std::string::npos);
  }
}
