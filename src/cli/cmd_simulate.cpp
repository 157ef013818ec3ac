#include <cstdio>
#include <string>

#include "src/cli/command.hpp"
#include "src/cli/launch.hpp"
#include "src/cli/memory_check.hpp"
#include "src/cli/model_support.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/program.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::cli {
namespace {

double gib(int64_t b) {
  return double(b) / double(1LL << 30);
}

std::string gib_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1LL << 30));
  return buf;
}

// The figures, their breakdowns and the run's statistics (rank 0, without --json).
void print_result(const nlohmann::json& j, const SimResult& r, const ModelSpec& m,
                  const ClusterSpec& c, const Plan& p, const FrameworkSpec& fw, int iterations) {
  std::printf("simulate: %s on %s x %d nodes (%d GPUs), framework %s, %d iteration%s\n  %s\n",
              m.name.c_str(), c.name.c_str(), c.nodes, c.world_size(), fw.name.c_str(), iterations,
              iterations > 1 ? "s" : "", p.describe().c_str());
  std::printf(
      "iteration %.4f s | %.0f tokens/s | %.1f TFLOP/s per GPU | MFU %.1f%% | bubble %.1f%%\n",
      j["iteration_time_s"].get<double>(), j["tokens_per_s"].get<double>(),
      j["tflops_per_gpu"].get<double>(), 100 * j["mfu"].get<double>(),
      100 * j["bubble_fraction"].get<double>());
  std::printf("time per iteration (s, mean over ranks):\n");
  const double it = j["iteration_time_s"].get<double>();
  for (const char* k : {"compute", "recompute", "tp_comm", "ep_comm", "cp_comm", "dp_comm",
                        "pp_comm", "bubble", "offload", "optimizer", "host"}) {
    // ep_comm: only for MoE models; cp_comm: only under cp; host: only for a framework that
    // states its host time.
    if (!j["time_breakdown_s"].contains(k)) continue;
    const double s = j["time_breakdown_s"][k].get<double>();
    std::printf("  %-12s %10.4f  %5.1f%%\n", k, s, it > 0 ? 100 * s / it : 0.0);
  }
  std::printf("peak memory per GPU: %.2f GiB of %.2f GiB (rank %d, stage %d)%s\n",
              gib(j["peak_memory_bytes"].get<int64_t>()), gib(c.gpu.hbm_bytes),
              j["peak_rank"].get<int>(), j["peak_stage"].get<int>(),
              r.oom.oom ? "  OUT OF MEMORY" : "");
  std::printf("  caching allocator: %.2f GiB reserved, %.2f GiB allocated (max over ranks)\n",
              gib(j["peak_reserved_bytes"].get<int64_t>()),
              gib(j["peak_allocated_bytes"].get<int64_t>()));
  for (const char* k : {"weights", "grads", "optimizer", "activations", "buffers",
                        "cublas_workspace", "fragmentation", "cuda_context", "nccl_buffers"})
    if (j["memory_breakdown_bytes"].contains(k))
      std::printf("  %-14s %10.2f GiB\n", k, gib(j["memory_breakdown_bytes"][k].get<int64_t>()));
  std::printf("simulated %llu op events in %.3f s (%d process%s, %llu windows)\n",
              (unsigned long long)r.stats.ops_executed, r.stats.setup_s + r.stats.run_s,
              r.stats.processes, r.stats.processes > 1 ? "es" : "",
              (unsigned long long)r.stats.windows);
  if (r.stats.symmetric)
    std::printf("mode: symmetric (%d of %d ranks simulated, %llu op events; --full runs all)\n",
                r.stats.simulated_ranks, p.world_size(), (unsigned long long)r.stats.ops_simulated);
  else
    std::printf("mode: full (every rank simulated)\n");
}

int run_simulate(Args& a) {
  const bool json = a.flag("--json");
  const bool mirror = a.flag("--mirror");
  const bool full = a.flag("--full");
  const auto trace = a.output("--trace");
  const int iterations = a.int_value("--iterations").value_or(1);
  const auto interference = a.double_value("--interference");
  ModelSpec m = model_from_args(a);
  require_supported_model(m, a.command(), ModelUse::forecast);
  ClusterSpec c = cluster_from_args(a);
  Plan p = plan_from_args(a, m, c);
  const FrameworkSpec fw = framework_from_args(a);
  a.finish();
  if (iterations < 1 || iterations > 1000)
    throw InputError(a.command() + ": --iterations: expected 1..1000, got " +
                     std::to_string(iterations));
  if (interference && (*interference < 1.0 || *interference > 10.0))
    throw InputError(a.command() + ": --interference: expected a slowdown factor in [1, 10], got " +
                     std::to_string(*interference));
  check_launch(a.command());
  // Before the Program exists: it alone grows with the micro-batch count.
  check_program_memory(m, p, local_size(), a.command());
  Program prog = build_program(m, p, fw);
  {
    SimOptions o;
    o.iterations = iterations;
    o.record_trace = bool(trace);
    // Every process on a node holds the whole simulation.
    const double need = double(simulation_footprint_bytes(prog, p.world_size(), o)) * local_size();
    std::string by;
    const double have = double(memory_limit_bytes(&by));
    if (need > have)
      throw InputError(a.command() + ": --nodes " + std::to_string(c.nodes) + " (" +
                       std::to_string(p.world_size()) + " simulated ranks" +
                       (trace ? ", with --trace" : "") + ") needs about " + gib_text(need) +
                       " of memory, more than the " + gib_text(have) + " this process may use (" +
                       by + "); simulate fewer nodes" + (trace ? " or drop --trace" : ""));
  }
  Layout layout(p, c);
  CostModel cost(m, c, p.dtype, fw);
  CostModelCosts costs(cost, p);
  SimOptions opt;
  opt.iterations = iterations;
  opt.record_trace = bool(trace);
  opt.mirror = mirror;
  opt.full = full;
  if (interference) opt.interference = *interference;
  opt.comm = world_size() > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL;
  if (mirror && world_size() != p.world_size())
    throw InputError(
        a.command() + ": --mirror needs one MPI process per simulated rank: the plan has " +
        std::to_string(p.world_size()) + " ranks but MPI started " + std::to_string(world_size()) +
        "; use mpirun/srun -n " + std::to_string(p.world_size()));
  SimResult r = simulate(prog, layout, c, costs, opt);
  if (r.deadlock.deadlocked) {
    if (world_rank() == 0)
      std::fprintf(stderr, "%s: error: %s", a.command().c_str(), r.deadlock.message.c_str());
    return kExitFailure;
  }
  if (trace) write_trace(*trace, r, m, c, p, prog, opt.comm, fw);
  if (world_rank() == 0 && r.oom.oom)
    std::fprintf(stderr,
                 "%s: warning: out of memory: rank %d (stage %d) needs %.2f GiB of %.2f GiB after "
                 "op %d '%s' (iteration %d) at t=%.6f s\n",
                 a.command().c_str(), r.oom.rank, layout.coords(r.oom.rank).stage, gib(r.oom.bytes),
                 gib(r.oom.hbm_bytes), r.oom.op, r.oom.op_name.c_str(), r.oom.iteration,
                 double(r.oom.time_ns) * 1e-9);
  nlohmann::json j = to_json(r, m, c, p, prog);
  if (!r.oom.oom)
    warn_near_memory_limit(a.command(), j["peak_memory_bytes"].get<int64_t>(), c,
                           "rank " + std::to_string(j["peak_rank"].get<int>()) + ", stage " +
                               std::to_string(j["peak_stage"].get<int>()));
  if (json) {
    j["model"] = m.name;
    j["cluster"] = c.name;
    j["framework"] = fw.name;
    j["nodes"] = c.nodes;
    j["plan"] = p.describe();
    j["source"] = "simulated";
    print_json(j);
    return 0;
  }
  if (world_rank() != 0) return 0;
  print_result(j, r, m, c, p, fw, iterations);
  return 0;
}

Register reg{
    {"simulate", "discrete-event simulation of a plan's iteration (time, memory, trace)",
     std::string("usage: stratagem simulate --model M --cluster C --nodes N "
                 "(--plan FILE | shorthand flags) [--json] [--trace FILE.h5] [--iterations K]\n"
                 "       [--mirror] [--interference F] [--full]\n"
                 "  under mpirun -np P the simulated ranks are spread over the P processes; the\n"
                 "  result is bit-identical for any P\n") +
         kModelHelp + kClusterHelp + kFrameworkHelp + kPlanHelp +
         "  --json                   machine-readable output (keys as estimate --json)\n"
         "  --trace FILE.h5          write an HDF5 trace (see `stratagem trace export`)\n"
         "  --iterations K           simulate K iterations back to back [1]\n"
         "  --mirror                 one MPI process per simulated rank (the job's layout)\n"
         "  --interference F         compute slowdown while comm overlaps it [the cluster's]\n"
         "  --full                   simulate every rank even where ranks are symmetric (by\n"
         "                           default one per class of identical ranks; \"mode\" says "
         "which)\n"
         "exit codes: 0 ok (also when out of memory: see \"oom\"), 1 the program deadlocks,\n"
         "2 bad input\n",
     run_simulate}};

}  // namespace
}  // namespace stratagem::cli
