// Compute costs: GEMM efficiency (size, tile and wave quantization), attention, elementwise,
// launches, host work, and that every compute op of a Program is costed from its block's shapes.
#define BOOST_TEST_MODULE cost_compute
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"
#include "stratagem/spec_json.hpp"

using namespace stratagem;
namespace tt = boost::test_tools;

namespace {
struct Fixture {
  ModelSpec model = load_model("gpt3-175b");
  ClusterSpec cluster = load_cluster("dgx-a100-80g");
  Plan plan;
  Fixture() {
    cluster.nodes = 2;
    PlanShorthand s;
    s.tp = 8, s.pp = 2, s.micro_batch = 1, s.global_batch = 4;
    plan = expand_shorthand(s, model, cluster);
  }
};
}  // namespace

BOOST_FIXTURE_TEST_CASE(gemm_efficiency_by_hand, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  // 4096^3: 2*4096^3 = 1.374e11 FLOP; size factor f/(f + 2e9); 32 x 32 = 1024 tiles of 128x128
  // run in ceil(1024/108) = 10 waves of 108 SMs: 1024/1080 of the slots do work.
  {
    const Gemm g{4096, 4096, 4096};
    const double f = 2.0 * 4096 * 4096 * 4096;
    const double eff = 0.76 * f / (f + 2e9) * (1024.0 / 1080.0);
    BOOST_TEST(cm.gemm_efficiency(g) == eff, tt::tolerance(1e-12));
    BOOST_TEST(cm.gemm_time_s(g) == f / (312e12 * eff), tt::tolerance(1e-12));
  }
  // 1024^3 is latency bound: 2.1e9 FLOP ~ half_efficiency_flops, and 64 tiles fill 64 of 108 SMs.
  {
    const Gemm g{1024, 1024, 1024};
    const double f = 2.0 * 1024 * 1024 * 1024;
    BOOST_TEST(cm.gemm_efficiency(g) == 0.76 * f / (f + 2e9) * (64.0 / 108.0),
               tt::tolerance(1e-12));
    BOOST_TEST(cm.gemm_efficiency(g) < 0.26);
  }
  // Tile quantization: m = 130 needs two row tiles, the second holds 2 useful rows of 128.
  {
    const Gemm g{130, 128 * 108, 8192};
    const double f = g.flops();
    BOOST_TEST(cm.gemm_efficiency(g) == 0.76 * f / (f + 2e9) * (130.0 / 256.0),
               tt::tolerance(1e-12));
  }
  // Batched GEMMs count their tiles together.
  {
    const Gemm g{128, 128, 4096, 108};
    BOOST_TEST(cm.gemm_efficiency(g) == 0.76 * g.flops() / (g.flops() + 2e9), tt::tolerance(1e-12));
  }
  // A GEMM with k = 1 moves more bytes than it computes: it runs at achieved HBM bandwidth.
  {
    const Gemm g{8192, 8192, 1};
    const double bytes = 2.0 * (8192.0 * 1 + 1.0 * 8192 + 8192.0 * 8192);
    BOOST_TEST(cm.gemm_time_s(g) == bytes / (2039e9 * 0.85), tt::tolerance(1e-12));
  }
  // Efficiency never exceeds max_efficiency and grows with size for well-tiled shapes.
  double prev = 0;
  for (int64_t n = 256; n <= 16384; n *= 2) {
    const double e = cm.gemm_efficiency({n * 108 / 4, n, n});
    BOOST_TEST(e <= 0.76);
    BOOST_TEST(e > prev);
    prev = e;
  }
}

BOOST_FIXTURE_TEST_CASE(attention_elementwise_launch_host, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  // The kernel is the work's (an op's attention kernel), not the cost model's.
  BOOST_TEST(cm.attention_time_s(1e12, false) == 1e12 / (312e12 * 0.30), tt::tolerance(1e-12));
  BOOST_TEST(cm.attention_time_s(1e12, true) == 1e12 / (312e12 * 0.55), tt::tolerance(1e-12));
  BOOST_TEST(cm.elementwise_time_s(1e9) == 1e9 / (2039e9 * 0.85), tt::tolerance(1e-12));
  // A block: its GEMMs + attention core + elementwise traffic + a launch per kernel.
  BlockWork w;
  w.add({4096, 4096, 4096});
  w.attention_flops = 1e12;
  w.elementwise_bytes = 1e9;
  w.kernels += 3;
  BOOST_TEST(cm.block_time_s(w) == cm.gemm_time_s({4096, 4096, 4096}) + 1e12 / (312e12 * 0.30) +
                                       1e9 / (2039e9 * 0.85) + 4 * 4e-6,
             tt::tolerance(1e-12));
  // The node's 4.6e12 FLOP/s and 300 GB/s are shared by its 8 GPUs.
  BOOST_TEST(cm.host_compute_time_s(1.2e10, 1e8) == 1.2e10 / (4.6e12 / 8), tt::tolerance(1e-12));
  BOOST_TEST(cm.host_compute_time_s(1e9, 1.6e10) == 1.6e10 / (300e9 / 8), tt::tolerance(1e-12));
  // fp16 and bf16 share A100's peak; fp32 uses the CUDA-core rate.
  plan.dtype = Dtype::fp32;
  CostModel fp32(model, cluster, plan.dtype);
  BOOST_TEST(fp32.peak_flops() == 19.5e12);
}

BOOST_FIXTURE_TEST_CASE(head_gemm_shape, Fixture) {
  CostModel cm(model, cluster, plan.dtype);
  // Logits of 2 samples on tp 8: (b*s, V/tp, h) = (4096, ceil(50257/8), 12288).
  const int tp = plan.embedding.tp, cp = plan.embedding.cp;
  BlockWork f = cm.head_work(Phase::forward, 2, 0, tp, cp);
  BOOST_REQUIRE(f.num_gemms == 1);
  BOOST_TEST(f.gemms[0].m == 4096);
  BOOST_TEST(f.gemms[0].n == 6283);
  BOOST_TEST(f.gemms[0].k == 12288);
  BlockWork b = cm.head_work(Phase::backward, 2, 0, tp, cp);
  BOOST_TEST(b.num_gemms == 2);
  BOOST_TEST(b.gemm_flops() == 2 * f.gemm_flops());
}

BOOST_FIXTURE_TEST_CASE(program_compute_ops_use_their_block_shapes, Fixture) {
  // Every compute op of a Program is costed from the BlockWork of its layer's strategy; check
  // each kind against the workload functions, for full and selective recompute.
  for (const char* rc : {"full", "selective"}) {
    PlanShorthand s;
    s.tp = 8, s.pp = 2, s.micro_batch = 1, s.global_batch = 4, s.recompute = rc, s.zero = 1;
    s.offload = "optimizer";
    Plan p = expand_shorthand(s, model, cluster);
    CostModel cm(model, cluster, p.dtype);
    Program prog = build_program(model, p);
    int seen[8] = {};
    for (const auto& st : prog.stages)
      for (const Op& op : st.ops) {
        if (op.kind != OpKind::compute && op.kind != OpKind::host_compute) continue;
        const double t = cm.compute_time_s(op);
        BOOST_TEST(t > 0);
        if (op.kind == OpKind::host_compute) {
          BOOST_TEST(t == cm.host_compute_time_s(op.flops, double(op.bytes)), tt::tolerance(1e-12));
          ++seen[0];
          continue;
        }
        const LayerStrategy& ls = op.layer >= 0 ? p.layers[op.layer] : p.embedding;
        switch (op.block) {
          case Block::attention:
          case Block::mlp: {
            BlockWork w = op.phase == Phase::backward
                              ? backward_work(model, ls, op.block, op.samples, false)
                              : forward_work(model, ls, op.block, op.samples, false);
            if (op.phase == Phase::recompute && ls.recompute == Recompute::selective) {
              w = attention_core_work(model, ls, op.samples, false);
              w.attention_flops /= 2;
            }
            // The op's FLOPs are the BlockWork's: the same description of the work.
            BOOST_TEST(op.flops == w.flops(), tt::tolerance(1e-9));
            BOOST_TEST(t == cm.block_time_s(w), tt::tolerance(1e-12));
            ++seen[op.phase == Phase::recompute ? 1 : 2];
            break;
          }
          case Block::head:
            BOOST_TEST(t == cm.block_time_s(cm.head_work(op.phase, op.samples, double(op.bytes),
                                                         op.strategy.tp, op.strategy.cp)),
                       tt::tolerance(1e-12));
            BOOST_TEST(cm.head_work(op.phase, op.samples, 0, op.strategy.tp, op.strategy.cp)
                               .gemm_flops() == op.flops,
                       tt::tolerance(2e-4));  // V/tp rounded up to whole rows
            ++seen[3];
            break;
          case Block::embedding:
            BOOST_TEST(t == cm.elementwise_time_s(double(op.bytes)) +
                                (op.phase == Phase::backward ? 2 : 1) * 4e-6,
                       tt::tolerance(1e-12));
            ++seen[4];
            break;
          case Block::optimizer:
            // AdamW is memory bound: its bytes at achieved HBM bandwidth.
            BOOST_TEST(t == std::max(op.flops / 19.5e12, op.bytes / (2039e9 * 0.85)) + 4e-6,
                       tt::tolerance(1e-12));
            ++seen[5];
            break;
          default:
            BOOST_FAIL("unexpected compute block " << to_string(op.block));
        }
      }
    for (int k = 0; k < 6; ++k) BOOST_TEST(seen[k] > 0, "kind " << k << " with recompute " << rc);
  }
}

BOOST_AUTO_TEST_CASE(built_in_frameworks_load) {
  for (const char* name : {"stratagem", "megatron-lm-2021", "megatron-core", "fsdp-eager", "llm.c"})
    BOOST_TEST(load_framework(name).name == name);
  BOOST_TEST(load_framework("stratagem").wgrad_accumulation_fused);
  BOOST_CHECK_THROW(load_framework("no-such-framework"), InputError);
  BOOST_CHECK_THROW(framework_from_json(nlohmann::json::parse(R"({"name": "x", "gradients":
      {"wgrad_accumulation_fused": true, "accumulation_bytes": 2, "speedup": 1.1}})"),
                                        "x.json"),
                    InputError);
}

BOOST_FIXTURE_TEST_CASE(unfused_gradient_accumulation_is_one_pass_over_the_grads, Fixture) {
  // Megatron-LM 2021 adds each micro-batch's fresh fp16 weight gradient into main_grad: read
  // both, write main_grad (6 bytes per parameter), one kernel per parameter tensor (weight and
  // bias of the block's two GEMMs and of its norm).
  const FrameworkSpec fw = load_framework("megatron-lm-2021");
  CostModel fused(model, cluster, plan.dtype), unfused(model, cluster, plan.dtype, fw);
  const LayerStrategy& s = plan.layers[0];
  const double hbm = cluster.gpu.hbm_bandwidth_gbps * 1e9 * cluster.gpu.memory_efficiency;
  for (Block b : {Block::attention, Block::mlp}) {
    const int64_t params = block_parameters_per_rank(model, s.tp, b);
    const double extra = double(params) * 6 / hbm + 6 * cluster.gpu.kernel_launch_s;
    BOOST_TEST(unfused.backward_block_time_s(s, b, 1, false) -
                       fused.backward_block_time_s(s, b, 1, false) ==
                   extra,
               tt::tolerance(1e-9));
    Op op;
    op.kind = OpKind::compute, op.block = b, op.phase = Phase::backward, op.layer = 0;
    op.samples = 1;
    op.strategy = OpStrategy::of(s);
    op.dtype = plan.dtype;
    BOOST_TEST(unfused.compute_time_s(op) == unfused.backward_block_time_s(s, b, 1, false));
  }
  // Under ZeRO-2 only the reduce-scattered shard is accumulated.
  Plan z = plan;
  for (auto& l : z.layers) l.zero = 2, l.dp = 4;
  CostModel zf(model, cluster, z.dtype), zu(model, cluster, z.dtype, fw);
  const int64_t shard = (block_parameters_per_rank(model, 8, Block::mlp) + 3) / 4;
  BOOST_TEST(zu.backward_block_time_s(z.layers[0], Block::mlp, 1, false) -
                     zf.backward_block_time_s(z.layers[0], Block::mlp, 1, false) ==
                 double(shard) * 6 / hbm + 6 * cluster.gpu.kernel_launch_s,
             tt::tolerance(1e-9));
}

BOOST_FIXTURE_TEST_CASE(framework_gradient_reduce_dtype_and_pre_reduce_passes, Fixture) {
  // A framework that reduces fp32 gradients under bf16 training moves twice the plan's bytes in
  // every data-parallel gradient reduction (the Program counts them in the plan's dtype), and
  // under ZeRO-2/3 its passes over the whole gradients before each micro-batch's reduce-scatter
  // add their bytes to the block's backward.
  PlanShorthand sh;
  sh.dp = 16, sh.micro_batch = 1, sh.global_batch = 32, sh.zero = 3;
  const Plan p = expand_shorthand(sh, model, cluster);
  FrameworkSpec fw;
  fw.grad_reduce_bytes = 4;
  fw.pre_reduce_bytes_per_param = 18;
  CostModel plain(model, cluster, p.dtype), framed(model, cluster, p.dtype, fw);
  BOOST_TEST(plain.grad_reduce_bytes() == 2);
  BOOST_TEST(framed.grad_reduce_bytes() == 4);
  const Layout layout(p, cluster);
  const Program prog = build_program(model, p);
  const double hbm = cluster.gpu.hbm_bandwidth_gbps * 1e9 * cluster.gpu.memory_efficiency;
  int reductions = 0, backwards = 0;
  for (const Op& op : prog.stages[0].ops) {
    if (op.kind == OpKind::collective && op.group == GroupKind::dp &&
        op.collective == Collective::reduce_scatter && op.phase == Phase::backward) {
      const double doubled = plain.fabric()
                                 .collective_cost(Collective::reduce_scatter, 2 * op.bytes,
                                                  layout.group(resolve_group(layout, 0, op)).ranks)
                                 .time_s();
      BOOST_TEST(framed.op_time_s(op, layout, 0) == doubled, tt::tolerance(1e-12));
      ++reductions;
    }
    // Gathers are parameters, in the plan's dtype either way.
    if (op.kind == OpKind::collective && op.collective == Collective::all_gather)
      BOOST_TEST(framed.op_time_s(op, layout, 0) == plain.op_time_s(op, layout, 0));
    if (op.kind == OpKind::compute && op.phase == Phase::backward &&
        (op.block == Block::attention || op.block == Block::mlp)) {
      const double extra = 18.0 * double(block_parameters_per_rank(model, 1, op.block)) / hbm;
      BOOST_TEST(framed.op_time_s(op, layout, 0) - plain.op_time_s(op, layout, 0) == extra,
                 tt::tolerance(1e-9));
      ++backwards;
    }
  }
  BOOST_TEST(reductions > 0);
  BOOST_TEST(backwards > 0);
}

BOOST_FIXTURE_TEST_CASE(framework_optimizer_bytes_per_param, Fixture) {
  // A framework's stated optimizer traffic replaces the Program's count: 12 FLOPs and
  // bytes_per_param bytes per parameter.
  FrameworkSpec fw;
  fw.optimizer_bytes_per_param = 80;
  CostModel cm(model, cluster, plan.dtype, fw);
  Op op;
  op.kind = OpKind::compute;
  op.block = Block::optimizer;
  op.phase = Phase::optimizer;
  op.flops = 12.0 * 1e9;
  op.bytes = 28 * int64_t(1e9);
  const double hbm = cluster.gpu.hbm_bandwidth_gbps * 1e9 * cluster.gpu.memory_efficiency;
  BOOST_TEST(cm.compute_time_s(op) == 80e9 / hbm + cluster.gpu.kernel_launch_s,
             tt::tolerance(1e-12));
  BOOST_CHECK_THROW(framework_from_json(nlohmann::json::parse(R"({"name": "x", "gradients":
      {"wgrad_accumulation_fused": true, "accumulation_bytes": 2, "reduce_bytes": 3}})"),
                                        "x.json"),
                    InputError);
  const FrameworkSpec fsdp = load_framework("fsdp-eager");
  BOOST_TEST(fsdp.grad_reduce_bytes == 4);
  BOOST_TEST(fsdp.pre_reduce_bytes_per_param == 18);
  BOOST_TEST(fsdp.optimizer_bytes_per_param == 92);
  BOOST_TEST(load_framework("stratagem").grad_reduce_bytes == 0);
  // Round trip through to_json.
  const FrameworkSpec back = framework_from_json(to_json(fsdp), "back.json");
  BOOST_TEST(back.grad_reduce_bytes == 4);
  BOOST_TEST(back.optimizer_bytes_per_param == 92);
}

BOOST_FIXTURE_TEST_CASE(framework_attention_kernel_selects_the_clusters_figure, Fixture) {
  // A framework running a first-generation FlashAttention kernel prices the attention core at the
  // cluster's flash1_efficiency; others at flash_efficiency. Unfused attention is the plan's
  // choice and stays at standard_efficiency either way.
  Plan flash = plan;
  flash.flash_attention = true;
  FrameworkSpec fw;
  fw.attention_kernel = AttentionKernel::flash1;
  const double f = 1e12;
  CostModel best(model, cluster, flash.dtype), first(model, cluster, flash.dtype, fw);
  BOOST_TEST(best.attention_time_s(f, true) == f / (312e12 * 0.55), tt::tolerance(1e-12));
  BOOST_TEST(first.attention_time_s(f, true) == f / (312e12 * 0.28), tt::tolerance(1e-12));
  CostModel plain_best(model, cluster, plan.dtype), plain_first(model, cluster, plan.dtype, fw);
  BOOST_TEST(plain_first.attention_time_s(f, false) == plain_best.attention_time_s(f, false));
  // The llm-foundry rows' Triton port (data/frameworks/fsdp-eager.json); a cluster file that
  // states no flash1 figure takes its flash figure.
  BOOST_TEST((load_framework("fsdp-eager").attention_kernel == AttentionKernel::flash1));
  BOOST_TEST((load_framework("megatron-core").attention_kernel == AttentionKernel::flash));
  BOOST_TEST(load_cluster("dgx-h100").gpu.attention_flash1_efficiency == 0.17);
  BOOST_TEST(load_cluster("cpu-local").gpu.attention_flash1_efficiency ==
             load_cluster("cpu-local").gpu.attention_flash_efficiency);
  BOOST_TEST(
      (framework_from_json(to_json(fw), "back.json").attention_kernel == AttentionKernel::flash1));
  BOOST_CHECK_THROW(framework_from_json(nlohmann::json::parse(R"({"name": "x", "gradients":
      {"wgrad_accumulation_fused": true, "accumulation_bytes": 2}, "attention": {"kernel": "fa9"}})"),
                                        "x.json"),
                    InputError);
}

BOOST_FIXTURE_TEST_CASE(framework_host_issue_time_per_op_and_per_layer, Fixture) {
  // A framework's host time per layer lies half on the attention block's op and half on the
  // feed-forward's, in each phase; a fully recomputed forward is issued again. The Program's ops
  // of a stage sum to the per-layer figure the estimator uses, per micro-batch.
  FrameworkSpec fw;
  fw.host_ops_per_layer_forward = 100;
  fw.host_ops_per_layer_backward = 200;
  fw.host_seconds_per_op = 1e-5;
  for (const char* rc : {"none", "selective", "full"}) {
    Plan p = plan;
    for (LayerStrategy& s : p.layers) s.recompute = recompute_from(rc, "test");
    CostModel cm(model, cluster, p.dtype, fw), plain(model, cluster, p.dtype);
    const Program prog = build_program(model, p);
    const StageProgram& sp = prog.stages[0];
    double sum = 0;
    std::set<int> layers;
    for (const Op& op : sp.ops) {
      BOOST_TEST(plain.host_issue_time_s(op) == 0);
      const double h = cm.host_issue_time_s(op);
      if (h > 0) {
        BOOST_TEST((op.kind == OpKind::compute && op.layer >= 0));
        BOOST_TEST((op.block == Block::attention || op.block == Block::mlp));
        BOOST_TEST(h == (op.phase == Phase::backward ? 1e-3 : 0.5e-3), tt::tolerance(1e-12));
        layers.insert(op.layer);
      }
      sum += h;
    }
    double per_mb = 0;
    for (int l : layers) per_mb += cm.host_issue_layer_s(p.layers[l]);
    BOOST_TEST_INFO(rc);
    BOOST_TEST(layers.size() == size_t(model.layers / p.pp));
    BOOST_TEST(sum == prog.num_microbatches * per_mb, tt::tolerance(1e-9));
    BOOST_TEST(per_mb / layers.size() == (std::string(rc) == "full" ? 4e-3 : 3e-3),
               tt::tolerance(1e-12));
  }
  // The JSON form: counts and seconds per op in range, no other key; nanotron states them.
  const FrameworkSpec back = framework_from_json(to_json(fw), "back.json");
  BOOST_TEST(back.host_layer_forward_s() == 1e-3, tt::tolerance(1e-12));
  BOOST_TEST(back.host_layer_backward_s() == 2e-3, tt::tolerance(1e-12));
  for (const char* bad :
       {R"({"ops_per_layer_forward": -1})", R"({"seconds_per_op": 0.5})", R"({"layer_s": 0.001})"})
    BOOST_CHECK_THROW(
        framework_from_json(nlohmann::json::parse(std::string(R"({"name": "x", "gradients":
      {"wgrad_accumulation_fused": true, "accumulation_bytes": 2}, "host": )") +
                                                  bad + "}"),
                            "x.json"),
        InputError);
  BOOST_TEST(load_framework("nanotron").host_issue_modelled());
  for (const char* name : {"stratagem", "megatron-core", "fsdp-eager", "llm.c"})
    BOOST_TEST(!load_framework(name).host_issue_modelled());
}
