#include <cstdio>
#include <string>

#include "src/cli/command.hpp"
#include "src/cli/memory_check.hpp"
#include "src/cli/model_support.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"

namespace stratagem::cli {
namespace {

// The FLOP count behind tflops_per_gpu and mfu (workload.hpp's model_flops_per_iteration).
std::string flops_formula(const ModelSpec& m) {
  const bool gpt = m.arch == Arch::decoder && m.activation == Activation::gelu &&
                   m.kv_heads == m.heads && m.ffn_hidden == 4LL * m.hidden;
  if (gpt)
    return "72*B*s*l*h^2*(1 + s/(6h) + V/(12lh)) per iteration (Megatron model FLOPs; "
           "recompute not counted)";
  return "per token 6*(GEMM weights per layer)*l + 12*s*h*l + 6*V*h, times B*s per iteration "
         "(Megatron's count generalized to GQA/SwiGLU; recompute not counted)";
}

double gib(int64_t b) {
  return double(b) / double(1LL << 30);
}

int run_estimate(Args& a) {
  const bool json = a.flag("--json");
  ModelSpec m = model_from_args(a);
  require_supported_model(m, a.command(), ModelUse::forecast);
  ClusterSpec c = cluster_from_args(a);
  Plan p = plan_from_args(a, m, c);
  const FrameworkSpec fw = framework_from_args(a);
  a.finish();
  CostModel cost(m, c, p.dtype, fw);
  Estimate e = estimate(cost, p);
  warn_near_memory_limit(a.command(), e.peak_memory_bytes, c,
                         "stage " + std::to_string(e.peak_stage));
  if (json) {
    nlohmann::json j = to_json(e, p.embedding.cp > 1);
    j["model"] = m.name;
    j["cluster"] = c.name;
    j["framework"] = fw.name;
    j["nodes"] = c.nodes;
    j["plan"] = p.describe();
    j["flops_formula"] = flops_formula(m);
    j["hbm_bytes"] = c.gpu.hbm_bytes;
    j["fits"] = fits_gpu_memory(e, c);
    print_json(j);
    return 0;
  }
  if (world_rank() != 0) return 0;
  std::printf("estimate: %s on %s x %d nodes (%d GPUs), framework %s\n  %s\n", m.name.c_str(),
              c.name.c_str(), c.nodes, c.world_size(), fw.name.c_str(), p.describe().c_str());
  std::printf("iteration %.4g s | %.4g tokens/s | %.4g TFLOP/s per GPU | MFU %.1f%%\n",
              e.iteration_time_s, e.tokens_per_s, e.tflops_per_gpu, 100 * e.mfu);
  std::printf("  FLOPs: %s\n", flops_formula(m).c_str());
  const TimeBreakdown& t = e.time;
  std::printf("time per iteration (s, critical path):\n");
  const std::pair<const char*, double> rows[] = {
      {"compute (fwd+bwd)", t.compute_s},      {"recompute", t.recompute_s},
      {"tp comm (exposed)", t.tp_comm_s},      {"dp/ZeRO comm (exposed)", t.dp_comm_s},
      {"pp send/recv (exposed)", t.pp_comm_s}, {"pipeline bubble", t.bubble_s},
      {"offload (exposed)", t.offload_s},      {"optimizer step", t.optimizer_s}};
  for (const auto& [name, s] : rows)
    std::printf("  %-24s %10.4f  %5.1f%%\n", name, s, 100 * s / e.iteration_time_s);
  if (m.moe.enabled())
    std::printf("  %-24s %10.4f  %5.1f%%\n", "ep all-to-all (exposed)", t.ep_comm_s,
                100 * t.ep_comm_s / e.iteration_time_s);
  if (p.embedding.cp > 1)
    std::printf("  %-24s %10.4f  %5.1f%%\n", "cp comm (exposed)", t.cp_comm_s,
                100 * t.cp_comm_s / e.iteration_time_s);
  if (e.host_modelled)
    std::printf("  %-24s %10.4f  %5.1f%%\n", "waiting for the host", t.host_s,
                100 * t.host_s / e.iteration_time_s);
  const MemoryBreakdown& mb = e.memory;
  std::printf("peak memory per GPU: %.2f GiB of %.2f GiB (stage %d)%s\n", gib(e.peak_memory_bytes),
              gib(c.gpu.hbm_bytes), e.peak_stage,
              e.peak_memory_bytes > c.gpu.hbm_bytes ? "  DOES NOT FIT" : "");
  std::printf("  caching allocator: %.2f GiB reserved, %.2f GiB allocated (max over ranks)\n",
              gib(e.peak_reserved_bytes), gib(e.peak_allocated_bytes));
  const std::pair<const char*, int64_t> mem[] = {{"weights", mb.weights_bytes},
                                                 {"gradients", mb.grads_bytes},
                                                 {"optimizer states", mb.optimizer_bytes},
                                                 {"activations", mb.activations_bytes},
                                                 {"buffers", mb.buffers_bytes},
                                                 {"cuBLAS workspace", mb.cublas_workspace_bytes},
                                                 {"fragmentation", mb.fragmentation_bytes},
                                                 {"CUDA context", mb.cuda_context_bytes},
                                                 {"NCCL buffers", mb.nccl_buffers_bytes}};
  for (const auto& [name, b] : mem) std::printf("  %-24s %10.2f GiB\n", name, gib(b));
  return 0;
}

Register reg{{"estimate", "fast analytical estimate of iteration time, throughput and memory",
              std::string("usage: stratagem estimate --model M --cluster C --nodes N "
                          "(--plan FILE | shorthand flags) [--json]\n") +
                  kModelHelp + kClusterHelp + kFrameworkHelp + kPlanHelp +
                  "  --json                   machine-readable output\n",
              run_estimate}};

}  // namespace
}  // namespace stratagem::cli
