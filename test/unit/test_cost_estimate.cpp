// The fast estimator: its per-micro-batch stage time equals the Program's op costs, its
// breakdown adds up, the pipeline/overlap/ZeRO terms behave as the formulas say, and
// `stratagem estimate --json` prints the promised keys.
#define BOOST_TEST_MODULE cost_estimate
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "src/cost/plan_costs.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/iteration.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"
#include "stratagem/simulate.hpp"
#include "test/support/run.hpp"

using namespace stratagem;
namespace tt = boost::test_tools;

namespace {
struct Setup {
  ModelSpec model;
  ClusterSpec cluster;
  Plan plan;
};

Setup gpt3(PlanShorthand s, int nodes = 128) {
  Setup x{load_model("gpt3-175b"), load_cluster("dgx-a100-80g"), {}};
  x.cluster.nodes = nodes;
  if (!s.tp) s.tp = 8;
  if (!s.pp) s.pp = 16;
  if (!s.micro_batch) s.micro_batch = 1;
  if (!s.global_batch) s.global_batch = 1536;
  x.plan = expand_shorthand(s, x.model, x.cluster);
  validate(x.plan, x.model, x.cluster, "test");
  return x;
}

double sum_breakdown(const TimeBreakdown& t) {
  return t.compute_s + t.recompute_s + t.tp_comm_s + t.dp_comm_s + t.pp_comm_s + t.bubble_s +
         t.offload_s + t.optimizer_s + t.host_s;
}
}  // namespace

BOOST_AUTO_TEST_CASE(stage_time_equals_the_programs_op_costs) {
  // A micro-batch on a stage: its compute ops plus the tensor-parallel collectives compute
  // waits for, each costed by CostModel::op_time_s on the Layout's groups.
  std::vector<Setup> setups;
  {
    PlanShorthand s;
    s.tp = 2, s.pp = 2, s.micro_batch = 2, s.global_batch = 32, s.sequence_parallel = true;
    s.recompute = "selective";
    setups.push_back(gpt3(s, 2));
  }
  {
    PlanShorthand s;
    s.tp = 4, s.pp = 2, s.vpp = 2, s.micro_batch = 1, s.global_batch = 16, s.recompute = "full";
    setups.push_back(gpt3(s, 2));
  }
  {
    // Layers of different tensor degrees: reshard collectives between them.
    PlanShorthand s;
    s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 32, s.zero = 1;
    Setup x = gpt3(s, 2);
    for (int l = 0; l < 96; l += 3)
      x.plan.layers[l] = {4, 2, false, 1, Recompute::full, false, false, false};
    for (int l = 1; l < 96; l += 5)
      x.plan.layers[l] = {8, 1, true, 0, Recompute::selective, false, false, false};
    validate(x.plan, x.model, x.cluster, "mixed");
    setups.push_back(x);
    // One rule for both sides (iteration.hpp): an all-gather when the stream's replicas grow by
    // a whole factor, none when they shrink or the degrees do not divide one another.
    LayerStrategy t1 = x.plan.layers[0], t3 = t1, t4 = t1, t8 = x.plan.layers[1];
    t1.tp = 1, t3.tp = 3, t4.tp = 4;
    BOOST_TEST(reshard_gather_ranks(t1, t4) == 4);
    BOOST_TEST(reshard_gather_ranks(t4, t1) == 0);
    BOOST_TEST(reshard_gather_ranks(t3, t4) == 0);
    BOOST_TEST(reshard_gather_ranks(t1, t8) == 0);  // sequence parallel: a token shard, no gather
    // A last layer of another tensor degree than the LM head's: a reshard before the head,
    // gathering in forward (tp 1 -> 2) or in backward (tp 4 -> 2).
    for (int last_tp : {1, 4}) {
      Setup y = x;
      y.plan.layers[95] = {last_tp, 8 / last_tp, false, 1, Recompute::none, false, false, false};
      validate(y.plan, y.model, y.cluster, "mixed last");
      setups.push_back(y);
    }
  }
  // Under a framework that accumulates weight gradients inside the GEMM, one that adds them in a
  // separate pass, and one that overlaps the sequence-parallel collectives with their GEMMs
  // (data/frameworks).
  for (const char* fw : {"stratagem", "megatron-lm-2021", "megatron-core"})
    for (const Setup& x : setups) {
      CostModel cm(x.model, x.cluster, x.plan.dtype, load_framework(fw));
      const Estimate e = estimate(cm, x.plan);
      const Layout layout(x.plan, x.cluster);
      const Program prog = build_program(x.model, x.plan);
      for (const auto& st : prog.stages) {
        const int rank = layout.rank_of(st.stage, 0);
        double t = 0;
        for (const Op& op : st.ops) {
          if (op.microbatch != 0) continue;
          if (op.kind == OpKind::compute ||
              (op.kind == OpKind::collective && op.stream == Stream::tp_comm))
            t += cm.op_time_s(op, layout, rank);
        }
        BOOST_TEST_INFO(fw << ": " << x.plan.describe() << " stage " << st.stage);
        BOOST_TEST(e.stages[st.stage].time_per_microbatch_s == t, tt::tolerance(1e-9));
      }
    }
}

BOOST_AUTO_TEST_CASE(side_streams_and_optimizer_equal_the_programs_op_costs) {
  // The rest of the iteration's templates (iteration.hpp) priced the same way on both sides:
  // per micro-batch the data-parallel stream (ZeRO-3 gathers, ZeRO-2/3 reduce-scatters) and
  // the copy stream (fetches of offloaded weights), and after the last micro-batch the AdamW
  // step on the device and the offloaded one (gradients down, host step, weights up), each the
  // sum of the Program's ops costed by CostModel::op_time_s on the Layout's groups.
  struct Case {
    const char* model;
    int tp, pp, zero;
    const char* offload;
  };
  const Case cases[] = {
      {"gpt3-1.3b", 2, 2, 0, "none"},      {"gpt3-1.3b", 2, 2, 1, "none"},
      {"llama2-7b", 2, 2, 2, "none"},      {"llama2-7b", 2, 2, 3, "none"},
      {"llama2-7b", 1, 2, 3, "none"},      {"gpt3-1.3b", 1, 1, 3, "none"},
      {"llama2-7b", 2, 2, 1, "optimizer"}, {"llama2-7b", 2, 2, 0, "params"},
      {"llama2-7b", 2, 2, 0, "optimizer"}, {"llama2-7b", 2, 2, 0, "optimizer,params"}};
  for (const char* fw : {"stratagem", "fsdp-eager"})
    for (const Case& k : cases) {
      Setup x{load_model(k.model), load_cluster("dgx-a100-80g"), {}};
      x.cluster.nodes = 2;
      PlanShorthand s;
      s.tp = k.tp, s.pp = k.pp, s.zero = k.zero, s.offload = k.offload;
      s.micro_batch = 1, s.global_batch = 32;
      x.plan = expand_shorthand(s, x.model, x.cluster);
      validate(x.plan, x.model, x.cluster, "test");
      const FrameworkSpec framework = load_framework(fw);
      CostModel cm(x.model, x.cluster, x.plan.dtype, framework);
      std::vector<cost_detail::StageCost> sc;
      cost_detail::analyze(cm, x.plan, /*with_time=*/true, sc);
      const Layout layout(x.plan, x.cluster);
      const Program prog = build_program(x.model, x.plan, framework);
      for (const auto& st : prog.stages) {
        const int rank = layout.rank_of(st.stage, 0);
        double dp = 0, h2d = 0, device_step = 0, host_step = 0;
        for (const Op& op : st.ops) {
          const double t = cm.op_time_s(op, layout, rank);
          if (op.phase == Phase::optimizer) {
            // (With every optimizer state offloaded the device step has no parameters: one
            // launch, on both sides.)
            if (op.kind == OpKind::compute) device_step += t;
            if (op.kind == OpKind::copy_d2h || op.kind == OpKind::host_compute ||
                op.kind == OpKind::copy_h2d)
              host_step += t;
          }
          if (op.microbatch != 0) continue;
          if (op.kind == OpKind::collective && op.stream == Stream::dp_comm) dp += t;
          if (op.kind == OpKind::copy_h2d) h2d += t;
        }
        BOOST_TEST_INFO(fw << ": " << k.model << " " << x.plan.describe() << " stage " << st.stage);
        const cost_detail::StageCost& c = sc[st.stage];
        BOOST_TEST(c.dp_stream_s == dp, tt::tolerance(1e-9));
        BOOST_TEST(c.h2d_stream_s == h2d, tt::tolerance(1e-9));
        BOOST_TEST(c.optimizer_s == device_step, tt::tolerance(1e-9));
        BOOST_TEST(c.host_s == host_step, tt::tolerance(1e-9));
      }
    }
}

BOOST_AUTO_TEST_CASE(breakdown_and_throughput_identities) {
  for (const char* rc : {"none", "selective", "full"}) {
    PlanShorthand s;
    s.dp = 8, s.recompute = rc, s.sequence_parallel = true;
    const Setup x = gpt3(s);
    CostModel cm(x.model, x.cluster, x.plan.dtype);
    const Estimate e = estimate(cm, x.plan);
    BOOST_TEST_INFO(rc);
    BOOST_TEST(sum_breakdown(e.time) == e.iteration_time_s, tt::tolerance(1e-9));
    BOOST_TEST(e.tokens_per_s == 1536.0 * 2048 / e.iteration_time_s, tt::tolerance(1e-12));
    // Megatron's model FLOPs: 72 B s l h^2 (1 + s/6h + V/12lh), recompute not counted.
    const double B = 1536, S = 2048, l = 96, h = 12288, V = 50257;
    const double flops = 72 * B * S * l * h * h * (1 + S / (6 * h) + V / (12 * l * h));
    BOOST_TEST(e.tflops_per_gpu == flops / e.iteration_time_s / 1024 / 1e12, tt::tolerance(1e-9));
    BOOST_TEST(e.mfu == e.tflops_per_gpu / 312, tt::tolerance(1e-9));
    // Memory: the estimate's per-stage peaks are stage_memory's.
    const auto mem = stage_memory(cm, x.plan);
    for (size_t st = 0; st < mem.size(); ++st)
      BOOST_TEST(e.stages[st].peak_memory_bytes == mem[st].total_bytes());
    BOOST_TEST(e.peak_memory_bytes == mem[e.peak_stage].total_bytes());
    if (std::string(rc) == "none")
      BOOST_TEST(e.time.recompute_s == 0);
    else
      BOOST_TEST(e.time.recompute_s > 0);
  }
}

BOOST_AUTO_TEST_CASE(pipeline_bubble) {
  // Uniform stages: the bubble is (pp - 1) stage times, divided by vpp when interleaved.
  PlanShorthand s;
  s.dp = 8, s.global_batch = 256;  // 32 micro-batches
  const Setup a = gpt3(s);
  CostModel ca(a.model, a.cluster, a.plan.dtype);
  const Estimate ea = estimate(ca, a.plan);
  const double u = ea.stages[7].time_per_microbatch_s;
  BOOST_TEST(ea.time.bubble_s == 15 * u,
             tt::tolerance(0.02));  // head/embedding make 0 and 15 differ
  s.vpp = 2;
  const Setup b = gpt3(s);
  CostModel cb(b.model, b.cluster, b.plan.dtype);
  const Estimate eb = estimate(cb, b.plan);
  BOOST_TEST(eb.time.bubble_s == ea.time.bubble_s / 2, tt::tolerance(0.02));
  BOOST_TEST(eb.iteration_time_s < ea.iteration_time_s);
  // GPipe has the same bubble as 1F1B (it only keeps more activations).
  s.vpp.reset();
  s.schedule = "gpipe";
  const Setup g = gpt3(s);
  CostModel cg(g.model, g.cluster, g.plan.dtype);
  const Estimate eg = estimate(cg, g.plan);
  BOOST_TEST(eg.iteration_time_s == ea.iteration_time_s, tt::tolerance(1e-12));
  BOOST_TEST(eg.peak_memory_bytes > ea.peak_memory_bytes);
}

BOOST_AUTO_TEST_CASE(data_parallel_overlap_and_zero) {
  // Micro-batches of 4: a layer's backward (~50 ms) outlasts its gradient all-reduce (~29 ms on
  // the rank's own 25 GB/s NIC share), so overlap hides all but the last few reductions.
  PlanShorthand s;
  s.tp = 8, s.pp = 4, s.dp = 4, s.micro_batch = 4, s.global_batch = 256;
  const Setup a = gpt3(s, 16);
  CostModel ca(a.model, a.cluster, a.plan.dtype);
  const Estimate overlapped = estimate(ca, a.plan);
  s.no_overlap_grad_reduce = true;
  const Setup b = gpt3(s, 16);
  CostModel cb(b.model, b.cluster, b.plan.dtype);
  const Estimate exposed = estimate(cb, b.plan);
  // Without overlap the whole gradient all-reduce of a stage is exposed: 24 layers of
  // 12h^2/8 parameters in bf16, across 4 nodes, on the rank's own NIC.
  const int64_t layer = block_parameters_per_rank(a.model, 8, Block::attention) +
                        block_parameters_per_rank(a.model, 8, Block::mlp);
  const double ar = ca.fabric().collective_cost(Collective::all_reduce, 2 * layer, 4, 4).time_s();
  BOOST_TEST(exposed.time.dp_comm_s >= 24 * ar * 0.99);
  BOOST_TEST(overlapped.time.dp_comm_s < exposed.time.dp_comm_s / 4);
  BOOST_TEST(exposed.iteration_time_s - overlapped.iteration_time_s ==
                 exposed.time.dp_comm_s - overlapped.time.dp_comm_s,
             tt::tolerance(1e-6));
  // ZeRO shards the states (less memory) and adds the all-gather after the step.
  s.no_overlap_grad_reduce = false;
  s.zero = 1;
  const Setup z = gpt3(s, 16);
  CostModel cz(z.model, z.cluster, z.plan.dtype);
  const Estimate z1 = estimate(cz, z.plan);
  BOOST_TEST(z1.peak_memory_bytes < overlapped.peak_memory_bytes);
  BOOST_TEST(z1.time.dp_comm_s > overlapped.time.dp_comm_s);
  // ZeRO-3 without model parallelism: weights gathered every micro-batch; compute-bound here,
  // so the gathers hide behind compute except the first of each pass.
  PlanShorthand q;
  q.tp = 1, q.pp = 1, q.zero = 3, q.micro_batch = 1, q.global_batch = 256, q.recompute = "full";
  const Setup z3 = gpt3(q, 32);
  CostModel c3(z3.model, z3.cluster, z3.plan.dtype);
  const Estimate e3 = estimate(c3, z3.plan);
  BOOST_TEST(e3.time.dp_comm_s > 0);
  BOOST_TEST(e3.time.dp_comm_s < 0.1 * e3.iteration_time_s);
  BOOST_TEST(e3.memory.weights_bytes < 2 * 175e9 / 256 * 1.01);
}

BOOST_AUTO_TEST_CASE(offload_costs_pcie_and_host_time) {
  PlanShorthand s;
  s.tp = 8, s.pp = 8, s.dp = 1, s.global_batch = 64, s.offload = "optimizer";
  const Setup a = gpt3(s, 8);
  CostModel ca(a.model, a.cluster, a.plan.dtype);
  const Estimate e = estimate(ca, a.plan);
  // The offloaded step of stage 0 (the last to finish its step: no slack before it, and the
  // embedding): its rank's bf16 grads down over PCIe, AdamW on the node's CPUs (12 FLOPs and
  // 2 x (12 B of fp32 states + 2 B) per parameter), bf16 weights up. Stage 0 holds 12 of the
  // 96 layers and the embeddings, split over tp 8 (norms, replicated, are < 0.01% of it).
  const ModelSpec& m = a.model;
  const double p0 = double(12 * m.layer_parameters() + m.embedding_parameters()) / 8;
  const double expect_s = 2 * ca.fabric().copy_cost(int64_t(2 * p0)).time_s() +
                          ca.host_compute_time_s(12 * p0, 28 * p0);
  BOOST_TEST(e.time.offload_s == expect_s, boost::test_tools::tolerance(0.01));
  BOOST_TEST(e.memory.optimizer_bytes == 0);
  s.offload.reset();
  const Setup b = gpt3(s, 8);
  CostModel cb(b.model, b.cluster, b.plan.dtype);
  BOOST_TEST(estimate(cb, b.plan).iteration_time_s < e.iteration_time_s);
}

BOOST_AUTO_TEST_CASE(cli_estimate_json) {
  const auto r = test::run(
      "estimate --model gpt3-175b --cluster dgx-a100-80g --nodes 128 --tp 8 --pp 16 --dp 8 "
      "--micro-batch 1 --global-batch 1536 --recompute full --json");
  BOOST_TEST_INFO(r.output);
  BOOST_REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.output);
  for (const char* k :
       {"iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_bytes",
        "memory_breakdown_bytes", "time_breakdown_s", "per_stage", "flops_formula"})
    BOOST_TEST(j.contains(k), k);
  BOOST_TEST(j["memory_breakdown_bytes"].is_object());
  BOOST_TEST(j["time_breakdown_s"].is_object());
  BOOST_TEST(j["peak_memory_bytes"].get<double>() < 80e9);
  BOOST_TEST(j["iteration_time_s"].get<double>() > 0);
  BOOST_TEST(j["mfu"].get<double>() > 0.2);
  BOOST_TEST(j["mfu"].get<double>() < 0.6);
  int64_t sum = 0;
  for (auto& [k, v] : j["memory_breakdown_bytes"].items()) sum += v.get<int64_t>();
  BOOST_TEST(sum == j["peak_memory_bytes"].get<int64_t>());
  // The text report names its FLOP formula and every time and memory category.
  const auto t = test::run(
      "estimate --model gpt3-175b --cluster dgx-a100-80g --nodes 128 --tp 8 --pp 16 --dp 8 "
      "--micro-batch 1 --global-batch 1536 --recompute full");
  BOOST_REQUIRE(t.exit_code == 0);
  for (const char* needle :
       {"72*B*s*l*h^2*(1 + s/(6h) + V/(12lh))", "recompute", "pipeline bubble", "tp comm",
        "dp/ZeRO comm", "offload", "activations", "optimizer states"})
    BOOST_TEST(t.output.find(needle) != std::string::npos, needle);
  // Bad input names the flag.
  const auto bad = test::run("estimate --model gpt3-175b --nodes 128 --tp 3");
  BOOST_TEST(bad.exit_code == kExitBadInput, bad.output);
  BOOST_TEST(bad.output.find("--tp 3 x --pp 1 does not divide the 1024 GPUs") != std::string::npos,
             bad.output);
}

BOOST_AUTO_TEST_CASE(tp_comm_overlap_hides_what_the_gemm_covers) {
  // CostModel::tp_exposed_s under a framework that pipelines the sequence-parallel collectives
  // with their GEMMs in tp chunks (megatron-core), and none where the framework does not.
  PlanShorthand sh;
  sh.tp = 8, sh.pp = 16, sh.micro_batch = 1, sh.sequence_parallel = true;
  const Setup x = gpt3(sh);
  const CostModel plain(x.model, x.cluster, x.plan.dtype, load_framework("stratagem"));
  const CostModel mc(x.model, x.cluster, x.plan.dtype, load_framework("megatron-core"));
  const LayerStrategy& s = x.plan.layers[0];
  const int b = 1;
  const BlockWork f = forward_work(x.model, s, Block::mlp, b, x.plan.flash_attention);
  const double fc1_s = mc.gemm_time_s(f.gemms[0]), fc2_s = mc.gemm_time_s(f.gemms[1]);
  for (double comm : {0.5 * fc1_s, 3 * fc1_s}) {
    BOOST_TEST(plain.tp_exposed_s(comm, Collective::all_gather, s, Block::mlp, Phase::forward, b) ==
               comm);
    BOOST_TEST(mc.tp_exposed_s(comm, Collective::all_gather, s, Block::mlp, Phase::forward, b) ==
                   7.0 / 8 * std::max(0.0, comm - fc1_s),
               tt::tolerance(1e-12));
    BOOST_TEST(mc.tp_exposed_s(comm, Collective::reduce_scatter, s, Block::mlp, Phase::forward,
                               b) == 7.0 / 8 * std::max(0.0, comm - fc2_s) + comm / 8,
               tt::tolerance(1e-12));
    // Not a layer block (the LM head's gather): no GEMM beside it in the model.
    BOOST_TEST(mc.tp_exposed_s(comm, Collective::all_gather, s, Block::head, Phase::forward, b) ==
               comm);
  }
  // Without sequence parallelism Megatron refuses --tp-comm-overlap: nothing is hidden.
  LayerStrategy no_sp = s;
  no_sp.sequence_parallel = false;
  BOOST_TEST(mc.tp_exposed_s(1.0, Collective::all_gather, no_sp, Block::mlp, Phase::forward, b) ==
             1.0);
  // The loss's traffic as megatron-core states it (38 and 14 bytes per logit) replaces the
  // Program's 8 bytes per logit in each phase.
  const double logits = double(b) * x.model.seq_len * vocab_rows_per_rank(x.model, 8);
  BOOST_TEST(mc.head_work(Phase::forward, b, 1e6, 8, 1).elementwise_bytes == 1e6 + 30 * logits);
  BOOST_TEST(mc.head_work(Phase::backward, b, 1e6, 8, 1).elementwise_bytes == 1e6 + 6 * logits);
  BOOST_TEST(plain.head_work(Phase::forward, b, 1e6, 8, 1).elementwise_bytes == 1e6);
  // Whole plan: less exposed tp communication, the same kernels.
  const Estimate ep = estimate(plain, x.plan), em = estimate(mc, x.plan);
  BOOST_TEST(em.time.tp_comm_s < 0.5 * ep.time.tp_comm_s);
  BOOST_TEST(em.time.compute_s > ep.time.compute_s);  // the loss's extra traffic
}

BOOST_AUTO_TEST_CASE(host_issue_bounds_a_micro_batch_as_the_simulator_runs_it) {
  // A framework whose host issues each layer slower than the GPU runs it: every micro-batch of a
  // stage takes the host's time, the breakdown says the GPU waited for the host, and the
  // simulator's run of the Program agrees.
  PlanShorthand s;
  s.tp = 8, s.pp = 4, s.dp = 1, s.global_batch = 16, s.sequence_parallel = true;
  const Setup x = gpt3(s, 4);
  FrameworkSpec fw;
  fw.host_ops_per_layer_forward = 100;
  fw.host_ops_per_layer_backward = 200;
  fw.host_seconds_per_op = 1e-3;
  CostModel plain(x.model, x.cluster, x.plan.dtype), hosted(x.model, x.cluster, x.plan.dtype, fw);
  const Estimate a = estimate(plain, x.plan), e = estimate(hosted, x.plan);
  const double per_mb = 24 * 0.3;  // 96 layers over 4 stages
  BOOST_TEST(a.stages[0].time_per_microbatch_s < per_mb);
  for (const StageEstimate& st : e.stages)
    BOOST_TEST(st.time_per_microbatch_s == per_mb, tt::tolerance(1e-12));
  BOOST_TEST(e.time.host_s > 0);
  BOOST_TEST(a.time.host_s == 0);
  BOOST_TEST(sum_breakdown(e.time) == e.iteration_time_s, tt::tolerance(1e-9));
  BOOST_TEST(e.iteration_time_s >= 16 * per_mb);
  const nlohmann::json j = to_json(e, false);
  BOOST_TEST(j["time_breakdown_s"].contains("host"));
  BOOST_TEST(!to_json(a, false)["time_breakdown_s"].contains("host"));
  // The simulator runs the Program's ops as the host issues them.
  const Program prog = build_program(x.model, x.plan);
  const Layout L(x.plan, x.cluster);
  const SimResult r = simulate(prog, L, x.cluster, CostModelCosts(hosted, x.plan));
  const double sim_s = double(r.makespan_ns) * 1e-9;
  BOOST_TEST_INFO("estimate " << e.iteration_time_s << " s, simulate " << sim_s << " s");
  BOOST_TEST(sim_s == e.iteration_time_s, tt::tolerance(0.02));
  BOOST_TEST(r.host_issue);
}

// A stage that repeats the stage before it takes its figures instead of walking its layers
// again (plan_costs.cpp): on every kind of plan, each stage's figures must equal those of a walk
// over every stage, bit for bit, with and without time.
BOOST_AUTO_TEST_CASE(a_repeated_stage_takes_the_figures_its_walk_would_give) {
  struct Case {
    const char* model;
    int nodes, tp, pp, vpp, zero;
    const char* recompute;
    const char* offload;
    int ep, cp;
  };
  const Case cases[] = {
      {"gpt3-175b", 128, 8, 16, 1, 1, "full", "none", 1, 1},
      {"gpt3-175b", 128, 2, 16, 2, 0, "selective", "none", 1, 1},
      {"gpt3-175b", 64, 4, 8, 2, 1, "none", "none", 1, 1},
      {"llama2-7b", 1, 1, 8, 1, 0, "none", "none", 1, 1},  // a stage per GPU: no node border
      {"llama2-7b", 2, 2, 4, 1, 3, "none", "optimizer,params", 1, 1},
      {"llama3-8b", 8, 2, 8, 1, 1, "none", "none", 1, 2},
      {"mixtral-8x7b", 16, 1, 8, 1, 1, "full", "none", 4, 1},
      {"deepseek-v3", 64, 1, 16, 1, 1, "full", "none", 8, 1},
  };
  for (const Case& k : cases) {
    Setup x{load_model(k.model), load_cluster("dgx-a100-80g"), {}};
    x.cluster.nodes = k.nodes;
    PlanShorthand s;
    s.tp = k.tp, s.pp = k.pp, s.vpp = k.vpp, s.zero = k.zero, s.recompute = k.recompute;
    s.offload = k.offload, s.sequence_parallel = k.tp > 1, s.micro_batch = 1;
    s.global_batch = 8 * x.cluster.world_size();
    if (k.ep > 1) s.ep = k.ep;
    if (k.cp > 1) s.cp = k.cp, s.flash_attention = true;
    x.plan = expand_shorthand(s, x.model, x.cluster);
    validate(x.plan, x.model, x.cluster, "test");
    // The same plan with one middle stage's layers held differently: the stages around it
    // must not take its figures, nor it theirs.
    Plan mixed = x.plan;
    for (int l = mixed.chunks[3].begin; l < mixed.chunks[3].end; ++l)
      mixed.layers[l].recompute = Recompute::full, mixed.layers[l].zero = 0;
    for (const Plan* p : {&x.plan, &mixed}) {
      const CostModel cm(x.model, x.cluster, p->dtype);
      for (bool with_time : {true, false}) {
        BOOST_TEST_CONTEXT(k.model << " " << p->describe() << " with time " << with_time) {
          std::vector<cost_detail::StageCost> reused, walked;
          cost_detail::analyze(cm, *p, with_time, reused);
          cost_detail::analyze(cm, *p, with_time, walked, /*reuse_stages=*/false);
          BOOST_REQUIRE(reused.size() == walked.size());
          for (size_t st = 0; st < walked.size(); ++st) {
            BOOST_TEST_INFO("stage " << st);
            BOOST_TEST((reused[st] == walked[st]));
          }
        }
      }
    }
  }
}
