// Simulator benchmark (`make bench`): one iteration of GPT-3 175B (tp 8, pp 16, 1F1B) on 1,024
// GPUs (dp 8), 16,384 GPUs (dp 128) and 100,096 GPUs (dp 782), each simulated with rank symmetry
// (one representative per class of identical ranks) and, for the first two, every rank (--full)
// in the same run: wall and CPU time as ratios to the full simulation (goals: 1,024 GPUs <= 0.3 s,
// 16,384 GPUs <= 1 s), the full event loop's events per second, and the speedup of the full
// simulation at mpirun -np 2.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "stratagem/cost.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/simulate.hpp"

using namespace stratagem;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Timed {
  double wall_s = -1, cpu_s = -1, build_s = 0;
  SimResult r;
};

// Program generation, cost model and simulation, end to end; the fastest of `reps` runs (the
// machine may be shared).
Timed run(const ModelSpec& m, const ClusterSpec& c, const Plan& p, bool full, int reps) {
  Timed best;
  for (int k = 0; k < reps; ++k) {
    const auto t0 = clk::now();
    const double c0 = cpu_now();
    const Layout L(p, c);
    const Program prog = build_program(m, p);
    const CostModel cost(m, c, p.dtype);
    const CostModelCosts costs(cost, p);
    const double b = seconds_since(t0);
    SimOptions o;
    o.full = full;
    SimResult r = simulate(prog, L, c, costs, o);
    const double w = seconds_since(t0), cpu = cpu_now() - c0;
    if (best.wall_s < 0 || w < best.wall_s) {
      best.wall_s = w, best.cpu_s = cpu, best.build_s = b;
      best.r = std::move(r);
    }
  }
  return best;
}

Plan gpt3_plan(const ModelSpec& m, ClusterSpec& c, int dp) {
  c.nodes = 16 * dp;  // tp 8 x pp 16 x dp on 8-GPU nodes
  PlanShorthand sh;
  sh.tp = 8, sh.pp = 16, sh.dp = dp, sh.micro_batch = 1;
  sh.global_batch = 192 * dp;  // 192 micro-batches per replica
  sh.schedule = std::string("1f1b");
  const Plan p = expand_shorthand(sh, m, c);
  validate(p, m, c, "bench");
  return p;
}

bool same_result(const SimResult& a, const SimResult& b) {
  if (a.makespan_ns != b.makespan_ns || a.ranks.size() != b.ranks.size()) return false;
  for (size_t i = 0; i < a.ranks.size(); ++i)
    if (a.ranks[i].peak_memory_bytes != b.ranks[i].peak_memory_bytes ||
        a.ranks[i].end_ns != b.ranks[i].end_ns)
      return false;
  return true;
}

}  // namespace

int main() {
  const ModelSpec m = load_model("gpt3-175b");
  const ClusterSpec base = load_cluster("dgx-a100-80g");
  int status = 0;
  std::printf("GPT-3 175B, tp8 pp16 1F1B, one iteration, one process (best of the runs shown):\n");
  std::printf("  %-8s %-10s %-10s %-12s %-14s %-22s %-s\n", "GPUs", "mode", "sim ranks",
              "iteration s", "op events", "wall s (cpu s)", "ratio to full (wall, cpu)");
  Timed full1024;
  for (int dp : {8, 128, 782}) {
    ClusterSpec c = base;
    const Plan p = gpt3_plan(m, c, dp);
    const int gpus = p.world_size();
    const bool with_full = dp <= 128;
    const Timed sym = run(m, c, p, false, 3);
    Timed full;
    if (with_full) full = run(m, c, p, true, dp == 8 ? 3 : 1);
    if (dp == 8) full1024 = full;
    auto row = [&](const char* mode, const Timed& t, bool ratio) {
      std::printf("  %-8d %-10s %-10d %-12.4f %-14llu %7.3f (%6.3f)       ", gpus, mode,
                  t.r.stats.simulated_ranks, double(t.r.makespan_ns) * 1e-9,
                  (unsigned long long)t.r.stats.ops_simulated, t.wall_s, t.cpu_s);
      if (ratio) std::printf("%.4f, %.4f", t.wall_s / full.wall_s, t.cpu_s / full.cpu_s);
      std::printf("\n");
    };
    if (with_full) row("full", full, false);
    row(sym.r.stats.symmetric ? "symmetric" : "full", sym, with_full);
    const double goal = dp == 8 ? 0.3 : dp == 128 ? 1.0 : -1;
    if (with_full && !same_result(sym.r, full.r)) {
      std::printf("  MISMATCH: the symmetric and the full simulation differ\n");
      status = 1;
    }
    if (goal > 0)
      std::printf("  %d GPUs symmetric: %.3f s wall (goal <= %.1f s) %s\n", gpus, sym.wall_s, goal,
                  sym.wall_s <= goal ? "OK" : "SLOWER THAN GOAL");
    else
      std::printf(
          "  %d GPUs symmetric: simulates in %.3f s wall (%.3f s setup, %.3f s event loop)\n", gpus,
          sym.wall_s, sym.r.stats.setup_s, sym.r.stats.run_s);
  }
  const SimResult& r = full1024.r;
  const double best_run = r.stats.run_s;
  std::printf(
      "1,024 GPUs, full: program+cost model %.3f s, simulator setup %.3f s, event loop %.3f s\n",
      full1024.build_s, r.stats.setup_s, best_run);
  std::printf("  op events per second           %.3g (event loop), %.3g (end to end)\n",
              double(r.stats.ops_executed) / best_run,
              double(r.stats.ops_executed) / full1024.wall_s);
  std::printf("  queue events per second        %.3g\n", double(r.stats.heap_events) / best_run);

  // The CLI at -np 1 and -np 2 (the same JSON). "simulator" is what the simulator reports for
  // itself (setup + event loop on process 0), "CLI" includes process and MPI start-up.
  const char* env = std::getenv("STRATAGEM_BIN");
  const std::string bin = env ? env : STRATAGEM_BIN;
  const std::string args =
      " simulate --model gpt3-175b --cluster dgx-a100-80g --nodes 128 --tp 8 --pp 16 --dp 8 "
      "--micro-batch 1 --global-batch 1536 --full";
  double sim[2] = {-1, -1}, cli[2] = {-1, -1};
  for (int k = 0; k < 2; ++k) {
    const std::string cmd =
        (k ? std::string(STRATAGEM_MPIEXEC_CMD) + " -np 2 " : std::string()) + bin + args;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t = clk::now();
      std::FILE* f = popen((cmd + " 2>/dev/null </dev/null").c_str(), "r");
      if (!f) break;
      char line[512];
      double s = -1;
      while (std::fgets(line, sizeof line, f)) {
        unsigned long long n;
        double x;
        if (std::sscanf(line, "simulated %llu op events in %lf s", &n, &x) == 2) s = x;
      }
      const int rc = pclose(f);
      const double w = seconds_since(t);
      if (rc != 0 || s < 0) break;
      if (sim[k] < 0 || s < sim[k]) sim[k] = s;
      if (cli[k] < 0 || w < cli[k]) cli[k] = w;
    }
  }
  if (sim[0] < 0 || sim[1] < 0) {
    std::printf("  mpirun -np 2: could not run %s\n", bin.c_str());
    return 1;
  }
  std::printf(
      "  full, mpirun -np 2 speedup     %.2fx simulator (%.3f s -> %.3f s), %.2fx CLI (%.3f s -> "
      "%.3f s)\n",
      sim[0] / sim[1], sim[0], sim[1], cli[0] / cli[1], cli[0], cli[1]);
  return status;
}
